"""The composites (hidden states -> scalar loss) against the unfused path: full fp64 logits ->
log_softmax -> gather -> the fp64 reference losses, on both paths (gradients computed in the
forward, and the recompute path); and against Liger-Kernel's fused linear GRPO loss. Also: the
grad-in-forward path costs three logits-sized GEMMs (counted with torch's FLOP counter), and what it
does not support (a second backward, double backward) fails loudly."""

import pytest
import torch
from _triton_on_cuda import on_cuda
from torch.utils._python_dispatch import TorchDispatchMode

from fastcrit_kernels import _fused_linear_torch
from fastcrit_kernels._reference import ref_agg_loss, ref_kl_penalty, ref_pacs_loss, ref_ppo_policy_loss
from fastcrit_kernels.fused_linear import fused_linear_pacs_loss, fused_linear_ppo_loss
from fastcrit_kernels.logprobs import logprobs_reference

fused_linear_ppo_loss, fused_linear_pacs_loss = on_cuda(fused_linear_ppo_loss), on_cuda(fused_linear_pacs_loss)

# One tolerance table for this module: input dtype -> (loss atol, loss rtol, grad atol, grad rtol).
# The losses are computed from fp32 log-probs for every input dtype; bf16 loosens the gradients,
# which come back in bf16.
TOL = {
    torch.float32: (2e-5, 1e-5, 2e-5, 1e-4),
    torch.bfloat16: (2e-5, 1e-5, 2e-2, 2e-2),
}
# Triton on CPU tensors runs only under the interpreter, which tests/conftest.py turns on only where
# there is no GPU; on a GPU machine the "triton" cases run the compiled kernels on CUDA copies of the
# same inputs (_triton_on_cuda.on_cuda). Shapes the GPU launchers do not take (H not a multiple of 16)
# go to the torch path there, as they would for a user (the composites' own kernels take any shape).
BACKENDS = ["torch", "triton"]


def _batch(B, T, H, V, dtype, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=g) / H**0.5 * 2).to(dtype).requires_grad_()
    b = torch.randn(V, generator=g).to(dtype).requires_grad_() if bias else None
    labels = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.25).to(torch.float32)
    mask[-1] = 0.0  # an all-masked row
    labels[mask == 0] = V + 7  # padding labels that would be out of range if not masked
    with torch.no_grad():
        ref_lp = logprobs_reference(hidden, weight, torch.where(mask > 0, labels, 0), bias=b).float()
    # old/ref log-probs near the current ones so that some ratios fall outside the clip range
    old = ref_lp + 0.3 * torch.randn(B, T, generator=g)
    ref = ref_lp + 0.2 * torch.randn(B, T, generator=g)
    return hidden, weight, b, labels, mask, old, ref, g


def _params(hidden, weight, b):
    return [hidden, weight] + ([b] if b is not None else [])


def _naive_ppo(
    params,
    labels,
    mask,
    old,
    adv,
    ref,
    *,
    temperature,
    kl_coef,
    kl_kind,
    entropy_coef,
    clip_c,
    agg,
    agg_scale=None,
    token_weight=None,
):
    p64 = [p.detach().double().requires_grad_() for p in params]
    lab = torch.where(mask > 0, labels, 0)
    lp, ent = logprobs_reference(
        p64[0], p64[1], lab, temperature=temperature, bias=p64[2] if len(p64) > 2 else None, return_entropy=True
    )
    pg, stats = ref_ppo_policy_loss(lp, old, adv, mask, clip_c=clip_c, agg=agg, agg_scale=agg_scale)
    if token_weight is not None:  # the weighted per-token loss, aggregated as verl does
        pg = ref_agg_loss(_ref_clip_loss(lp, old, adv, clip_c) * token_weight.double(), mask, agg, agg_scale)
    ent_agg = ref_agg_loss(ent, mask, agg, agg_scale)
    kl_agg = ref_agg_loss(ref_kl_penalty(lp, ref, kl_kind), mask, agg, agg_scale)
    loss = pg - entropy_coef * ent_agg + kl_coef * kl_agg
    stats = dict(stats, pg_loss=pg.detach(), entropy=ent_agg.detach(), kl=kl_agg.detach())
    return loss, stats, p64


