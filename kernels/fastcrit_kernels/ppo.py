"""PPO clipped policy loss, clipped value loss and verl's loss aggregation modes.

Aggregation (verl ``agg_loss``, one process), over a per-token loss L[B, T] and response mask m:
- ``token-mean``:              sum(m L) / sum(m)
- ``seq-mean-token-sum``:      mean over sequences with any valid token of sum_t(m L)
- ``seq-mean-token-mean``:     mean over such sequences of sum_t(m L) / (sum_t m + 1e-8)
- ``seq-mean-token-sum-norm``: ``seq-mean-token-sum`` / agg_scale (default T, the padded response
                               length; pass a constant to reproduce Dr. GRPO exactly)
Each mode is a per-row factor f[B] with loss = sum_bt m L f_b, so the fused kernels need only f.
Departure from verl: a batch with no valid token gives loss 0 (and gradient 0), not NaN.

Policy loss (verl ``compute_policy_loss_vanilla``): log-ratio clamped to [-20, 20], r = exp(.),
L = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); dual clip when ``clip_c`` is given (c > 1):
for A < 0, L = min(L, -A c). Stats: ``clipfrac`` = masked mean of [clipped term > unclipped term],
``clipfrac_lower`` = masked mean of [A < 0 and L > -A c] (0 without dual clip), ``approx_kl`` =
masked mean of (old_logp - logp) after the clamp. Gradient flows to ``logp`` only: ``old_logp``,
``advantages`` and ``mask`` are treated as constants.

Value loss (verl ``compute_value_loss``): 0.5 * agg(max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2));
``clipfrac`` = masked mean of [clipped term > unclipped term]. Gradient flows to ``values`` only.

Both paths (one Triton kernel; plain torch over chunks of rows, so its temporaries stay
chunk-sized) compute the per-token loss, the stats and the gradient in one pass over the tokens and
keep only the gradient ([B, T] float32) for backward; backward is one scaling by the upstream
scalar. Exact ties between the two branches of a max/min (measure zero) get the full gradient of
the chosen branch, where torch's max would split it in halves.
"""

from __future__ import annotations

import torch

from fastcrit_kernels._dispatch import Variant, device_guard, jit, resolve_backend, tl, triton

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
_BLOCK = 1024
_CHUNK = 1 << 18  # elements per row chunk on the torch path (fewer, larger ops: cheaper thread syncs)


