"""PACS loss: the policy's log-likelihood ratio as a score, trained by BCE against 0/1 outcomes.

PACS ("Implicit Actor Critic Coupling via a Supervised Learning Framework for RLVR",
``pacs_core_algos.py``), generalised to groups given by an id per sample:
1. per-sample reward (the "logit"): ``reward_method="1"``: r = beta * sum_t m (logp - old_logp);
   ``"2"``: r = beta * sum_t m logp / sum_t m. PACS sums over the whole padded row; we sum over the
   response mask. A row with no valid token gets r = 0 and no gradient (PACS would give NaN for "2").
2. advantage of r within each group by ``estimator``: ``rloo`` / ``grpo`` / ``naive`` with exactly
   the semantics of ``group_advantages`` (groups of one: RLOO keeps r, GRPO gives r / (1 + eps),
   where PACS's fixed-size reshape would divide by zero) — but differentiable wrt r, hence wrt logp.
   GRPO where a group's rewards are all equal (std 0, e.g. at the first step, where logp == old_logp):
   the gradient term through the std is taken as its limit 0 (autograd of ``torch.std`` gives NaN).
3. loss = mean over the B samples of w_b * BCEWithLogits(A_b, y_b) (torch's ``weight=`` semantics:
   the mean divides by B, not by the sum of weights), with w from ``weight_mode``:
   ``None``: 1; ``question``: in a group holding both labels, w = n / (2 n_c) for the sample's class c
   (sklearn's "balanced" weights, as PACS), groups with one label get 1; ``only_positive``: w = y;
   ``only_negative``: w = 1 - y (PACS's ``compute_weight``).
Gradient flows to ``logp`` only (``old_logp`` and the scores are constants).

The fused path: one kernel reduces each row to (sum, count); one program per group computes the
advantages, the weighted BCE and d loss / d r in one go; backward is one broadcast kernel
grad[b, t] = upstream * m[b, t] * coef[b]. Nothing of size [B, T] is kept beyond the mask.
"""

from __future__ import annotations

import torch

from fastcrit_kernels._dispatch import Variant, check_on_host, device_guard, jit, resolve_backend, tl, triton
from fastcrit_kernels.advantages import ESTIMATORS, _norm_flag, group_ids, group_segments
from fastcrit_kernels.ppo import _row_chunks

REWARD_METHODS = ("1", "2")
WEIGHT_MODES = {None: 0, "question": 1, "only_positive": 2, "only_negative": 3}
_BLOCK_T = 1024
_BLOCK_G = 128
_BLOCK = 1024


@jit
def _row_reduce_kernel(
    lp_ptr,  # [B, T] logp
    old_ptr,  # [B, T] old_logp (read only if RATIO)
    mask_ptr,  # [B, T] float32 mask
    sum_ptr,  # [B] float32 sum_t m (lp - old) or sum_t m lp
    cnt_ptr,  # [B] float32 sum_t m
    T,
    RATIO: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    base = row.to(tl.int64) * T
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    cnt = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, T, BLOCK):
        t = off + tl.arange(0, BLOCK)
        tm = t < T
        m = tl.load(mask_ptr + base + t, mask=tm, other=0.0)
        x = tl.load(lp_ptr + base + t, mask=tm, other=0.0).to(tl.float32)
        if RATIO:
            x = x - tl.load(old_ptr + base + t, mask=tm, other=0.0).to(tl.float32)
        acc += m * x
        cnt += m
    tl.store(sum_ptr + row, tl.sum(acc))
    tl.store(cnt_ptr + row, tl.sum(cnt))