def _ref_clip_loss(lp, old, adv, clip_c, lo=0.2, hi=0.2):
    """verl's per-token clipped loss [B, T] in fp64 (before aggregation)."""
    adv = adv.double()[:, None].expand_as(lp) if adv.dim() == 1 else adv.double()
    ratio = torch.exp(torch.clamp(lp - old.double(), -20.0, 20.0))
    lc = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - lo, 1 + hi))
    return lc if clip_c is None else torch.where(adv < 0, torch.minimum(-adv * clip_c, lc), lc)


PPO_CASES = {
    # agg, kl_kind, kl_coef, entropy_coef, clip_c, temperature, per-sequence advantages, agg_scale
    "grpo_k3_entropy": ("token-mean", "low_var_kl", 0.1, 0.01, None, 0.7, True, None),
    "dualclip_seqmean": ("seq-mean-token-mean", "k1", 0.05, 0.0, 1.05, 1.0, False, None),
    "seqsumnorm_k2": ("seq-mean-token-sum-norm", "k2", 0.2, 0.05, None, 1.2, False, None),
    "seqsum_abs_dual_entropy": ("seq-mean-token-sum", "abs", 0.3, 0.02, 1.1, 1.0, False, None),
    "seqsumnorm_scale_klstat": ("seq-mean-token-sum-norm", "mse", 0.0, 0.0, 1.1, 1.0, True, 5.0),
}
# gif: the gradients computed in the forward (three GEMMs), the 21 valid tokens in one chunk or
# in chunks of 5; recompute: fused_logprobs and the [B, T] losses (the logits recomputed in backward)
PATHS = {
    "gif": dict(grad_in_forward=True),
    "gif_chunks": dict(grad_in_forward=True, chunk_bytes=5 * 4 * 131),
    "recompute": dict(grad_in_forward=False),
}


def _check_grads(params, got, exp, dtype):
    _, _, gatol, grtol = TOL[dtype]
    for p, a, e in zip(params, got, exp):
        assert a.dtype == p.dtype and a.shape == p.shape
        torch.testing.assert_close(a.double(), e, atol=gatol * max(1.0, e.abs().max().item()), rtol=grtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", list(PPO_CASES))
def test_ppo_matches_unfused(case, path, backend, dtype):
    agg, kind, kl_coef, ent_coef, clip_c, temp, per_seq, scale = PPO_CASES[case]
    B, T, H, V = 4, 7, 24, 131
    hidden, weight, b, labels, mask, old, ref, g = _batch(B, T, H, V, dtype)
    adv = torch.randn(B, generator=g) if per_seq else torch.randn(B, T, generator=g)
    kw = dict(
        kl_coef=kl_coef, kl_kind=kind, entropy_coef=ent_coef, clip_c=clip_c, agg=agg, temperature=temp, agg_scale=scale
    )
    loss, stats = fused_linear_ppo_loss(
        hidden, weight, labels, old, adv, mask, ref_logp=ref, bias=b, backend=backend, **PATHS[path], **kw
    )
    params = _params(hidden, weight, b)
    want, want_stats, p64 = _naive_ppo(params, labels, mask, old, adv, ref, **kw)
    latol, lrtol, _, _ = TOL[dtype]
    torch.testing.assert_close(loss.double(), want, atol=latol, rtol=lrtol)
    for k in ("pg_loss", "entropy", "kl", "clipfrac", "clipfrac_lower", "approx_kl"):
        torch.testing.assert_close(
            stats[k].double(), want_stats[k].double(), atol=latol, rtol=lrtol, msg=lambda m, k=k: f"{k}: {m}"
        )
    assert 0 < float(stats["clipfrac"]) < 1  # the case exercises clipping
    if clip_c is not None:
        assert float(stats["clipfrac_lower"]) > 0  # and the dual clip
    up = 2.5  # non-unit upstream gradient
    got = torch.autograd.grad(loss * up, params)
    _check_grads(params, got, torch.autograd.grad(want * up, p64), dtype)
    assert (got[0][mask == 0] == 0).all()  # masked tokens get no gradient


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", list(PATHS))
def test_ppo_without_the_entropy(path, backend):
    """entropy=False (entropy_coef 0, verl's calculate_entropy): the same loss, stats and gradients
    as with it, less the ``entropy`` stat; with an entropy coefficient it is refused by name."""
    B, T, H, V = 4, 7, 24, 131
    hidden, weight, b, labels, mask, old, ref, g = _batch(B, T, H, V, torch.float32)
    adv = torch.randn(B, generator=g)
    kw = dict(ref_logp=ref, kl_coef=0.1, bias=b, backend=backend, clip_c=1.05, **PATHS[path])
    params = _params(hidden, weight, b)
    with_ent, stats = fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask, **kw)
    without, stats_no = fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask, entropy=False, **kw)
    assert "entropy" in stats and "entropy" not in stats_no
    assert set(stats) - set(stats_no) == {"entropy"}
    torch.testing.assert_close(without, with_ent)
    for k in stats_no:
        torch.testing.assert_close(stats_no[k], stats[k], msg=lambda m, k=k: f"{k}: {m}")
    got, want = torch.autograd.grad(without, params), torch.autograd.grad(with_ent, params)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
    with pytest.raises(ValueError, match="entropy_coef=0.01 needs it"):
        fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask, entropy=False, entropy_coef=0.01, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("path", list(PATHS))