@jit(do_not_specialize=("with_grad",))
def _ppo_fwd_kernel(
    lp_ptr,  # [N] logp (N = B * T, row-major)
    old_ptr,  # [N] old_logp
    adv_ptr,  # [N] advantages, or [B] per row if ADV_ROW
    mask_ptr,  # [N] float32 response mask
    rowf_ptr,  # [B] float32 aggregation factor per row
    grad_ptr,  # [N] float32 d loss / d logp (written if with_grad)
    part_ptr,  # [4, num_blocks] float32 partial sums: loss, clipped, lower, kl
    N,
    T,
    num_blocks,
    with_grad,  # a run-time flag: a uniform branch costs nothing here, and halves the variants
    clip_lo,
    clip_hi,
    clip_c,
    DUAL: tl.constexpr,
    ADV_ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    valid = offs < N
    row = offs // T
    lp = tl.load(lp_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    old = tl.load(old_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    if ADV_ROW:
        a = tl.load(adv_ptr + row, mask=valid, other=0.0).to(tl.float32)
    else:
        a = tl.load(adv_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    m = tl.load(mask_ptr + offs, mask=valid, other=0.0)
    f = tl.load(rowf_ptr + row, mask=valid, other=0.0)
    raw = lp - old
    d = tl.minimum(tl.maximum(raw, -20.0), 20.0)
    r = tl.exp(d)
    l1 = -a * r
    l2 = -a * tl.minimum(tl.maximum(r, 1.0 - clip_lo), 1.0 + clip_hi)
    clipped = l2 > l1
    loss = tl.where(clipped, l2, l1)
    dloss = tl.where(clipped | (raw < -20.0) | (raw > 20.0), 0.0, l1)  # d(-A r)/d lp = -A r
    lower = tl.zeros([BLOCK], dtype=tl.int1)
    if DUAL:
        l3 = -a * clip_c
        lower = (a < 0) & (loss > l3)
        loss = tl.where(lower, l3, loss)
        dloss = tl.where(lower, 0.0, dloss)
    w = m * f
    if with_grad:
        tl.store(grad_ptr + offs, w * dloss, mask=valid)
    tl.store(part_ptr + pid, tl.sum(w * loss))
    tl.store(part_ptr + num_blocks + pid, tl.sum(tl.where(clipped, m, 0.0)))
    tl.store(part_ptr + 2 * num_blocks + pid, tl.sum(tl.where(lower, m, 0.0)))
    tl.store(part_ptr + 3 * num_blocks + pid, tl.sum(-d * m))


@jit(do_not_specialize=("with_grad",))
def _value_fwd_kernel(
    v_ptr,  # [N] values
    vold_ptr,  # [N] old values
    ret_ptr,  # [N] returns
    mask_ptr,  # [N] float32 response mask
    rowf_ptr,  # [B] float32 aggregation factor per row (0.5 folded in)
    grad_ptr,  # [N] float32 d loss / d values (written if with_grad)
    part_ptr,  # [2, num_blocks] float32 partial sums: loss, clipped
    N,
    T,
    num_blocks,
    with_grad,  # run-time flag, as in _ppo_fwd_kernel
    clip,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    valid = offs < N
    v = tl.load(v_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    vo = tl.load(vold_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    R = tl.load(ret_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    m = tl.load(mask_ptr + offs, mask=valid, other=0.0)
    f = tl.load(rowf_ptr + offs // T, mask=valid, other=0.0)
    vc = tl.minimum(tl.maximum(v, vo - clip), vo + clip)
    e1 = v - R
    e2 = vc - R
    l1 = e1 * e1
    l2 = e2 * e2
    clipped = l2 > l1
    loss = tl.where(clipped, l2, l1)
    w = m * f
    if with_grad:
        # l2 > l1 only when v lies outside the clip interval, where vc has no gradient
        tl.store(grad_ptr + offs, tl.where(clipped, 0.0, 2.0 * e1) * w, mask=valid)
    tl.store(part_ptr + pid, tl.sum(w * loss))
    tl.store(part_ptr + num_blocks + pid, tl.sum(tl.where(clipped, m, 0.0)))


def _check_agg(agg: str, agg_scale) -> None:
    if agg not in AGG_MODES:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    if agg_scale is not None and not agg_scale > 0:
        raise ValueError(f"agg_scale must be > 0, got {agg_scale!r}")


def agg_row_factors(mask: torch.Tensor, agg: str, agg_scale=None, dtype=torch.float32) -> torch.Tensor:
    """Per-row factors f[B] (in ``dtype``) such that ``agg(L) = sum_bt mask_bt * L_bt * f_b``."""
    _check_agg(agg, agg_scale)
    m = mask.to(dtype)
    counts = m.sum(-1)
    zero = torch.zeros_like(counts)
    if agg == "token-mean":
        total = counts.sum()
        fac = torch.where(total > 0, 1.0 / torch.clamp(total, min=1e-30), torch.zeros_like(total))
        return fac.expand_as(counts).clone()
    live = counts > 0
    n_seq = torch.clamp(live.sum().to(dtype), min=1.0)
    if agg == "seq-mean-token-mean":
        per = 1.0 / ((counts + 1e-8) * n_seq)
    elif agg == "seq-mean-token-sum":
        per = torch.full_like(counts, 1.0) / n_seq
    else:
        scale = float(mask.shape[-1] if agg_scale is None else agg_scale)
        per = torch.full_like(counts, 1.0) / (n_seq * scale)
    return torch.where(live, per, zero)


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean", agg_scale=None):
    """Aggregate a per-token loss [B, T] into a scalar by verl's ``agg`` mode (differentiable)."""
    _check_2d("loss_mat", loss_mat)
    _check_same("mask", mask, loss_mat)
    dtype = torch.promote_types(loss_mat.dtype, torch.float32)
    f = agg_row_factors(mask, agg, agg_scale, dtype)
    return (loss_mat * mask.to(dtype) * f[:, None]).sum()


def _check_2d(name: str, t) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise ValueError(f"{name} must be a 2-D tensor [B, T], got {getattr(t, 'shape', type(t))}")


def _check_same(name: str, t, like: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.shape != like.shape:
        raise ValueError(f"{name} must have shape {tuple(like.shape)}, got {getattr(t, 'shape', type(t))}")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device}, expected {like.device}")


def _row_chunks(B: int, T: int):
    """Row slices of about _CHUNK elements: the torch path's temporaries are chunk-sized."""
    step = max(1, _CHUNK // max(T, 1))
    for r0 in range(0, B, step):
        yield slice(r0, min(B, r0 + step))


def _ppo_torch(lp, old, adv, mask, f, clip_lo, clip_hi, clip_c, with_grad):
    B, T = lp.shape
    grad = torch.empty(B, T, dtype=torch.float32, device=lp.device) if with_grad else None
    sums = torch.zeros(4, dtype=torch.float32, device=lp.device)
    for rows in _row_chunks(B, T):
        raw = lp[rows].float() - old[rows].float()
        a = adv[rows].float()
        a = a[:, None] if a.dim() == 1 else a
        m = mask[rows].to(torch.float32, copy=True)  # a fresh buffer: w is built in place
        d = raw.clamp(-20.0, 20.0)
        r = torch.exp(d)
        l1 = -a * r
        l2 = -a * r.clamp_(1.0 - clip_lo, 1.0 + clip_hi)
        clipped = l2 > l1
        loss = torch.where(clipped, l2, l1)
        dead = clipped
        if clip_c is not None:
            l3 = -a * clip_c
            lower = (a < 0) & (loss > l3)
            loss = torch.where(lower, l3, loss)
            dead = dead | lower
            sums[2] += (lower * m).sum()
        w = m.mul_(f[rows, None])
        if with_grad:
            dead = dead | (raw < -20.0) | (raw > 20.0)
            torch.mul(l1.masked_fill_(dead, 0.0), w, out=grad[rows])
        sums[0] += (w * loss).sum()
        m = mask[rows].to(torch.float32, copy=True)  # a fresh buffer: w is built in place
        sums[1] += (clipped * m).sum()
        sums[3] -= (d * m).sum()
    return sums, grad


def _value_torch(v, vo, R, mask, f, clip, with_grad):
    B, T = v.shape
    grad = torch.empty(B, T, dtype=torch.float32, device=v.device) if with_grad else None
    sums = torch.zeros(2, dtype=torch.float32, device=v.device)
    for rows in _row_chunks(B, T):
        vr, vor, Rr = v[rows].float(), vo[rows].float(), R[rows].float()
        m = mask[rows].to(torch.float32, copy=True)  # a fresh buffer: w is built in place
        e1 = vr - Rr
        e2 = torch.minimum(torch.maximum(vr, vor - clip), vor + clip).sub_(Rr)
        l1, l2 = e1 * e1, e2.mul_(e2)
        clipped = l2 > l1
        sums[1] += (clipped * m).sum()
        w = m.mul_(f[rows, None])
        if with_grad:
            torch.mul(e1.mul_(2.0).masked_fill_(clipped, 0.0), w, out=grad[rows])
        sums[0] += (w * torch.where(clipped, l2, l1)).sum()
    return sums, grad


def _launch_partials(kernel, args, n_sums: int, device, with_grad: bool, **meta):
    n = args[0].numel()
    num_blocks = triton.cdiv(max(n, 1), _BLOCK)
    part = torch.zeros(n_sums, num_blocks, dtype=torch.float32, device=device)
    grad = torch.empty(args[0].shape, dtype=torch.float32, device=device) if with_grad else part
    if n:
        T = args[0].shape[-1]
        with device_guard(args[0]):
            kernel[(num_blocks,)](
                *args, grad, part, n, T, num_blocks, int(with_grad), *meta.pop("scalars"), BLOCK=_BLOCK, **meta
            )
    return part.sum(-1), (grad if with_grad else None)


def _gpu_variants() -> list[Variant]:
    """Every compilation a GPU launch of this module can ask for, with the float inputs in one dtype
    (mixed dtypes compile the same code with other load types)."""
    out = []
    for dt in ("fp32", "bf16", "fp16"):
        for dual in (False, True):
            for adv_row in (False, True):
                out.append(
                    Variant.of(
                        _ppo_fwd_kernel,
                        dt,
                        dict(
                            lp_ptr=dt,
                            old_ptr=dt,
                            adv_ptr=dt,
                            mask_ptr="fp32",
                            rowf_ptr="fp32",
                            grad_ptr="fp32",
                            part_ptr="fp32",
                        ),
                        floats=("clip_lo", "clip_hi", "clip_c"),
                        constexprs=dict(DUAL=dual, ADV_ROW=adv_row, BLOCK=_BLOCK),
                    )
                )
        out.append(
            Variant.of(
                _value_fwd_kernel,
                dt,
                dict(
                    v_ptr=dt,
                    vold_ptr=dt,
                    ret_ptr=dt,
                    mask_ptr="fp32",
                    rowf_ptr="fp32",
                    grad_ptr="fp32",
                    part_ptr="fp32",
                ),
                floats=("clip",),
                constexprs=dict(BLOCK=_BLOCK),
            )
        )
    return out


def _masked_stats(sums: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    n_tok = mask.sum(dtype=torch.float32)
    return torch.where(n_tok > 0, sums / torch.clamp(n_tok, min=1e-30), torch.zeros_like(sums))


def ppo_sums_and_grad(logp, old_logp, adv, mask, rowf, clip_lo, clip_hi, clip_c, backend, with_grad):
    """One pass of the policy loss over [B, T] (contiguous) inputs, ``rowf`` [B] the factors of
    ``agg_row_factors``: (float32 [4] sums of w L, m [clipped], m [lower], -m d; float32 [B, T]
    d loss / d logp or None). Shared with the grad-in-forward path of ``fused_linear_ppo_loss``."""
    if backend == "triton":
        return _launch_partials(
            _ppo_fwd_kernel,
            (logp, old_logp, adv, mask.to(torch.float32).contiguous(), rowf),
            4,
            logp.device,
            with_grad,
            scalars=(float(clip_lo), float(clip_hi), float(clip_c or 0.0)),
            DUAL=clip_c is not None,
            ADV_ROW=adv.dim() == 1,
        )
    return _ppo_torch(logp, old_logp, adv, mask, rowf, clip_lo, clip_hi, clip_c, with_grad)


class _PPOPolicyLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, old_logp, adv, mask, rowf, clip_lo, clip_hi, clip_c, backend):
        with_grad = ctx.needs_input_grad[0]
        sums, grad = ppo_sums_and_grad(logp, old_logp, adv, mask, rowf, clip_lo, clip_hi, clip_c, backend, with_grad)
        ctx.save_for_backward(grad if with_grad else None)
        ctx.lp_dtype = logp.dtype
        stats = _masked_stats(sums[1:4], mask)
        ctx.mark_non_differentiable(stats)
        return sums[0].clone(), stats

    @staticmethod
    def backward(ctx, grad_loss, _grad_stats):
        (grad,) = ctx.saved_tensors
        if grad is None:
            return (None,) * 9
        return (grad * grad_loss).to(ctx.lp_dtype), None, None, None, None, None, None, None, None


class _ValueLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, old_values, returns, mask, rowf, clip, backend):
        with_grad = ctx.needs_input_grad[0]
        if backend == "triton":
            sums, grad = _launch_partials(
                _value_fwd_kernel,
                (values, old_values, returns, mask.to(torch.float32).contiguous(), rowf),
                2,
                values.device,
                with_grad,
                scalars=(float(clip),),
            )
        else:
            sums, grad = _value_torch(values, old_values, returns, mask, rowf, clip, with_grad)
        ctx.save_for_backward(grad if with_grad else None)
        ctx.v_dtype = values.dtype
        clipfrac = _masked_stats(sums[1], mask)
        ctx.mark_non_differentiable(clipfrac)
        return sums[0].clone(), clipfrac

    @staticmethod
    def backward(ctx, grad_loss, _grad_stats):
        (grad,) = ctx.saved_tensors
        if grad is None:
            return (None,) * 7
        return (grad * grad_loss).to(ctx.v_dtype), None, None, None, None, None, None


def check_policy_inputs(logp, old_logp, advantages, mask, clip_low, clip_high, clip_c) -> None:
    """``ppo_policy_loss``'s argument checks (shared with ``fused_linear_ppo_loss``)."""
    _check_2d("logp", logp)
    _check_same("old_logp", old_logp, logp)
    _check_same("mask", mask, logp)
    if not (isinstance(advantages, torch.Tensor) and advantages.dim() == 1 and advantages.shape[0] == logp.shape[0]):
        _check_same("advantages", advantages, logp)
    if not logp.is_floating_point():
        raise ValueError(f"logp must be floating point, got {logp.dtype}")
    if clip_low < 0 or clip_low >= 1:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if clip_c is not None and not clip_c > 1.0:
        raise ValueError(f"clip_c (dual clip) must be > 1, got {clip_c}")


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    agg: str = "token-mean",
    agg_scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss (verl vanilla), see the module docstring for the exact math.

    Args:
        logp: [B, T] log-probs of the sampled tokens under the current policy (gets the gradient).
        old_logp: [B, T] log-probs under the policy that sampled them.
        advantages: [B, T] per-token advantages, or [B] per-sequence (broadcast over T).
        mask: [B, T] response mask (bool / int / float 0-1).
        clip_low, clip_high: ratio clip range [1 - clip_low, 1 + clip_high] (DAPO clip-higher).
        clip_c: dual-clip constant (> 1) for negative advantages; None disables dual clip (verl's
            actor always applies it, with ``clip_ratio_c=3.0`` by default: pass 3.0 to match).
        agg: aggregation mode (``AGG_MODES``); agg_scale: divisor for ``seq-mean-token-sum-norm``.
        backend: ``auto`` | ``triton`` | ``torch``.
    Returns:
        (loss: float32 scalar, stats: dict of detached float32 scalars ``clipfrac``,
        ``clipfrac_lower``, ``approx_kl``).
    """
    check_policy_inputs(logp, old_logp, advantages, mask, clip_low, clip_high, clip_c)
    rowf = agg_row_factors(mask, agg, agg_scale)
    chosen = resolve_backend(backend, logp)
    loss, stats = _PPOPolicyLoss.apply(
        logp.contiguous(),
        old_logp.contiguous(),
        advantages.contiguous(),
        mask,
        rowf,
        clip_low,
        clip_high,
        clip_c,
        chosen,
    )
    return loss, {"clipfrac": stats[0], "clipfrac_lower": stats[1], "approx_kl": stats[2]}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float = 0.5,
    agg: str = "token-mean",
    agg_scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss 0.5 * agg(max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)).

    Args:
        values: [B, T] critic predictions (gets the gradient); old_values: [B, T] predictions at
        rollout time; returns: [B, T] targets; mask: [B, T] response mask.
        clip: value clip range c (>= 0); agg, agg_scale: as ``ppo_policy_loss``.
    Returns:
        (loss: float32 scalar, stats: dict with detached float32 ``clipfrac``).
    """
    _check_2d("values", values)
    _check_same("old_values", old_values, values)
    _check_same("returns", returns, values)
    _check_same("mask", mask, values)
    if not values.is_floating_point():
        raise ValueError(f"values must be floating point, got {values.dtype}")
    if clip is None or clip < 0:
        raise ValueError(f"clip must be >= 0, got {clip}")
    rowf = agg_row_factors(mask, agg, agg_scale) * 0.5
    chosen = resolve_backend(backend, values)
    loss, clipfrac = _ValueLoss.apply(
        values.contiguous(), old_values.contiguous(), returns.contiguous(), mask, rowf, clip, chosen
    )
    return loss, {"clipfrac": clipfrac}
