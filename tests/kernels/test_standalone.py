"""fastcrit_kernels stands alone: importable and usable with only torch and triton (no fastcrit,
no numpy), as `pip install ./kernels` promises."""
import subprocess
import sys

SCRIPT = r"""
import sys
sys.modules["numpy"] = None      # make `import numpy` fail, as in an env without it
sys.modules["fastcrit"] = None   # and the trainer package
import warnings; warnings.simplefilter("ignore")
import torch
import fastcrit_kernels as fk
h = torch.randn(6, 16, requires_grad=True); w = torch.randn(50, 16, requires_grad=True)
lp = fk.fused_logprobs(h, w, torch.randint(0, 50, (6,)))
lp.sum().backward()
assert h.grad is not None and (lp <= 0).all()
adv = fk.group_advantages(torch.tensor([1., 0., 1., 1.]), ["a", "a", "b", "b"], "grpo")
assert adv.shape == (4,)
loss, _ = fk.pacs_loss(torch.zeros(4, 3, requires_grad=True), torch.zeros(4, 3),
                       torch.tensor([1., 0., 1., 0.]), torch.ones(4, 3), torch.tensor([0, 0, 1, 1]))
loss.backward()
print("ok")
"""


def test_imports_and_runs_without_fastcrit_or_numpy():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "FASTCRIT_KERNELS_BACKEND": "torch"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