@jit(do_not_specialize=("wmode",))
def _pacs_group_kernel(
    r_ptr,  # [B] float32 per-sample reward (logit)
    y_ptr,  # [B] float32 label in {0, 1}
    perm_ptr,  # [B] int64 sample indices sorted by group
    start_ptr,  # [G + 1] int64 segment offsets into perm
    adv_ptr,  # [B] float32 advantage (out)
    loss_ptr,  # [B] float32 w * bce / B (out)
    dr_ptr,  # [B] float32 d loss / d r (out)
    inv_b,  # 1 / B
    eps,
    wmode,  # weight mode (WEIGHT_MODES), a run-time value: a select per sample, 4x fewer variants
    EST: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK: tl.constexpr,
):
    g = tl.program_id(0)
    lo = tl.load(start_ptr + g)
    hi = tl.load(start_ptr + g + 1)
    nf = (hi - lo).to(tl.float32)
    single = (hi - lo) == 1
    total = tl.zeros((), dtype=tl.float32)
    npos = tl.zeros((), dtype=tl.float32)
    for off in range(lo, hi, BLOCK):
        j = off + tl.arange(0, BLOCK)
        jm = j < hi
        idx = tl.load(perm_ptr + j, mask=jm, other=0)
        total += tl.sum(tl.load(r_ptr + idx, mask=jm, other=0.0))
        npos += tl.sum(tl.load(y_ptr + idx, mask=jm, other=0.0))
    mean = tl.where(single, 0.0, total / nf)
    sq = tl.zeros((), dtype=tl.float32)
    if EST == 1:
        for off in range(lo, hi, BLOCK):
            j = off + tl.arange(0, BLOCK)
            jm = j < hi
            idx = tl.load(perm_ptr + j, mask=jm, other=0)
            dev = tl.load(r_ptr + idx, mask=jm, other=0.0) - mean
            sq += tl.sum(tl.where(jm, dev * dev, 0.0))
    std = tl.where(single, 1.0, tl.sqrt(sq / tl.maximum(nf - 1.0, 1.0)))
    if EST == 1:
        if NORM:
            scale = 1.0 / (std + eps)
        else:
            scale = 1.0
    elif EST == 2:
        scale = tl.where(single, 1.0, nf / tl.maximum(nf - 1.0, 1.0))
    else:
        scale = 1.0
    # pass 3: advantages, weighted BCE, upstream g = d loss / d A, and the group sums of g, g (r - mean)
    gsum = tl.zeros((), dtype=tl.float32)
    gdev = tl.zeros((), dtype=tl.float32)
    for off in range(lo, hi, BLOCK):
        j = off + tl.arange(0, BLOCK)
        jm = j < hi
        idx = tl.load(perm_ptr + j, mask=jm, other=0)
        r = tl.load(r_ptr + idx, mask=jm, other=0.0)
        y = tl.load(y_ptr + idx, mask=jm, other=0.0)
        if EST == 3:
            a = r
        else:
            a = (r - mean) * scale
        both = (npos > 0) & (npos < nf)
        n_c = tl.where(y > 0.5, npos, nf - npos)
        balanced = tl.where(both, nf / (2.0 * tl.maximum(n_c, 1.0)), 1.0)
        w = tl.where(wmode == 1, balanced, tl.where(wmode == 2, y, tl.where(wmode == 3, 1.0 - y, 1.0)))
        bce = tl.maximum(a, 0.0) - a * y + tl.log(1.0 + tl.exp(-tl.abs(a)))
        sig = 1.0 / (1.0 + tl.exp(-a))
        gg = tl.where(jm, w * (sig - y) * inv_b, 0.0)
        tl.store(adv_ptr + idx, a, mask=jm)
        tl.store(loss_ptr + idx, w * bce * inv_b, mask=jm)
        tl.store(dr_ptr + idx, gg, mask=jm)
        gsum += tl.sum(gg)
        gdev += tl.sum(gg * (r - mean))
    # pass 4: d loss / d r from d loss / d A through the group statistics
    if EST != 3:
        gmean = tl.where(single, 0.0, gsum / nf)
        coef_std = 0.0
        if EST == 1:
            if NORM:
                live = (sq > 0) & (nf > 1.0)
                den = tl.maximum((nf - 1.0) * std * (std + eps) * (std + eps), 1e-30)
                coef_std = tl.where(live, gdev / den, 0.0)
        for off in range(lo, hi, BLOCK):
            j = off + tl.arange(0, BLOCK)
            jm = j < hi
            idx = tl.load(perm_ptr + j, mask=jm, other=0)
            r = tl.load(r_ptr + idx, mask=jm, other=0.0)
            gg = tl.load(dr_ptr + idx, mask=jm, other=0.0)
            dr = (gg - gmean) * scale - (r - mean) * coef_std
            tl.store(dr_ptr + idx, dr, mask=jm)


