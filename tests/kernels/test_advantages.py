"""group_advantages against the fp64 loop reference (verl's loop versions), both backends."""

import math

import numpy as np
import pytest
import torch

from fastcrit_kernels import broadcast_to_tokens, group_advantages
from fastcrit_kernels._reference import ref_group_advantages

# dtype of the scores: (atol, rtol). Both paths compute in float32 on the same (rounded) scores;
# the GRPO division by a small std amplifies float32 rounding a little, hence 1e-5 not 1e-6.
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-5, 1e-5),
}
BACKENDS = ["torch", "triton"]
ESTIMATORS = ["grpo", "rloo", "naive"]


def _device(backend):
    """Triton runs compiled on CUDA tensors where a GPU exists, else under the interpreter on CPU."""
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def _batch(dtype, seed=0):
    """Mixed group sizes (1, 2, 3, 5, 8), ids not contiguous nor sorted, one constant-reward group."""
    g = torch.Generator().manual_seed(seed)
    sizes = {907: 1, 3: 2, 42: 3, -5: 5, 11: 8, 6: 1}
    ids = torch.tensor([k for k, n in sizes.items() for _ in range(n)])
    ids = ids[torch.randperm(ids.numel(), generator=g)]
    scores = torch.randn(ids.numel(), generator=g) * 2
    scores[ids == 42] = 0.75  # constant rewards: std 0
    return scores.to(dtype), ids


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(backend, estimator, norm_by_std, dtype):
    atol, rtol = TOL[dtype]
    scores, ids = _batch(dtype)
    dev = _device(backend)
    got = group_advantages(scores.to(dev), ids.to(dev), estimator, norm_by_std=norm_by_std, backend=backend).cpu()
    want = ref_group_advantages(scores, ids, estimator, norm_by_std=norm_by_std)
    assert got.shape == scores.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pinned_values(backend):
    # group 7: [1, 0] -> GRPO +-0.7071 / (0.7071 + 1e-6); group 2: [1, 0, 0]; group 9: a single sample
    dev = _device(backend)
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 4.0], device=dev)
    ids = torch.tensor([7, 2, 7, 2, 2, 9], device=dev)
    s = math.sqrt(0.5)
    grpo = group_advantages(scores, ids, "grpo", backend=backend).cpu()
    # group 2: mean 1/3, unbiased std sqrt(1/3)
    expect = [
        0.5 / (s + 1e-6),
        (2 / 3) / (math.sqrt(1 / 3) + 1e-6),
        -0.5 / (s + 1e-6),
        -(1 / 3) / (math.sqrt(1 / 3) + 1e-6),
        -(1 / 3) / (math.sqrt(1 / 3) + 1e-6),
        4.0 / (1 + 1e-6),
    ]
    torch.testing.assert_close(grpo, torch.tensor(expect), atol=1e-6, rtol=1e-6)
    rloo = group_advantages(scores, ids, "rloo", backend=backend).cpu()
    # RLOO = s - mean of the others; the single sample keeps its raw score
    torch.testing.assert_close(rloo, torch.tensor([1.0, 1.0, -1.0, -0.5, -0.5, 4.0]), atol=1e-6, rtol=1e-6)
    naive = group_advantages(scores, ids, "naive", backend=backend)
    torch.testing.assert_close(naive, scores)
    dr = group_advantages(scores, ids, "grpo", norm_by_std=False, backend=backend).cpu()
    torch.testing.assert_close(dr, torch.tensor([0.5, 2 / 3, -0.5, -1 / 3, -1 / 3, 4.0]), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_group_and_string_ids(backend):
    # one group larger than the kernel block (128), ids given as verl-style uid strings
    g = torch.Generator().manual_seed(4)
    scores = torch.rand(300, generator=g)
    uids = np.array(["a"] * 290 + ["b"] * 10)
    got = group_advantages(scores.to(_device(backend)), uids, "grpo", backend=backend).cpu()
    want = ref_group_advantages(scores, list(uids), "grpo")
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert abs(float(got[:290].mean())) < 1e-5


def test_float64_scores_stay_float64_and_no_graph():
    scores = torch.randn(6, dtype=torch.float64, requires_grad=True)
    out = group_advantages(scores, torch.tensor([0, 0, 1, 1, 1, 2]), "rloo", backend="torch")
    assert out.dtype == torch.float64 and not out.requires_grad


def test_broadcast_to_tokens():
    adv = torch.tensor([1.5, -2.0])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    torch.testing.assert_close(broadcast_to_tokens(adv, mask), torch.tensor([[1.5, 1.5, 0.0], [0.0, -2.0, -2.0]]))
    with pytest.raises(ValueError, match="mask"):
        broadcast_to_tokens(adv, torch.ones(3, 4))


def test_bad_inputs_name_the_argument():
    s = torch.zeros(4)
    with pytest.raises(ValueError, match="estimator"):
        group_advantages(s, torch.zeros(4, dtype=torch.long), "gae")
    with pytest.raises(ValueError, match="index"):
        group_advantages(s, torch.zeros(3, dtype=torch.long), "grpo")
    with pytest.raises(ValueError, match="index"):
        group_advantages(s, torch.zeros(4), "grpo")
    with pytest.raises(ValueError, match="scores"):
        group_advantages(torch.zeros(2, 2), torch.zeros(2, dtype=torch.long), "grpo")
