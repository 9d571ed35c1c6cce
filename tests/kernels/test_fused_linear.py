"""The composites (hidden states -> scalar loss) against the unfused path: full fp64 logits ->
log_softmax -> gather -> the fp64 reference losses; and against Liger-Kernel's fused linear GRPO loss."""
import pytest
import torch

from fastcrit_kernels._reference import ref_agg_loss, ref_kl_penalty, ref_pacs_loss, ref_ppo_policy_loss
from fastcrit_kernels.fused_linear import fused_linear_pacs_loss, fused_linear_ppo_loss
from fastcrit_kernels.logprobs import logprobs_reference

# One tolerance table for this module: input dtype -> (loss atol, loss rtol, grad atol, grad rtol).
# The losses are computed from fp32 log-probs for every input dtype; bf16 loosens the gradients,
# which come back in bf16.
TOL = {
    torch.float32: (2e-5, 1e-5, 2e-5, 1e-4),
    torch.bfloat16: (2e-5, 1e-5, 2e-2, 2e-2),
}
# Triton on CPU tensors runs only under the interpreter, which tests/conftest.py turns on only where
# there is no GPU; on a GPU machine the compiled kernels are tested on CUDA tensors instead.
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    torch.cuda.is_available(), reason="interpreter is off on a GPU machine; CUDA tests cover Triton"))]


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


def _naive_ppo(params, labels, mask, old, adv, ref, *, temperature, kl_coef, kl_kind, entropy_coef,
               clip_c, agg):
    p64 = [p.detach().double().requires_grad_() for p in params]
    lab = torch.where(mask > 0, labels, 0)
    lp, ent = logprobs_reference(p64[0], p64[1], lab, temperature=temperature,
                                 bias=p64[2] if len(p64) > 2 else None, return_entropy=True)
    pg, stats = ref_ppo_policy_loss(lp, old, adv, mask, clip_c=clip_c, agg=agg)
    ent_agg = ref_agg_loss(ent, mask, agg)
    kl_agg = ref_agg_loss(ref_kl_penalty(lp, ref, kl_kind), mask, agg)
    loss = pg - entropy_coef * ent_agg + kl_coef * kl_agg
    stats = dict(stats, pg_loss=pg.detach(), entropy=ent_agg.detach(), kl=kl_agg.detach())
    return loss, stats, p64


PPO_CASES = {
    # agg, kl_kind, kl_coef, entropy_coef, clip_c, temperature, per-sequence advantages
    "grpo_k3_entropy": ("token-mean", "low_var_kl", 0.1, 0.01, None, 1.0, True),
    "dualclip_seqmean_temp": ("seq-mean-token-mean", "k1", 0.05, 0.0, 3.0, 0.7, False),
    "seqsumnorm_k2": ("seq-mean-token-sum-norm", "k2", 0.2, 0.05, None, 1.2, False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(PPO_CASES))
def test_ppo_matches_unfused(case, backend, dtype):
    agg, kind, kl_coef, ent_coef, clip_c, temp, per_seq = PPO_CASES[case]
    B, T, H, V = 4, 7, 24, 131
    hidden, weight, b, labels, mask, old, ref, g = _batch(B, T, H, V, dtype)
    adv = torch.randn(B, generator=g) if per_seq else torch.randn(B, T, generator=g)
    kw = dict(kl_coef=kl_coef, kl_kind=kind, entropy_coef=ent_coef, clip_c=clip_c, agg=agg,
              temperature=temp)
    loss, stats = fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask, ref_logp=ref, bias=b,
                                        backend=backend, **kw)
    params = _params(hidden, weight, b)
    want, want_stats, p64 = _naive_ppo(params, labels, mask, old, adv, ref, **kw)
    latol, lrtol, gatol, grtol = TOL[dtype]
    torch.testing.assert_close(loss.double(), want, atol=latol, rtol=lrtol)
    for k in ("pg_loss", "entropy", "kl", "clipfrac", "clipfrac_lower", "approx_kl"):
        torch.testing.assert_close(stats[k].double(), want_stats[k].double(), atol=latol, rtol=lrtol,
                                   msg=lambda m, k=k: f"{k}: {m}")
    assert 0 < float(stats["clipfrac"]) < 1  # the case exercises clipping
    up = 2.5  # non-unit upstream gradient
    got = torch.autograd.grad(loss * up, params)
    exp = torch.autograd.grad(want * up, p64)
    for p, a, e in zip(params, got, exp):
        assert a.dtype == p.dtype
        torch.testing.assert_close(a.double(), e, atol=gatol * max(1.0, e.abs().max().item()), rtol=grtol)
    # masked tokens get no gradient
    assert (got[0][mask == 0] == 0).all()


