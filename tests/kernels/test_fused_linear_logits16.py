"""``logits_dtype=torch.bfloat16`` on the grad-in-forward fused losses (Triton backend: the compiled
kernels on a GPU, the interpreter elsewhere): each chunk keeps the logits as the 16-bit GEMM writes
them, and the loss, its stats and its gradients are those of the unfused fp64 path fed with exactly
those rounded logits (their gradient passed straight through the rounding). Also: the option is not
a no-op (from fp32 logits the gradients differ), several chunks add up to one, and where it cannot
apply it is refused by name."""

import pytest
import torch
from _triton_on_cuda import on_cuda
from test_fused_linear import PPO_CASES, TOL, _batch, _check_grads, _check_pacs, _params, _ref_clip_loss

from fastcrit_kernels._reference import ref_agg_loss, ref_kl_penalty
from fastcrit_kernels.fused_linear import fused_linear_pacs_loss, fused_linear_ppo_loss
from fastcrit_kernels.logprobs import logprobs_reference

ppo, pacs = on_cuda(fused_linear_ppo_loss), on_cuda(fused_linear_pacs_loss)
BF16 = torch.bfloat16


def _raw16(hidden, weight):
    """The [B, T, V] logits as a 16-bit GEMM writes them: ``_grid_batch``'s inputs make every fp32
    sum exact whatever the GEMM's order, so this is its one rounding, on any device and kernel."""
    return (hidden.detach().double() @ weight.detach().double().t()).to(hidden.dtype)


def _ref_logprobs(p64, raw16, labels, mask, temperature):
    """fp64 log-probs and entropies of the rounded logits; gradients straight through the rounding."""
    raw = p64[0] @ p64[1].t()
    raw = raw + (raw16.double() - raw).detach()
    z = (raw + p64[2] if len(p64) > 2 else raw) / temperature
    logp = torch.log_softmax(z, -1)
    lp = logp.gather(-1, torch.where(mask > 0, labels, 0).unsqueeze(-1)).squeeze(-1)
    return lp, -(logp.exp() * logp).sum(-1)


def _rel(a, e):
    """||a - e|| / ||e||, in fp64."""
    return float((a.double() - e.double()).norm() / e.double().norm())


# one chunk for all 21 valid tokens, or chunks of 5 (d_W added over four chunks)
CHUNKS = {"one": None, "of5": 5 * 2 * 131}


def _grid_batch(B, T, H, V, seed=0):
    """``_batch`` with hidden states in k/8 (|k| <= 16) and weights in k/16 (|k| <= 64): each
    product is a multiple of 1/128, so the fp32 sums of the logits are exact (any GEMM, any order)
    and only their rounding to bf16 remains, a deterministic one. The logits' std is ~14, where
    bf16 is off by up to 1/32, so that rounded and exact logits give clearly different gradients;
    old/ref log-probs near the new ones."""
    _, _, b, labels, mask, _, _, g = _batch(B, T, H, V, BF16, seed=seed)
    hidden = (torch.randint(-16, 17, (B, T, H), generator=g) / 8).to(BF16).requires_grad_()
    weight = (torch.randint(-64, 65, (V, H), generator=g) / 16).to(BF16).requires_grad_()
    with torch.no_grad():
        lp = logprobs_reference(hidden, weight, torch.where(mask > 0, labels, 0), bias=b).float()
    old = lp + 0.3 * torch.randn(B, T, generator=g)
    ref = lp + 0.2 * torch.randn(B, T, generator=g)
    return hidden, weight, b, labels, mask, old, ref, g