def test_cuda_ppo_at_gpu_shapes(path, dtype):
    """test_ppo_matches_unfused's GRPO case at a shape the log-prob kernels take on a GPU (H a
    multiple of 16), so that the recompute path runs them too; clipping, KL and entropy all on."""
    agg, kind, kl_coef, ent_coef, clip_c, temp, per_seq, scale = PPO_CASES["grpo_k3_entropy"]
    B, T, H, V = 4, 33, 64, 517
    hidden, weight, b, labels, mask, old, ref, g = _batch(B, T, H, V, dtype)
    adv = torch.randn(B, generator=g)
    kw = dict(kl_coef=kl_coef, kl_kind=kind, entropy_coef=ent_coef, clip_c=clip_c, agg=agg, temperature=temp)
    loss, stats = fused_linear_ppo_loss(
        hidden, weight, labels, old, adv, mask, ref_logp=ref, bias=b, backend="triton", **PATHS[path], **kw
    )
    params = _params(hidden, weight, b)
    want, want_stats, p64 = _naive_ppo(params, labels, mask, old, adv, ref, **kw)
    latol, lrtol, _, _ = TOL[dtype]
    torch.testing.assert_close(loss.double(), want, atol=latol, rtol=lrtol)
    torch.testing.assert_close(stats["clipfrac"].double(), want_stats["clipfrac"].double(), atol=latol, rtol=lrtol)
    assert 0 < float(stats["clipfrac"]) < 1
    got = torch.autograd.grad(loss * 2.5, params)
    _check_grads(params, got, torch.autograd.grad(want * 2.5, p64), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", ["gif", "recompute"])
def test_ppo_token_weight_and_frozen_head(path, backend):
    """A per-token weight w > 0 on the policy term (truncated importance sampling) as [B, T]
    advantages A * w, seq-mean-token-sum; a frozen lm_head (only hidden gets a gradient); the loss
    scaled and summed with another one."""
    B, T, H, V = 3, 6, 16, 70
    hidden, weight, _, labels, mask, old, ref, g = _batch(B, T, H, V, torch.float32, seed=3, bias=False)
    weight.requires_grad_(False)
    adv = torch.randn(B, T, generator=g)
    tis = torch.rand(B, T, generator=g) * 2 + 0.01
    kw = dict(
        kl_coef=0.1, kl_kind="low_var_kl", entropy_coef=0.0, clip_c=3.0, agg="seq-mean-token-sum", temperature=1.0
    )
    loss, stats = fused_linear_ppo_loss(
        hidden, weight, labels, old, adv * tis, mask, ref_logp=ref, backend=backend, **PATHS[path], **kw
    )
    want, want_stats, p64 = _naive_ppo([hidden, weight], labels, mask, old, adv, ref, token_weight=tis, **kw)
    torch.testing.assert_close(loss.double(), want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(stats["clipfrac"].double(), want_stats["clipfrac"].double())
    other = (hidden**2).sum() * 1e-3
    (got,) = torch.autograd.grad(other - 0.7 * loss, [hidden])
    (exp,) = torch.autograd.grad((p64[0] ** 2).sum() * 1e-3 - 0.7 * want, [p64[0]])
    _check_grads([hidden], [got], [exp], torch.float32)


PACS_CASES = {
    # reward_method, estimator, weight_mode, index
    "m1_rloo_question": ("1", "rloo", "question", [0, 0, 0, 1, 1, 2]),
    "m2_grpo_plain": ("2", "grpo", None, [5, 5, 7, 7, 7, 9]),
    "m1_naive_positive": ("1", "naive", "only_positive", ["b", "a", "b", "a", "b", "a"]),
}
# PACS chunks hold whole groups: the largest group here has 11 valid tokens, so 4-token chunks
# take the two-pass route for it (and one pass for the others), 64-token ones hold every group
PACS_PATHS = {
    "gif": dict(grad_in_forward=True, chunk_bytes=64 * 4 * 97),
    "gif_two_pass": dict(grad_in_forward=True, chunk_bytes=4 * 4 * 97),
    "recompute": dict(grad_in_forward=False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", list(PACS_PATHS))
@pytest.mark.parametrize("case", list(PACS_CASES))
def test_pacs_matches_unfused(case, path, backend, dtype):
    method, est, wmode, index = PACS_CASES[case]
    B, T, H, V = 6, 5, 20, 97
    hidden, weight, b, labels, mask, old, _, g = _batch(B, T, H, V, dtype, seed=2)
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    kw = dict(beta=0.7, reward_method=method, estimator=est, weight_mode=wmode)
    loss, stats = fused_linear_pacs_loss(
        hidden,
        weight,
        labels,
        old,
        scores,
        mask,
        index,
        temperature=0.9,
        bias=b,
        backend=backend,
        **PACS_PATHS[path],
        **kw,
    )
    params = _params(hidden, weight, b)
    p64 = [p.detach().double().requires_grad_() for p in params]
    lp = logprobs_reference(p64[0], p64[1], torch.where(mask > 0, labels, 0), temperature=0.9, bias=p64[2])
    got = _check_pacs(loss, stats, params, p64, lp, (old, scores, mask, index), kw, dtype)
    assert (got[0][mask == 0] == 0).all()


def _check_pacs(loss, stats, params, p64, lp, batch, kw, dtype):
    """The fused PACS loss, stats and gradients (upstream -1.3) against ``ref_pacs_loss`` on the
    fp64 log-probs ``lp`` of the leaves ``p64``; returns the gradients."""
    want, want_stats = ref_pacs_loss(lp, *batch, **kw)
    latol, lrtol, _, _ = TOL[dtype]
    torch.testing.assert_close(loss.double(), want, atol=latol, rtol=lrtol)
    for k in ("reward_mean", "advantage_mean", "accuracy"):
        torch.testing.assert_close(stats[k].double(), want_stats[k].double(), atol=latol, rtol=lrtol)
    got = torch.autograd.grad(loss * -1.3, params)
    _check_grads(params, got, torch.autograd.grad(want * -1.3, p64), dtype)
    return got


class _MatmulFlops(TorchDispatchMode):
    """Counts 2 m k n for every mm / addmm / addmm_ (the logits and gradient GEMMs), nothing else."""

    flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "addmm_"):
            a, b = args[:2] if name == "mm" else args[1:3]
            self.flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        return func(*args, **(kwargs or {}))


def _mm_flops(fn):
    with _MatmulFlops() as counter:
        fn()
    return counter.flops


@pytest.mark.parametrize("backend", BACKENDS)
def test_three_gemms_not_four(backend):
    """Forward + backward of the grad-in-forward PPO loss is three [n, H] x [H, V] products for its n
    valid tokens, over one chunk or several; the log-prob path's is three for all N tokens (its logits
    kept; four where fused_logprobs recomputes them: tests/kernels/test_logprobs.py). PACS is
    three where each group fits a chunk and four for a group that does not. (H = 32: a multiple of 16,
    which the GPU's log-prob kernels take; H = 24 would send the recompute path to torch's there.)"""
    B, T, H, V = 4, 7, 32, 131
    hidden, weight, b, labels, mask, old, ref, g = _batch(B, T, H, V, torch.float32)
    adv = torch.randn(B, generator=g)
    one = lambda m: 2 * int((m != 0).sum()) * H * V  # (one logits-sized GEMM)

    def ppo(m, **kw):
        loss, _ = fused_linear_ppo_loss(
            hidden, weight, labels % V, old, adv, m, ref_logp=ref, kl_coef=0.1, bias=b, backend=backend, **kw
        )
        loss.backward()

    assert _mm_flops(lambda: ppo(mask, grad_in_forward=True)) == 3 * one(mask)
    assert _mm_flops(lambda: ppo(mask, grad_in_forward=True, chunk_bytes=5 * 4 * V)) == 3 * one(mask)
    full = torch.ones_like(mask)
    # the log-prob path: on torch three (its logits fit fused_logprobs' CPU keep_bytes, so they are
    # kept, not recomputed); on Triton two are inside its kernels (tl.dot), unseen here
    assert _mm_flops(lambda: ppo(full, grad_in_forward=False)) == (3 if backend == "torch" else 2) * one(full)
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    n = int(mask.sum())

    def pacs(index, chunk):
        loss, _ = fused_linear_pacs_loss(
            hidden,
            weight,
            labels,
            old,
            scores,
            mask,
            index,
            bias=b,
            backend=backend,
            grad_in_forward=True,
            chunk_bytes=chunk * 4 * V,
        )
        loss.backward()

    assert _mm_flops(lambda: pacs([0, 0, 1, 1], n)) == 3 * one(mask)
    assert _mm_flops(lambda: pacs([0, 0, 0, 0], n - 1)) == 4 * one(mask)  # one group, larger than a chunk


@pytest.mark.parametrize("backend", BACKENDS)
def test_entropy_gradient_where_bias_masks_tokens(backend):
    """A bias of -inf masks vocab entries (p = 0, log p = -inf): the entropy bonus's gradient stays
    finite and matches the reference on both paths."""
    B, T, H, V = 2, 5, 16, 68
    hidden, weight, b, labels, mask, old, ref, g = _batch(B, T, H, V, torch.float32, seed=5)
    with torch.no_grad():
        b[1::3] = float("-inf")
        labels = labels // 3 * 3  # labels (and the reference's stand-in 0 for padding) keep p > 0
        labels[mask == 0] = V + 7
    params = [hidden, weight]
    adv = torch.randn(B, generator=g)
    kw = dict(kl_coef=0.0, kl_kind="k1", entropy_coef=0.3, clip_c=None, agg="token-mean", temperature=1.0)
    want, _, p64 = _naive_ppo([hidden, weight, b.detach()], labels, mask, old, adv, ref, **kw)
    exp = torch.autograd.grad(want, p64[:2])
    for path in ("gif", "recompute"):
        loss, _ = fused_linear_ppo_loss(
            hidden, weight, labels, old, adv, mask, bias=b.detach(), backend=backend, **PATHS[path], **kw
        )
        torch.testing.assert_close(loss.double(), want, atol=2e-5, rtol=1e-5)
        got = torch.autograd.grad(loss, params)
        assert all(torch.isfinite(x).all() for x in got)
        _check_grads(params, got, exp, torch.float32)


def test_grad_in_forward_limits_and_choice():
    """What the grad-in-forward path does not do fails loudly; without a gradient to compute, the
    default is the recompute path's forward (one GEMM), with the same values."""
    hidden, weight, b, labels, mask, old, ref, g = _batch(3, 4, 8, 30, torch.float32)
    adv = torch.randn(3, generator=g)
    loss, _ = fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask, ref_logp=ref, kl_coef=0.1)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="first backward"):
        loss.backward()
    loss, _ = fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask)
    (gh,) = torch.autograd.grad(loss, [hidden], create_graph=True)
    with pytest.raises(RuntimeError):
        gh.sum().backward()  # double backward
    loss, _ = fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask, grad_in_forward=False)
    loss.backward(retain_graph=True)
    loss.backward()  # the recompute path is an ordinary graph
    with torch.no_grad():
        flops = _mm_flops(lambda: fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask))
        nograd, _ = fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask)
    assert flops == 2 * 12 * 8 * 30  # the logits of all 12 tokens, once
    torch.testing.assert_close(nograd, loss.detach())
    none = torch.zeros_like(mask)  # no valid token: loss 0 (PACS: the BCE of advantage 0), zero gradients
    for path in ("gif", "recompute"):
        ppo, _ = fused_linear_ppo_loss(
            hidden, weight, labels, old, adv, none, ref_logp=ref, kl_coef=0.1, entropy_coef=0.1, **PATHS[path]
        )
        pacs, _ = fused_linear_pacs_loss(
            hidden, weight, labels, old, torch.tensor([1.0, 0.0, 1.0]), none, [0, 0, 1], **PATHS[path]
        )
        assert float(ppo.detach()) == 0.0
        torch.testing.assert_close(pacs, torch.tensor(2.0).log())
        for gr in torch.autograd.grad(ppo + pacs, [hidden, weight]):
            assert (gr == 0).all()


