"""ppo_policy_loss, value_loss and aggregate_loss against the fp64 references (verl core_algos),
both backends, every agg mode, dual clip; plus parity with Liger's GRPO per-token loss."""

import pytest
import torch

from fastcrit_kernels import AGG_MODES, aggregate_loss, kl_penalty, ppo_policy_loss, value_loss
from fastcrit_kernels._reference import ref_agg_loss, ref_ppo_policy_loss, ref_value_loss

# dtype of logp / values: (atol, rtol) for loss, stats and gradients. Losses are float32 sums of
# float32 terms computed from the same rounded inputs as the oracle; bf16 gradients are rounded
# to 8 bits on output.
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (2e-3, 1e-2),
}
BACKENDS = ["torch", "triton"]


def _device(backend):
    """Triton runs compiled on CUDA tensors where a GPU exists, else under the interpreter on CPU."""
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def _run(fn, backend, leaf, *others, upstream=1.0, **kw):
    """``fn(leaf, *others)`` on the backend's device, backward with ``upstream``; results on the CPU."""
    dev = _device(backend)
    x = leaf.detach().to(dev).requires_grad_(True)
    loss, stats = fn(x, *(o.to(dev) for o in others), backend=backend, **kw)
    (loss * upstream).backward()
    return loss.detach().cpu(), {k: v.cpu() for k, v in stats.items()}, x.grad.cpu()