@pytest.mark.parametrize("chunks", list(CHUNKS))
def test_ppo_on_the_rounded_logits(chunks):
    agg, kind, kl_coef, ent_coef, clip_c, temp, _, _ = PPO_CASES["grpo_k3_entropy"]
    B, T, H, V = 4, 7, 24, 131
    hidden, weight, b, labels, mask, old, ref, g = _grid_batch(B, T, H, V)
    adv = torch.randn(B, generator=g)
    kw = dict(kl_coef=kl_coef, kl_kind=kind, entropy_coef=ent_coef, clip_c=clip_c, agg=agg, temperature=temp)
    call = dict(ref_logp=ref, bias=b, backend="triton", grad_in_forward=True, chunk_bytes=CHUNKS[chunks], **kw)
    loss, stats = ppo(hidden, weight, labels, old, adv, mask, logits_dtype=BF16, **call)

    params = _params(hidden, weight, b)
    p64 = [p.detach().double().requires_grad_() for p in params]
    lp, ent = _ref_logprobs(p64, _raw16(hidden, weight), labels, mask, temp)
    pg = ref_agg_loss(_ref_clip_loss(lp, old, adv, clip_c), mask, agg)
    ent_agg, kl_agg = ref_agg_loss(ent, mask, agg), ref_agg_loss(ref_kl_penalty(lp, ref, kind), mask, agg)
    want = pg - ent_coef * ent_agg + kl_coef * kl_agg
    latol, lrtol, _, _ = TOL[BF16]
    torch.testing.assert_close(loss.double(), want, atol=latol, rtol=lrtol)
    for k, v in (("pg_loss", pg), ("entropy", ent_agg), ("kl", kl_agg)):
        torch.testing.assert_close(
            stats[k].double(), v.detach(), atol=latol, rtol=lrtol, msg=lambda m, k=k: f"{k}: {m}"
        )
    got = torch.autograd.grad(loss * 2.5, params)
    wg = torch.autograd.grad(want * 2.5, p64)
    _check_grads(params, got, wg, BF16)
    for a, e in zip(got, wg):  # within bf16's rounding of the gradients themselves (~0.4% here)
        assert _rel(a, e) < 0.01
    assert (got[0][mask == 0] == 0).all()

    # not a no-op: from the exact fp32 logits the gradients differ by far more than the tolerance
    exact, _ = ppo(hidden, weight, labels, old, adv, mask, **call)
    other = torch.autograd.grad(exact * 2.5, params)
    for a, e in zip(got, other):  # ~6% here
        assert _rel(a, e) > 0.02


def test_pacs_on_the_rounded_logits():
    B, T, H, V = 6, 5, 20, 97
    hidden, weight, b, labels, mask, old, _, _ = _grid_batch(B, T, H, V, seed=2)
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    index = [0, 0, 0, 1, 1, 2]
    kw = dict(beta=0.7, reward_method="1", estimator="rloo", weight_mode="question")
    loss, stats = pacs(
        hidden, weight, labels, old, scores, mask, index, temperature=0.9, bias=b, backend="triton",
        grad_in_forward=True, chunk_bytes=4 * 2 * 97, logits_dtype=BF16, **kw,
    )  # fmt: skip
    params = _params(hidden, weight, b)
    p64 = [p.detach().double().requires_grad_() for p in params]
    lp, _ = _ref_logprobs(p64, _raw16(hidden, weight), labels, mask, 0.9)
    _check_pacs(loss, stats, params, p64, lp, (old, scores, mask, index), kw, BF16)


def test_logits_dtype_is_refused_where_it_cannot_apply():
    hidden, weight, b, labels, mask, old, _, g = _batch(2, 3, 8, 20, BF16)
    adv = torch.randn(2)
    args = (hidden, weight, labels, old, adv, mask)
    with pytest.raises(ValueError, match="logits_dtype must be None"):
        ppo(*args, logits_dtype=torch.float32, backend="triton")
    with pytest.raises(ValueError, match="logits_dtype must be None"):
        ppo(*args, logits_dtype="bf16", backend="triton", grad_in_forward=False)  # checked on every path
    with pytest.raises(ValueError, match="on the torch backend"):
        ppo(*args, logits_dtype=BF16, backend="torch")
    with pytest.raises(ValueError, match="got torch.bfloat16 operands"):
        ppo(*args, logits_dtype=torch.float16, backend="triton")
    h32, w32 = hidden.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    with pytest.raises(ValueError, match="got torch.float32 operands on the triton backend"):
        ppo(h32, w32, labels, old, adv, mask, logits_dtype=BF16, backend="triton")
    with pytest.raises(ValueError, match="on the torch backend"):
        pacs(hidden, weight, labels, old, torch.tensor([0.0, 1.0]), mask, [0, 0], logits_dtype=BF16, backend="torch")
    # the recompute path keeps fp32 logits: the same loss as without the option
    a, _ = ppo(*args, logits_dtype=BF16, backend="triton", grad_in_forward=False)
    e, _ = ppo(*args, backend="triton", grad_in_forward=False)
    torch.testing.assert_close(a, e)