def test_log_softmax_in_place_is_exact():
    """The torch path writes ATen's log_softmax into its own input: exactly torch.log_softmax, on rows
    wider than a cache and on -inf entries."""
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(3, 300_001, generator=g, dtype=dtype) * 4
        x[1, ::7] = float("-inf")
        want = torch.log_softmax(x, dim=1)
        assert torch.equal(_fused_linear_torch.log_softmax_(x.clone()), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_parity_with_liger_grpo_loss(backend):
    """Liger 0.8's LigerFusedLinearGRPOLoss with loss_type="bnpo" is token-mean PPO-clip + beta * k3.
    Liger does not clamp k3 or the log-ratio; the inputs keep both far from verl's clamps."""
    grpo = pytest.importorskip("liger_kernel.chunked_loss")
    B, T, H, V = 3, 6, 16, 90
    hidden, weight, _, labels, mask, old, ref, g = _batch(B, T, H, V, torch.float32, seed=4, bias=False)
    mask[-1, :2] = 1.0  # Liger has no notion of an all-masked row; keep every row alive
    labels[-1, :2] = torch.tensor([3, 41])
    labels = torch.where(mask > 0, labels, 0)
    adv = torch.randn(B, generator=g)
    beta, eps_lo, eps_hi, temp = 0.04, 0.2, 0.28, 0.9
    loss, stats = fused_linear_ppo_loss(
        hidden,
        weight,
        labels,
        old,
        adv,
        mask,
        ref_logp=ref,
        kl_coef=beta,
        kl_kind="low_var_kl",
        clip_low=eps_lo,
        clip_high=eps_hi,
        temperature=temp,
        backend=backend,
    )
    h2, w2 = (t.detach().clone().requires_grad_() for t in (hidden, weight))
    peer = grpo.LigerFusedLinearGRPOLoss(
        beta=beta,
        compiled=False,
        use_ref_model=True,
        chunk_size=1,
        epsilon_low=eps_lo,
        epsilon_high=eps_hi,
        loss_type="bnpo",
        temperature=temp,
    )
    theirs, metrics = peer(h2, w2, labels, mask.long(), adv, ref_per_token_logps=ref, old_per_token_logps=old)
    torch.testing.assert_close(loss, theirs, atol=2e-5, rtol=1e-5)
    kl_theirs, clip_theirs = metrics
    torch.testing.assert_close(stats["kl"], kl_theirs, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(stats["clipfrac"], clip_theirs, atol=1e-6, rtol=0)
    ga = torch.autograd.grad(loss, [hidden, weight])
    gb = torch.autograd.grad(theirs, [h2, w2])
    for a, e in zip(ga, gb):
        torch.testing.assert_close(a, e, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("path", ["gif", "recompute"])
def test_bad_inputs_name_the_problem(path):
    hidden, weight, b, labels, mask, old, ref, g = _batch(2, 3, 8, 20, torch.float32)
    adv = torch.randn(2)
    fused_linear_ppo_loss = _with(PATHS[path])
    with pytest.raises(ValueError, match="clip_c"):
        fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask, clip_c=0.5)
    with pytest.raises(ValueError, match="advantages must have shape"):
        fused_linear_ppo_loss(hidden, weight, labels, old, adv[:1], mask)
    with pytest.raises(ValueError, match="agg must be"):
        fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask, agg="mean")
    with pytest.raises(ValueError, match="ref_logp"):
        fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="old_logp must have shape"):
        fused_linear_ppo_loss(hidden, weight, labels, old[:, :2], adv, mask)
    with pytest.raises(ValueError, match="hidden must be"):
        fused_linear_ppo_loss(hidden[0], weight, labels, old, adv, mask)
    with pytest.raises(ValueError, match="kl_kind"):
        fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask, ref_logp=ref, kl_kind="k9")
    bad = labels.clone()
    bad[0, 0] = 999
    mask2 = mask.clone()
    mask2[0, 0] = 1.0
    with pytest.raises(ValueError, match="labels must lie in"):
        fused_linear_ppo_loss(hidden, weight, bad, old, adv, mask2)
    with pytest.raises(ValueError, match="scores must be 0 or 1"):
        fused_linear_pacs_loss(hidden, weight, labels, old, torch.tensor([0.5, 1.0]), mask, [0, 0], **PATHS[path])
    with pytest.raises(ValueError, match="labels must lie in"):
        fused_linear_pacs_loss(hidden, weight, bad, old, torch.tensor([0.0, 1.0]), mask2, [0, 0], **PATHS[path])


def _with(kw):
    return lambda *a, **k: fused_linear_ppo_loss(*a, **kw, **k)
