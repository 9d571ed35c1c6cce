"""fastcrit_kernels stands alone: importable and usable with only torch (no fastcrit, no numpy, no
triton), as `pip install ./kernels` promises; asking for the Triton backend without triton names the
install."""

import os
import subprocess
import sys

import fastcrit_kernels

# Where this fastcrit_kernels comes from (an install, or the source tree on PYTHONPATH): the children
# get only that folder, so they find the package but not fastcrit (which SCRIPT also blocks).
HOME = os.path.dirname(os.path.dirname(os.path.abspath(fastcrit_kernels.__file__)))

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
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "FASTCRIT_KERNELS_BACKEND": "torch", "PYTHONPATH": HOME},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


NO_TRITON = r"""
import importlib.abc, sys
class NoTriton(importlib.abc.MetaPathFinder):  # `import triton` (and triton.*) fails, as in an env without it
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTriton())
import warnings; warnings.simplefilter("ignore")
import torch
import fastcrit_kernels as fk
from fastcrit_kernels._dispatch import HAS_TRITON
assert not HAS_TRITON
g = torch.Generator().manual_seed(0)
B, T, H, V = 4, 5, 16, 50
h = torch.randn(B, T, H, generator=g, requires_grad=True)
w = torch.randn(V, H, generator=g, requires_grad=True)
labels = torch.randint(0, V, (B, T), generator=g)
mask = torch.ones(B, T)
old, ref = -torch.rand(B, T, generator=g), -torch.rand(B, T, generator=g)
scores, uid = torch.tensor([1., 0., 1., 0.]), torch.tensor([0, 0, 1, 1])
for backend in ("auto", "torch"):
    lp, ent = fk.fused_logprobs(h, w, labels, return_entropy=True, backend=backend)
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(h.grad).all() and (lp <= 0).all()
    lp = lp.detach().requires_grad_()
    kl = fk.kl_penalty(lp, ref, "low_var_kl", backend=backend)
    adv = fk.group_advantages(scores, uid, "grpo", backend=backend)
    loss, _ = fk.ppo_policy_loss(lp, old, fk.broadcast_to_tokens(adv, mask), mask, backend=backend)
    vloss, _ = fk.value_loss(torch.zeros(B, T, requires_grad=True), torch.zeros(B, T), old, mask,
                             backend=backend)
    ploss, _ = fk.pacs_loss(lp, old, scores, mask, uid, backend=backend)
    floss, _ = fk.fused_linear_ppo_loss(h, w, labels, old, adv, mask, ref_logp=ref, kl_coef=0.1,
                                        backend=backend)
    qloss, _ = fk.fused_linear_pacs_loss(h, w, labels, old, scores, mask, uid, backend=backend)
    for x in (kl.sum(), loss, vloss, ploss, floss, qloss):
        x.backward()
        assert torch.isfinite(x)
    print(backend, "ok")
try:
    fk.kl_penalty(lp, ref, backend="triton")
except RuntimeError as e:
    assert "needs triton, which is not installed: pip install 'fastcrit-kernels[triton]'" in str(e), e
else:
    raise AssertionError("backend='triton' without triton must raise")
assert "triton" not in sys.modules  # nothing imported it behind our back
print("ok")
"""


def test_torch_path_works_without_triton():
    """With triton unimportable, the package imports and every public function runs on CPU through
    the torch path (auto picks it); asking for triton says it is missing and how to install it."""
    out = subprocess.run(
        [sys.executable, "-c", NO_TRITON],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1", "PYTHONPATH": HOME},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["auto", "ok", "torch", "ok", "ok"]
