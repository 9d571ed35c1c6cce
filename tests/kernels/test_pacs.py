"""pacs_loss against the fp64 loop reference, both backends, every reward method, estimator and
weight mode; plus parity with PACS's own fixed-group-size formulation."""

import numpy as np
import pytest
import torch

from fastcrit_kernels import pacs_loss
from fastcrit_kernels._reference import ref_pacs_loss

# dtype of logp: (atol, rtol) for loss, stats and gradients. The per-row sums are float32 over the
# same rounded inputs as the oracle; the GRPO std division amplifies float32 rounding slightly.
TOL = {
    torch.float32: (1e-5, 1e-4),
    torch.bfloat16: (1e-4, 1e-2),
}
BACKENDS = ["torch", "triton"]
ESTIMATORS = ["rloo", "grpo", "naive"]
WEIGHTS = [None, "question", "only_positive", "only_negative"]


def _device(backend):
    """Triton runs compiled on CUDA tensors where a GPU exists, else under the interpreter on CPU."""
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def _batch(dtype, seed=0):
    """Groups of size 1, 2, 3 and 4 with non-contiguous ids, one all-masked row, a one-token row,
    one group with a single label and one group whose rewards are all equal (logp == old_logp)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([50, 7, 50, 7, 7, 3, 3, 3, 3, 12, 8, 8])
    B, T = ids.numel(), 9
    old = -torch.rand(B, T, generator=g) * 2
    lp = old + torch.randn(B, T, generator=g) * 0.2
    lp[ids == 8] = old[ids == 8]  # group 8: every reward 0 under reward_method "1"
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:, 0] = True
    mask[4] = False  # all masked
    mask[5] = False
    mask[5, 3] = True  # one token
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    scores[ids == 50] = 1.0  # group 50: both samples correct (single label)
    return lp.to(dtype), old.to(dtype), scores, mask, ids


def _run(dtype, backend, kw, seed=0, upstream=1.9):
    lp, old, scores, mask, ids = _batch(dtype, seed)
    dev = _device(backend)
    x = lp.to(dev).requires_grad_(True)
    loss, stats = pacs_loss(x, old.to(dev), scores.to(dev), mask.to(dev), ids.to(dev), backend=backend, **kw)
    (loss * upstream).backward()
    lp64 = lp.detach().double().requires_grad_(True)
    rl, rs = ref_pacs_loss(lp64, old, scores, mask, ids, **kw)
    (rl * upstream).backward()
    return loss.detach().cpu(), {k: v.cpu() for k, v in stats.items()}, x.grad.cpu(), rl, rs, lp64.grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reward_method", ["1", "2"])
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("weight_mode", WEIGHTS)
def test_matches_reference_fp32(backend, reward_method, estimator, weight_mode):
    kw = dict(beta=0.7, reward_method=reward_method, estimator=estimator, weight_mode=weight_mode)
    loss, stats, grad, rl, rs, rgrad = _run(torch.float32, backend, kw)
    atol, rtol = TOL[torch.float32]
    assert loss.dtype == torch.float32 and torch.isfinite(grad).all()
    torch.testing.assert_close(loss.double(), rl.detach(), atol=atol, rtol=rtol)
    torch.testing.assert_close(grad.double(), rgrad, atol=atol, rtol=rtol)
    for k, v in rs.items():
        torch.testing.assert_close(stats[k].double(), v.double(), atol=atol, rtol=rtol, msg=k)
    assert torch.count_nonzero(grad[4]) == 0  # the all-masked row gets no gradient


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("reward_method", ["1", "2"])
def test_matches_reference_bf16(backend, estimator, reward_method):
    kw = dict(beta=1.0, reward_method=reward_method, estimator=estimator, weight_mode="question")
    loss, _, grad, rl, _, rgrad = _run(torch.bfloat16, backend, kw, seed=1, upstream=-0.6)
    atol, rtol = TOL[torch.bfloat16]
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss.double(), rl.detach(), atol=atol, rtol=rtol)
    torch.testing.assert_close(grad.double(), rgrad, atol=atol, rtol=rtol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grpo_constant_rewards_give_finite_gradient(backend):
    # first PPO step: logp == old_logp, so every reward_method-"1" reward is 0 and every group std is 0
    dev = _device(backend)
    lp = torch.randn(6, 5, device=dev).requires_grad_(True)
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], device=dev)
    loss, _ = pacs_loss(
        lp,
        lp.detach(),
        scores,
        torch.ones(6, 5, device=dev),
        torch.tensor([0, 0, 0, 1, 1, 1], device=dev),
        estimator="grpo",
        backend=backend,
    )
    loss.backward()
    assert torch.isfinite(lp.grad).all()
    torch.testing.assert_close(loss.detach().cpu(), torch.tensor(float(np.log(2.0))), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("weight_mode", WEIGHTS)
def test_parity_with_pacs_fixed_group_formulation(backend, estimator, weight_mode):
    """PACS's own layout: rollout_n consecutive samples per prompt, no padding, torch's
    BCEWithLogitsLoss(weight=...). Re-derived here from its published formulas."""
    n, P, T, beta = 4, 3, 6, 0.5
    g = torch.Generator().manual_seed(7)
    old = -torch.rand(P * n, T, generator=g)
    lp = (old + torch.randn(P * n, T, generator=g) * 0.3).requires_grad_(True)
    scores = torch.tensor([1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 0], dtype=torch.float32)
    reward = beta * (lp - old).sum(-1, keepdim=True)
    rg = reward.reshape(P, n, 1)
    if estimator == "rloo":
        adv = (rg - (rg.sum(1, keepdim=True) - rg) / (n - 1)).reshape(-1, 1)
    elif estimator == "grpo":
        adv = ((rg - rg.mean(1, keepdim=True)) / (rg.std(1, keepdim=True) + 1e-6)).reshape(-1, 1)
    else:
        adv = reward
    w = torch.ones(P * n)
    if weight_mode == "question":
        for p in range(P):
            lab = scores[p * n : (p + 1) * n]
            if 0 < lab.sum() < n:
                for j in range(n):
                    n_c = lab.sum() if lab[j] == 1 else n - lab.sum()
                    w[p * n + j] = n / (2 * n_c)
    elif weight_mode == "only_positive":
        w = scores.clone()
    elif weight_mode == "only_negative":
        w = 1 - scores
    want = torch.nn.BCEWithLogitsLoss(weight=w.reshape(-1, 1))(adv, scores.reshape(-1, 1))
    want.backward()
    dev = _device(backend)
    x = lp.detach().to(dev).requires_grad_(True)
    ours, _ = pacs_loss(
        x,
        old.to(dev),
        scores.to(dev),
        torch.ones(P * n, T, device=dev),
        torch.arange(P, device=dev).repeat_interleave(n),
        beta=beta,
        estimator=estimator,
        weight_mode=weight_mode,
        backend=backend,
    )
    ours.backward()
    torch.testing.assert_close(ours.detach().cpu(), want.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(x.grad.cpu(), lp.grad, atol=1e-6, rtol=1e-4)


def test_string_ids_and_backends_agree():
    lp, old, scores, mask, ids = _batch(torch.float32, seed=3)
    uids = np.array([f"uid-{i}" for i in ids.tolist()])
    a, sa = pacs_loss(lp, old, scores, mask, uids, estimator="grpo", weight_mode="question", backend="torch")
    dev = _device("triton")
    b, sb = pacs_loss(
        lp.to(dev),
        old.to(dev),
        scores.to(dev),
        mask.to(dev),
        ids.to(dev),
        estimator="grpo",
        weight_mode="question",
        backend="triton",
    )
    torch.testing.assert_close(a, b.cpu(), atol=1e-6, rtol=1e-5)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k].cpu(), atol=1e-6, rtol=1e-5)


def test_bad_inputs_name_the_argument():
    lp, old, scores, mask, ids = _batch(torch.float32)
    bad = scores.clone()
    bad[2] = 0.5
    with pytest.raises(ValueError, match="scores must be 0 or 1"):
        pacs_loss(lp, old, bad, mask, ids)
    with pytest.raises(ValueError, match="scores"):
        pacs_loss(lp, old, scores[:3], mask, ids)
    with pytest.raises(ValueError, match="reward_method"):
        pacs_loss(lp, old, scores, mask, ids, reward_method="3")
    with pytest.raises(ValueError, match="estimator"):
        pacs_loss(lp, old, scores, mask, ids, estimator="gae")
    with pytest.raises(ValueError, match="weight_mode"):
        pacs_loss(lp, old, scores, mask, ids, weight_mode="balanced")
    with pytest.raises(ValueError, match="old_logp"):
        pacs_loss(lp, old[:, :3], scores, mask, ids)
    with pytest.raises(ValueError, match="index"):
        pacs_loss(lp, old, scores, mask, ids[:4])


@pytest.mark.parametrize("reward_method", ["1", "2"])
def test_torch_path_row_chunks(monkeypatch, reward_method):
    """The torch path reduces rows in chunks; force chunks of 2 rows and compare."""
    import fastcrit_kernels.ppo as ppo_mod

    kw = dict(reward_method=reward_method, estimator="grpo", weight_mode="question")
    want = _run(torch.float32, "torch", kw)
    monkeypatch.setattr(ppo_mod, "_CHUNK", 2 * 9)
    got = _run(torch.float32, "torch", kw)
    torch.testing.assert_close(got[0], want[0], atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(got[2], want[2], atol=1e-8, rtol=1e-6)