PACS_CASES = {
    # reward_method, estimator, weight_mode, index
    "m1_rloo_question": ("1", "rloo", "question", [0, 0, 0, 1, 1, 2]),
    "m2_grpo_plain": ("2", "grpo", None, [5, 5, 7, 7, 7, 9]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(PACS_CASES))
def test_pacs_matches_unfused(case, backend):
    method, est, wmode, index = PACS_CASES[case]
    B, T, H, V = 6, 5, 20, 97
    hidden, weight, b, labels, mask, old, _, g = _batch(B, T, H, V, torch.float32, seed=2)
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    kw = dict(beta=0.7, reward_method=method, estimator=est, weight_mode=wmode)
    loss, stats = fused_linear_pacs_loss(hidden, weight, labels, old, scores, mask, index,
                                         temperature=0.9, bias=b, backend=backend, **kw)
    params = _params(hidden, weight, b)
    p64 = [p.detach().double().requires_grad_() for p in params]
    lp = logprobs_reference(p64[0], p64[1], torch.where(mask > 0, labels, 0), temperature=0.9, bias=p64[2])
    want, want_stats = ref_pacs_loss(lp, old, scores, mask, index, **kw)
    latol, lrtol, gatol, grtol = TOL[torch.float32]
    torch.testing.assert_close(loss.double(), want, atol=latol, rtol=lrtol)
    for k in ("reward_mean", "advantage_mean", "accuracy"):
        torch.testing.assert_close(stats[k].double(), want_stats[k].double(), atol=latol, rtol=lrtol)
    got = torch.autograd.grad(loss * -1.3, params)
    exp = torch.autograd.grad(want * -1.3, p64)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a.double(), e, atol=gatol * max(1.0, e.abs().max().item()), rtol=grtol)


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
    loss, stats = fused_linear_ppo_loss(hidden, weight, labels, old, adv, mask, ref_logp=ref,
                                        kl_coef=beta, kl_kind="low_var_kl", clip_low=eps_lo,
                                        clip_high=eps_hi, temperature=temp, backend=backend)
    h2, w2 = (t.detach().clone().requires_grad_() for t in (hidden, weight))
    peer = grpo.LigerFusedLinearGRPOLoss(beta=beta, compiled=False, use_ref_model=True, chunk_size=1,
                                         epsilon_low=eps_lo, epsilon_high=eps_hi, loss_type="bnpo",
                                         temperature=temp)
    theirs, metrics = peer(h2, w2, labels, mask.long(), adv, ref_per_token_logps=ref,
                           old_per_token_logps=old)
    torch.testing.assert_close(loss, theirs, atol=2e-5, rtol=1e-5)
    kl_theirs, clip_theirs = metrics
    torch.testing.assert_close(stats["kl"], kl_theirs, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(stats["clipfrac"], clip_theirs, atol=1e-6, rtol=0)
    ga = torch.autograd.grad(loss, [hidden, weight])
    gb = torch.autograd.grad(theirs, [h2, w2])
    for a, e in zip(ga, gb):
        torch.testing.assert_close(a, e, atol=2e-5, rtol=1e-4)


def test_bad_inputs_name_the_problem():
    hidden, weight, b, labels, mask, old, ref, g = _batch(2, 3, 8, 20, torch.float32)
    adv = torch.randn(2)
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