@jit
def _pacs_bwd_kernel(
    mask_ptr,  # [N] float32 mask (N = B * T)
    coef_ptr,  # [B] float32 per-row coefficient d loss / d logp[b, t] / m[b, t]
    go_ptr,  # [1] upstream gradient
    grad_ptr,  # [N] gradient wrt logp (out)
    N,
    T,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < N
    m = tl.load(mask_ptr + offs, mask=valid, other=0.0)
    c = tl.load(coef_ptr + offs // T, mask=valid, other=0.0)
    go = tl.load(go_ptr).to(tl.float32)
    tl.store(grad_ptr + offs, (go * m * c).to(grad_ptr.dtype.element_ty), mask=valid)


def _pacs_group_torch(r, y, inv, G, est, norm_by_std, eps, wmode, B):
    """Advantage, weighted per-sample BCE / B and d loss / d r, vectorised over groups."""

    def gsum(x):
        return torch.zeros(G, dtype=x.dtype, device=x.device).index_add_(0, inv, x)

    n = gsum(torch.ones_like(r))[inv]
    single = n == 1
    mean = torch.where(single, torch.zeros_like(r), gsum(r)[inv] / n)
    dev = r - mean
    sq = gsum(dev * dev)[inv]
    std = torch.where(single, torch.ones_like(r), torch.sqrt(sq / torch.clamp(n - 1, min=1)))
    if est == 1:
        scale = 1.0 / (std + eps) if norm_by_std else torch.ones_like(r)
    elif est == 2:
        scale = torch.where(single, torch.ones_like(r), n / torch.clamp(n - 1, min=1))
    else:
        scale = torch.ones_like(r)
    adv = r.clone() if est == 3 else dev * scale
    if wmode == 1:
        npos = gsum(y)[inv]
        n_c = torch.where(y > 0.5, npos, n - npos)
        both = (npos > 0) & (npos < n)
        w = torch.where(both, n / (2.0 * torch.clamp(n_c, min=1.0)), torch.ones_like(r))
    elif wmode == 2:
        w = y.clone()
    elif wmode == 3:
        w = 1.0 - y
    else:
        w = torch.ones_like(r)
    bce = torch.clamp(adv, min=0) - adv * y + torch.log1p(torch.exp(-adv.abs()))
    per = w * bce / B
    g = w * (torch.sigmoid(adv) - y) / B
    if est == 3:
        return adv, per, g
    gmean = torch.where(single, torch.zeros_like(r), gsum(g)[inv] / n)
    dr = (g - gmean) * scale
    if est == 1 and norm_by_std:
        gdev = gsum(g * dev)[inv]
        live = (sq > 0) & ~single
        den = torch.clamp(torch.clamp(n - 1, min=1) * std * (std + eps) ** 2, min=1e-30)
        coef = torch.where(live, gdev / den, torch.zeros_like(r))
        dr = dr - dev * coef
    return adv, per, dr


class _PACSLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, old_logp, y, mask, inv, G, beta, method, est, norm_by_std, eps, wmode, backend):
        B, T = logp.shape
        ratio = method == "1"
        if backend == "triton":
            mask_f = mask.to(torch.float32).contiguous()
            rsum = torch.empty(B, dtype=torch.float32, device=logp.device)
            cnt = torch.empty(B, dtype=torch.float32, device=logp.device)
            if B:
                with device_guard(logp):
                    _row_reduce_kernel[(B,)](logp, old_logp, mask_f, rsum, cnt, T, RATIO=ratio, BLOCK=_BLOCK_T)
        else:
            mask_f = mask  # any dtype; converted chunk by chunk
            rsum = torch.empty(B, dtype=torch.float32, device=logp.device)
            cnt = torch.empty(B, dtype=torch.float32, device=logp.device)
            for rows in _row_chunks(B, T):
                m = mask[rows].float()
                x = logp[rows].float() - old_logp[rows].float() if ratio else logp[rows].float()
                if x.is_cuda:  # a CUDA matmul may run in TF32 (set_float32_matmul_precision): too coarse here
                    rsum[rows] = (x * m).sum(-1)
                else:  # row dot products x . m in one pass (batched BLAS dot), no [rows, T] product buffer
                    rsum[rows] = torch.bmm(x.unsqueeze(1), m.unsqueeze(2)).view(-1)
                cnt[rows] = m.sum(-1)
        if ratio:
            r, inv_len = beta * rsum, torch.ones_like(cnt)
        else:
            inv_len = torch.where(cnt > 0, 1.0 / torch.clamp(cnt, min=1e-30), torch.zeros_like(cnt))
            r = beta * rsum * inv_len
        if backend == "triton":
            perm, starts, _ = group_segments(inv, G)
            adv, per, dr = (torch.empty(B, dtype=torch.float32, device=logp.device) for _ in range(3))
            with device_guard(logp):
                _pacs_group_kernel[(G,)](
                    r.contiguous(),
                    y,
                    perm,
                    starts,
                    adv,
                    per,
                    dr,
                    1.0 / B,
                    float(eps),
                    wmode,
                    EST=est,
                    NORM=_norm_flag(est, norm_by_std),
                    BLOCK=_BLOCK_G,
                )
        else:
            adv, per, dr = _pacs_group_torch(r, y, inv, G, est, norm_by_std, eps, wmode, B)
        ctx.save_for_backward(mask_f, beta * dr * inv_len)
        ctx.backend, ctx.lp_dtype = backend, logp.dtype
        stats = torch.stack([r.mean(), adv.mean(), ((adv > 0).float() == y).float().mean()])
        ctx.mark_non_differentiable(stats)
        return per.sum(), stats

    @staticmethod
    def backward(ctx, grad_loss, _grad_stats):
        mask_f, coef = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return (None,) * 13
        if ctx.backend == "triton":
            grad = torch.empty(mask_f.shape, dtype=ctx.lp_dtype, device=mask_f.device)
            n = mask_f.numel()
            if n:
                go = grad_loss.reshape(1).to(torch.float32).contiguous()
                with device_guard(mask_f):
                    _pacs_bwd_kernel[(triton.cdiv(n, _BLOCK),)](
                        mask_f, coef, go, grad, n, mask_f.shape[1], BLOCK=_BLOCK
                    )
        else:
            grad = torch.empty(mask_f.shape, dtype=ctx.lp_dtype, device=mask_f.device)
            c = coef * grad_loss.float()
            for rows in _row_chunks(*mask_f.shape):
                torch.mul(mask_f[rows], c[rows, None], out=grad[rows])
        return (grad,) + (None,) * 12


def _gpu_variants() -> list[Variant]:
    """Every compilation a GPU launch of this module can ask for (the group kernel sees fp32 only)."""
    out = []
    for dt in ("fp32", "bf16", "fp16"):
        for ratio in (False, True):
            out.append(
                Variant.of(
                    _row_reduce_kernel,
                    dt,
                    dict(lp_ptr=dt, old_ptr=dt, mask_ptr="fp32", sum_ptr="fp32", cnt_ptr="fp32"),
                    constexprs=dict(RATIO=ratio, BLOCK=_BLOCK_T),
                )
            )
        out.append(
            Variant.of(
                _pacs_bwd_kernel,
                dt,
                dict(mask_ptr="fp32", coef_ptr="fp32", go_ptr="fp32", grad_ptr=dt),
                constexprs=dict(BLOCK=_BLOCK),
            )
        )
    for est in sorted(ESTIMATORS.values()):
        for norm in sorted({_norm_flag(est, False), _norm_flag(est, True)}):
            out.append(
                Variant.of(
                    _pacs_group_kernel,
                    "fp32",
                    dict(
                        r_ptr="fp32",
                        y_ptr="fp32",
                        perm_ptr="i64",
                        start_ptr="i64",
                        adv_ptr="fp32",
                        loss_ptr="fp32",
                        dr_ptr="fp32",
                    ),
                    floats=("inv_b", "eps"),
                    constexprs=dict(EST=est, NORM=norm, BLOCK=_BLOCK_G),
                )
            )
    return out


def pacs_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    scores: torch.Tensor,
    mask: torch.Tensor,
    index,
    *,
    beta: float = 1.0,
    reward_method: str = "1",
    estimator: str = "rloo",
    weight_mode: str | None = None,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    backend: str = "auto",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PACS loss (see the module docstring for the exact math and departures from PACS's code).

    Args:
        logp: [B, T] log-probs of the sampled tokens under the current policy (gets the gradient).
        old_logp: [B, T] log-probs under the rollout policy (used by reward_method "1").
        scores: [B] outcome labels, each exactly 0 or 1.
        mask: [B, T] response mask; index: [B] group id per sample (tensor, array or list).
        beta: reward scale; reward_method: "1" | "2"; estimator: "rloo" | "grpo" | "naive";
        weight_mode: None | "question" | "only_positive" | "only_negative";
        norm_by_std, eps: GRPO estimator options, as ``group_advantages``.
        backend: ``auto`` | ``triton`` | ``torch``.
    Returns:
        (loss: float32 scalar, stats: dict of detached float32 scalars ``reward_mean``,
        ``advantage_mean`` and ``accuracy`` = fraction of samples with (A > 0) == label).
        Scores other than 0/1 raise on CPU; on a GPU that check would add a device sync, so it runs
        only with ``FASTCRIT_KERNELS_VALIDATE=1`` and such scores otherwise give a NaN loss. (The
        group count still costs one sync per call on a GPU: the launch grid needs it.)
    """
    if not isinstance(logp, torch.Tensor) or logp.dim() != 2 or not logp.is_floating_point():
        raise ValueError(f"logp must be a 2-D float tensor [B, T], got {getattr(logp, 'shape', type(logp))}")
    for name, t in (("old_logp", old_logp), ("mask", mask)):
        if not isinstance(t, torch.Tensor) or t.shape != logp.shape:
            raise ValueError(f"{name} must have shape {tuple(logp.shape)}, got {getattr(t, 'shape', type(t))}")
    y, not_01, inv, G = pacs_inputs(logp.shape[0], scores, index, reward_method, estimator, weight_mode, logp.device)
    chosen = resolve_backend(backend, logp)
    loss, stats = _PACSLoss.apply(
        logp.contiguous(),
        old_logp.contiguous(),
        y,
        mask,
        inv,
        G,
        float(beta),
        str(reward_method),
        ESTIMATORS[estimator],
        bool(norm_by_std),
        float(eps),
        WEIGHT_MODES[weight_mode],
        chosen,
    )
    if not_01 is not None:  # unchecked on the GPU: a score other than 0/1 gives a NaN loss
        loss = torch.where(not_01.any(), float("nan"), loss)
    return loss, {"reward_mean": stats[0], "advantage_mean": stats[1], "accuracy": stats[2]}


def pacs_inputs(B: int, scores, index, reward_method, estimator, weight_mode, device):
    """The checks of ``pacs_loss``'s non-log-prob arguments, shared with ``fused_linear_pacs_loss``.
    Returns (labels y [B] float32, a [B] mask of scores other than 0/1 or None when they were
    checked on the host, dense group ids [B], number of groups)."""
    if not isinstance(scores, torch.Tensor) or scores.shape != (B,):
        raise ValueError(f"scores must be a tensor of shape [{B}], got {getattr(scores, 'shape', type(scores))}")
    reward_method = str(reward_method)
    if reward_method not in REWARD_METHODS:
        raise ValueError(f"reward_method must be one of {REWARD_METHODS}, got {reward_method!r}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}, got {estimator!r}")
    if weight_mode not in WEIGHT_MODES:
        raise ValueError(f"weight_mode must be one of {list(WEIGHT_MODES)}, got {weight_mode!r}")
    y = scores.to(torch.float32).to(device).contiguous()
    not_01 = (y != 0) & (y != 1)
    if check_on_host(y):  # on a GPU only with FASTCRIT_KERNELS_VALIDATE=1: it costs a device sync
        if bool(not_01.any()):
            raise ValueError(f"scores must be 0 or 1 (PACS labels), got values such as {y[not_01][:3].tolist()}")
        not_01 = None
    if B == 0:
        raise ValueError("pacs_loss needs at least one sample (B = 0)")
    inv, G = group_ids(index, B, device)
    return y, not_01, inv, G