def _policy_batch(dtype, B=5, T=13, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    lp = old + torch.randn(B, T, generator=g) * 0.4  # ratios well outside [0.8, 1.2] for many tokens
    lp[0, 0], lp[0, 1] = old[0, 0] + 25.0, old[0, 1] - 25.0  # log-ratio beyond the +-20 clamp
    adv = torch.randn(B, T, generator=g) * 2
    adv[1, :] = 0.0
    lp[4, 3], adv[4, 3] = old[4, 3] + 2.0, -1.5  # ratio e^2 > c = 3 with A < 0: dual clip is active
    mask = torch.rand(B, T, generator=g) > 0.25
    mask[0, :2] = True
    mask[4, 3] = True
    mask[2] = False  # all-masked row
    mask[3] = False
    mask[3, 5] = True  # a single valid token
    return lp.to(dtype), old.to(dtype), adv.to(dtype), mask


def _compare(loss, stats, grad, rl, rs, rgrad, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(loss.double(), rl.detach(), atol=atol, rtol=rtol)
    for k, v in rs.items():
        torch.testing.assert_close(stats[k].double(), v.double(), atol=1e-6, rtol=1e-6, msg=k)
    torch.testing.assert_close(grad.double(), rgrad, atol=atol, rtol=rtol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("clip_c", [None, 3.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_policy_loss_matches_reference(backend, agg, clip_c, dtype):
    lp, old, adv, mask = _policy_batch(dtype)
    kw = dict(clip_low=0.2, clip_high=0.28, clip_c=clip_c, agg=agg)
    loss, stats, grad = _run(ppo_policy_loss, backend, lp, old, adv, mask, upstream=-2.5, **kw)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    lp64 = lp.detach().double().requires_grad_(True)
    rl, rs = ref_ppo_policy_loss(lp64, old, adv, mask, **kw)
    (rl * -2.5).backward()
    _compare(loss, stats, grad, rl, rs, lp64.grad, dtype)
    assert grad.dtype == dtype
    assert float(stats["clipfrac"]) > 0
    if clip_c is not None:
        assert float(stats["clipfrac_lower"]) > 0  # the data does exercise dual clip


@pytest.mark.parametrize("backend", BACKENDS)
def test_policy_loss_sequence_advantages_and_agg_scale(backend):
    lp, old, _, mask = _policy_batch(torch.float32, seed=2)
    adv_seq = torch.tensor([1.0, -0.5, 2.0, -1.5, 0.3])
    loss, _, grad = _run(
        ppo_policy_loss, backend, lp, old, adv_seq, mask, agg="seq-mean-token-sum-norm", agg_scale=64.0
    )
    lp64 = lp.detach().double().requires_grad_(True)
    rl, _ = ref_ppo_policy_loss(lp64, old, adv_seq, mask, agg="seq-mean-token-sum-norm", agg_scale=64.0)
    rl.backward()
    torch.testing.assert_close(loss.double(), rl.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad.double(), lp64.grad, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("agg", AGG_MODES)
def test_one_token_and_all_masked(backend, agg):
    lp = torch.tensor([[-1.0]])
    loss, _, grad = _run(
        ppo_policy_loss, backend, lp, torch.tensor([[-1.3]]), torch.tensor([[2.0]]), torch.ones(1, 1), agg=agg
    )
    lp64 = lp.detach().double().requires_grad_(True)
    rl, _ = ref_ppo_policy_loss(lp64, torch.tensor([[-1.3]]), torch.tensor([[2.0]]), torch.ones(1, 1), agg=agg)
    rl.backward()
    torch.testing.assert_close(loss.double(), rl.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad.double(), lp64.grad, atol=1e-6, rtol=1e-6)
    # nothing valid: loss 0, gradient 0, stats 0 (verl would give NaN for token-mean)
    lp2 = torch.randn(2, 4)
    loss2, stats2, grad2 = _run(ppo_policy_loss, backend, lp2, lp2, torch.ones(2, 4), torch.zeros(2, 4), agg=agg)
    assert float(loss2) == 0.0 and torch.count_nonzero(grad2) == 0
    assert all(float(v) == 0.0 for v in stats2.values())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_value_loss_matches_reference(backend, agg, dtype):
    g = torch.Generator().manual_seed(5)
    B, T = 4, 11
    v = torch.randn(B, T, generator=g).to(dtype)
    vo = (v.float() + torch.randn(B, T, generator=g) * 0.6).to(dtype)
    R = torch.randn(B, T, generator=g).to(dtype)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[1] = False
    loss, stats, grad = _run(value_loss, backend, v, vo, R, mask, clip=0.3, agg=agg, upstream=0.7)
    v64 = v.double().requires_grad_(True)
    rl, rs = ref_value_loss(v64, vo, R, mask, clip=0.3, agg=agg)
    (rl * 0.7).backward()
    _compare(loss, stats, grad, rl, rs, v64.grad, dtype)
    assert float(stats["clipfrac"]) > 0


@pytest.mark.parametrize("agg", AGG_MODES)
def test_aggregate_loss_matches_reference(agg):
    g = torch.Generator().manual_seed(6)
    L = torch.randn(4, 9, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 9, generator=g) > 0.4
    mask[0] = False
    torch.testing.assert_close(aggregate_loss(L, mask, agg), ref_agg_loss(L, mask, agg), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_are_not_modified(backend):
    lp, old, adv, mask = (t.to(_device(backend)) for t in _policy_batch(torch.float32, seed=4))
    mask = mask.float()
    adv_seq = adv[:, 0].clone()
    before = [t.clone() for t in (lp, old, adv_seq, mask)]
    ppo_policy_loss(lp.requires_grad_(True), old, adv_seq, mask, clip_c=3.0, backend=backend)[0].backward()
    value_loss(lp, old, adv, mask, backend=backend)[0].backward()
    for t, b in zip((lp, old, adv_seq, mask), before):
        assert torch.equal(t.detach(), b.detach())


def test_no_grad_inputs_and_backends_agree():
    lp, old, adv, mask = _policy_batch(torch.float32, seed=9)
    a, sa = ppo_policy_loss(lp, old, adv, mask, clip_c=2.0, backend="torch")
    dev = _device("triton")
    b, sb = ppo_policy_loss(lp.to(dev), old.to(dev), adv.to(dev), mask.to(dev), clip_c=2.0, backend="triton")
    assert not a.requires_grad
    torch.testing.assert_close(a, b.cpu(), atol=1e-6, rtol=1e-5)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k].cpu(), atol=1e-6, rtol=1e-6)


def test_bad_inputs_name_the_argument():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="agg"):
        ppo_policy_loss(x, x, x, x, agg="token-sum-mean")
    with pytest.raises(ValueError, match="clip_c"):
        ppo_policy_loss(x, x, x, x, clip_c=1.0)
    with pytest.raises(ValueError, match="old_logp"):
        ppo_policy_loss(x, torch.zeros(2, 4), x, x)
    with pytest.raises(ValueError, match="advantages"):
        ppo_policy_loss(x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="logp"):
        ppo_policy_loss(torch.zeros(6), x, x, x)
    with pytest.raises(ValueError, match="returns"):
        value_loss(x, x, torch.zeros(1, 3), x)
    with pytest.raises(ValueError, match="clip"):
        value_loss(x, x, x, x, clip=-1.0)
    with pytest.raises(ValueError, match="agg_scale"):
        ppo_policy_loss(x, x, x, x, agg="seq-mean-token-sum-norm", agg_scale=0.0)


# ---- parity with Liger-Kernel's GRPO per-token loss (liger_kernel 0.8.x, runs on CPU) ----
LIGER_AGG = {"bnpo": "token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}


@pytest.mark.parametrize("loss_type", sorted(LIGER_AGG))
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("backend", BACKENDS)
def test_parity_with_liger_grpo_loss(loss_type, beta, backend):
    grpo = pytest.importorskip("liger_kernel.chunked_loss.grpo_loss")
    g = torch.Generator().manual_seed(11)
    B, T = 4, 10
    old = -torch.rand(B, T, generator=g) * 2
    lp = (old + torch.randn(B, T, generator=g) * 0.3).requires_grad_(True)
    ref = old + torch.randn(B, T, generator=g) * 0.3  # within verl's k3 clamps
    adv = torch.randn(B, generator=g)
    mask = torch.ones(B, T)
    mask[1, 6:] = 0  # Liger excludes no sequence, so every row keeps a valid token here
    mask[3, 2:] = 0

    liger_loss, metrics = grpo.LigerFusedLinearGRPOFunction.ppo_loss_fn(
        lp,
        mask,
        adv,
        mask,
        ref_per_token_logps=ref if beta else None,
        old_per_token_logps=old,
        epsilon_low=0.2,
        epsilon_high=0.28,
        beta=beta,
        loss_type=loss_type,
        max_completion_length=T,
    )
    liger_loss.backward()
    liger_grad = lp.grad.clone()
    lp.grad = None

    agg = LIGER_AGG[loss_type]
    dev = _device(backend)
    x, old, adv, mask, ref = (t.detach().to(dev) for t in (lp, old, adv, mask, ref))
    x.requires_grad_(True)
    ours, stats = ppo_policy_loss(x, old, adv, mask, clip_low=0.2, clip_high=0.28, agg=agg, backend=backend)
    if beta:
        ours = ours + beta * aggregate_loss(kl_penalty(x, ref, "k3", backend=backend), mask, agg)
    ours.backward()
    torch.testing.assert_close(ours.detach().cpu(), liger_loss.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(x.grad.cpu(), liger_grad, atol=1e-7, rtol=1e-5)
    clip_ratio = metrics[-1]
    if loss_type == "bnpo":  # Liger's clip ratio is token-mean
        torch.testing.assert_close(stats["clipfrac"].cpu(), clip_ratio, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("clip_c", [None, 3.0])
def test_torch_path_row_chunks(monkeypatch, clip_c):
    """The torch path walks rows in chunks; force chunks of 2 rows (13 tokens each) and compare."""
    import fastcrit_kernels.ppo as ppo_mod

    lp, old, adv, mask = _policy_batch(torch.float32, B=7, seed=12)
    want = _run(ppo_policy_loss, "torch", lp, old, adv, mask, clip_c=clip_c, agg="seq-mean-token-mean")
    want_v = _run(value_loss, "torch", lp, old, adv, mask, clip=0.2)
    monkeypatch.setattr(ppo_mod, "_CHUNK", 2 * 13)
    got = _run(ppo_policy_loss, "torch", lp, old, adv, mask, clip_c=clip_c, agg="seq-mean-token-mean")
    got_v = _run(value_loss, "torch", lp, old, adv, mask, clip=0.2)
    for a, b in ((got, want), (got_v, want_v)):
        torch.testing.assert_close(a[0], b[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(a[2], b[2], atol=1e-7, rtol=1e-6)
        for k in a[1]:
            torch.testing.assert_close(a[1][k], b[1][k], atol=1e-7, rtol=1e-6)
