"""Hidden states straight to a scalar RL loss, never materialising the [B, T, V] logits.

Two ways to the same values (verl semantics, exactly those of the unfused path "full logits ->
log_softmax -> gather -> loss"):

Grad in forward (the default whenever a gradient is wanted). The upstream gradient of every
token's log-prob and entropy is known inside the forward: PPO/GRPO's per-token loss (clipped
surrogate, dual clip, KL penalty of every kind, entropy bonus) depends on that token alone, and
every ``agg`` mode is ``sum_bt m L f_b`` with row factors f that depend on the mask only
(``agg_row_factors``). So the forward runs over chunks of tokens; per chunk:

    z  = (h W^T + b) / T                      GEMM 1: [n, H] x [H, V], the chunk's logits only
    log p, log p(label), entropy              one fused log-softmax over the [n, V] buffer
    g_lp, g_ent = dL/dlogp, dL/dentropy       per token, from the loss terms (no [n, V] work)
    dz = g_lp (onehot - p) - g_ent p (log p + H), all / T       in the same buffer
    d_hidden[chunk] = dz W                    GEMM 2
    d_W += dz^T h ,  d_b += sum dz            GEMM 3

That is three [N, H] x [H, V]-sized products for forward + backward, as for the unfused path,
whose memory for the logits is replaced by one [n, V] chunk (``chunk_bytes``). The gradients are
kept until ``backward``, which multiplies them by the upstream scalar: any linear use of the loss
(scaling, summing with other losses) is exact. Departures: double backward is not supported, nor
is calling backward twice through the same graph (``retain_graph``); the gradients of
hidden, weight and bias are held from the forward on (a loss computed for logging only should be
computed under ``torch.no_grad()`` or with ``grad_in_forward=False``); only tokens with
``mask != 0`` are computed at all (padding costs nothing).

PACS: a token's upstream gradient ``c_i m_t`` depends, through its sequence's log-ratio sum, the
group advantage (RLOO / GRPO) and the BCE, on every token of its group, so it is known only after
the logits of the whole group have been through the softmax. Chunks therefore hold whole groups:
where a group's tokens fit the chunk (``chunk_bytes``), its scores, hence c, are known before the
gradient GEMMs of that chunk, from the same buffer: three products. A group larger than one chunk
takes two passes over its tokens in chunks (logits and log-probs; then logits again, d_logits and
the gradient GEMMs): four products for those tokens. (d_hidden alone could be formed in the first
pass as c_i (u_t W) with u_t = onehot - p; d_W = sum_t c_i u_t^T h_t needs c inside the sum, so
its u_t would have to be kept or recomputed: recomputed here.)

Recompute (``grad_in_forward=False``, or no gradient wanted): ``fused_logprobs`` (vocab chunks,
online log-sum-exp, the logits recomputed in its backward: four products) and then the element-wise
losses of this package on the [B, T] log-probs; an ordinary autograd graph. For PPO it does not
sync with the host on a GPU (PACS's syncs once, as ``pacs_loss`` does); the grad-in-forward path
syncs once per call (the number of valid tokens, and for PACS the group sizes, decide the chunks).

On a GPU (backend ``triton``) the GEMMs are torch's (cuBLAS, following torch's own TF32 setting;
``FASTCRIT_KERNELS_ALLOW_TF32`` reaches the recompute path only) and the element-wise work is two
Triton kernels per chunk: softmax statistics over vocab splits, and d_logits written in place (fp32)
or into a bf16/fp16 buffer that feeds both gradient GEMMs with fp32 accumulation. bf16/fp16
weights: the logits GEMM needs ``torch.mm(..., out_dtype=torch.float32)`` (torch >= 2.8), else
the recompute path is taken; d_W accumulates over token chunks in fp32 ([V, H] fp32, twice the
weight's size) and is rounded once. ``logits_dtype=torch.bfloat16`` (or float16) keeps the
chunk's logits as the 16-bit GEMM writes them instead of fp32 (the precision of an unfused bf16
model's logits; d_logits then overwrites them): the element-wise passes move 8 bytes per logit
instead of 14, and a chunk holds three times the tokens. This GPU path's tests pass on an H100
(torch 2.11, triton 3.6); why its chunk sizes are what they are is beside ``GPU_CHUNK_BYTES_16BIT``
(``_fused_linear_chunks.py``, where the chunks, the kernels and the autograd function live); its
kernels are also compile-checked
for sm_80 / sm_90a, and its launches tested under the Triton interpreter, where the bf16/fp16
products go through fp32 copies instead of ``out_dtype``. Masked tokens may hold any label
(padding).
"""

from __future__ import annotations

import torch

from fastcrit_kernels._fused_linear_chunks import (
    _IGNORE,
    _check_labels,
    _chunk_tokens,
    _Chunks,
    _even_chunks,
    _flag_nan,
    _grad_path,
    _GradInForward,
    _logits16,
    _pack,
)

# The chunk sizes are re-exported (`X as X`): the entry points' docstrings name them as their defaults.
from fastcrit_kernels._fused_linear_chunks import CPU_CHUNK_BYTES as CPU_CHUNK_BYTES
from fastcrit_kernels._fused_linear_chunks import GPU_CHUNK_BYTES as GPU_CHUNK_BYTES
from fastcrit_kernels._fused_linear_chunks import GPU_CHUNK_BYTES_16BIT as GPU_CHUNK_BYTES_16BIT
from fastcrit_kernels.advantages import ESTIMATORS
from fastcrit_kernels.kl import KL_KINDS, _kl_torch, kl_penalty
from fastcrit_kernels.logprobs import fused_logprobs
from fastcrit_kernels.pacs import WEIGHT_MODES, _pacs_group_torch, pacs_inputs, pacs_loss
from fastcrit_kernels.ppo import (
    agg_row_factors,
    aggregate_loss,
    check_policy_inputs,
    ppo_policy_loss,
    ppo_sums_and_grad,
)


# ----------------------------------------------------------------------------------------------
# PPO / GRPO
# ----------------------------------------------------------------------------------------------
class _PPOHead:
    """Per-token upstream gradients of PPO/GRPO and the loss's partial sums, one chunk at a time:
    the policy term by ``ppo_policy_loss``'s own pass (tokens as rows, their agg factors as the
    row factors), the KL by ``kl_penalty``'s torch math, the entropy term linear."""

    def __init__(self, tok, *, clip, kl_coef, kl_kind, entropy_coef, backend):
        self.tok, self.clip, self.backend = tok, clip, backend
        self.kl_coef, self.kl_code, self.ent_coef = kl_coef, KL_KINDS[kl_kind], entropy_coef
        # pg_loss, entropy agg, kl agg, m [clipped], m [lower], -m d
        self.sums = torch.zeros(6, dtype=torch.float32, device=tok["m"].device)

    def __call__(self, sl, lp):
        t = {k: v[sl] for k, v in self.tok.items() if v is not None}
        lp, w = lp.float(), t["m"] * t["f"]
        col = lambda x: x[:, None].contiguous()
        sums, g = ppo_sums_and_grad(
            col(lp), col(t["old"]), col(t["adv"]), col(t["m"]), t["f"].contiguous(), *self.clip, self.backend, True
        )
        self.sums[0] += sums[0]
        self.sums[3:] += sums[1:]
        g_lp = g[:, 0]
        if "ref" in t:
            kl, dkl = _kl_torch(lp, t["ref"], self.kl_code, self.kl_coef != 0.0)
            self.sums[2] += (kl * w).sum()
            if self.kl_coef != 0.0:
                g_lp = g_lp + (self.kl_coef * w) * dkl
        return g_lp, (w * -self.ent_coef if self.ent_coef != 0.0 else None)

    def entropy(self, sl, ent):
        self.sums[1] += (ent.float() * self.tok["m"][sl] * self.tok["f"][sl]).sum()


def fused_linear_ppo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "low_var_kl",
    entropy_coef: float = 0.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    agg: str = "token-mean",
    agg_scale: float | None = None,
    temperature: float = 1.0,
    bias: torch.Tensor | None = None,
    grad_in_forward: bool | None = None,
    chunk_bytes: int | None = None,
    backend: str = "auto",
    entropy: bool = True,
    logits_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO/GRPO actor loss from hidden states (verl ``dp_actor`` composition).

        loss = agg(L_clip(logp, old_logp, A), mask)
               - entropy_coef * agg(entropy, mask)
               + kl_coef * agg(kl_penalty(logp, ref_logp, kl_kind), mask)

    Args:
        hidden: [B, T, H] final hidden states of the response tokens' predecessors.
        weight: [V, H] lm_head; labels: [B, T] sampled token ids (any value where mask == 0).
        old_logp: [B, T] rollout log-probs; advantages: [B, T] or [B]; mask: [B, T] response mask.
        ref_logp: [B, T] reference log-probs, needed when ``kl_coef != 0``.
        kl_kind, clip_low, clip_high, clip_c, agg, agg_scale: as ``kl_penalty`` / ``ppo_policy_loss``.
            A per-token weight w > 0 of the policy term (truncated importance sampling) enters
            as advantages * w, [B, T] (for w > 0 that is the weighted loss, clip fractions unchanged).
        temperature, bias: as ``fused_logprobs``; backend: ``auto`` | ``triton`` | ``torch``.
        grad_in_forward: compute the gradients in the forward (three GEMMs; see the module
            docstring); default: whenever a gradient is wanted. False: the recompute path.
        chunk_bytes: logits per chunk on the grad-in-forward path (default ``CPU_CHUNK_BYTES``,
            512 MiB; on a GPU ``GPU_CHUNK_BYTES``, 512 MiB, for fp32 and ``GPU_CHUNK_BYTES_16BIT``,
            2 GiB, for bf16 / fp16); the recompute path takes ``fused_logprobs``'.
        entropy: compute the entropy (the ``entropy`` stat). False, with ``entropy_coef == 0``,
            leaves it out, as verl's actor update does (``calculate_entropy = entropy_coeff !=
            0``): the torch path then skips a pass over every block of logits.
        logits_dtype: None (default): each chunk's logits are the exact fp32 products of the
            operands. ``torch.bfloat16`` / ``torch.float16``, with operands of that dtype on the
            triton backend (else ValueError): the logits as the 16-bit GEMM writes them (rounded
            once, as an unfused bf16 model's logits are in verl or Liger); the softmax statistics
            and d_logits are computed from them in fp32, d_logits is written in their place, and a
            chunk holds three times the tokens at the same ``chunk_bytes``: less memory traffic.
            The recompute path (``grad_in_forward=False``, no gradient wanted, or a torch without
            ``out_dtype`` on a GPU) keeps fp32.
    Returns:
        (loss scalar fp32, stats of detached scalars: ``pg_loss``, ``entropy`` (agg of the
        entropy; not with ``entropy=False``), ``kl`` (agg of the KL; only with ``ref_logp``),
        ``clipfrac``, ``clipfrac_lower``, ``approx_kl``).
    """
    lab, B, T = _masked_labels(hidden, labels, mask)
    _check_bt("old_logp", old_logp, B, T)
    if kl_kind not in KL_KINDS:
        raise ValueError(f"kl_kind must be one of {sorted(KL_KINDS)}, got {kl_kind!r}")
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef != 0 needs ref_logp [B, T]")
    if ref_logp is not None:
        _check_bt("ref_logp", ref_logp, B, T)
    if not entropy and entropy_coef != 0.0:
        raise ValueError(f"entropy=False leaves the entropy out, but entropy_coef={entropy_coef} needs it")
    path = _grad_path(grad_in_forward, hidden, weight, bias, backend)
    z16 = _logits16(logits_dtype, path)
    if path is None:
        return _ppo_recompute(
            hidden,
            weight,
            lab,
            old_logp,
            advantages,
            mask,
            ref_logp,
            kl_coef,
            kl_kind,
            entropy_coef,
            clip_low,
            clip_high,
            clip_c,
            agg,
            agg_scale,
            temperature,
            bias,
            backend,
            entropy,
        )
    check_policy_inputs(old_logp, old_logp, advantages, mask, clip_low, clip_high, clip_c)
    which, h2, w2 = path
    idx, row = _pack(mask)
    rowf = agg_row_factors(mask, agg, agg_scale)[row]
    pick = lambda x: None if x is None else x.reshape(-1)[idx]
    m = pick(mask).to(torch.float32)
    tok = dict(
        old=pick(old_logp),
        adv=advantages[row] if advantages.dim() == 1 else pick(advantages),
        m=m,
        f=rowf,
        ref=pick(ref_logp),
    )
    safe, bad = _check_labels(lab.reshape(-1)[idx], w2.shape[0])
    chunk = _chunk_tokens(chunk_bytes, w2.shape[0], h2, z16)
    segments = _even_chunks(idx.numel(), chunk)
    head = _PPOHead(
        tok,
        clip=(clip_low, clip_high, clip_c),
        kl_coef=kl_coef,
        kl_kind=kl_kind,
        entropy_coef=entropy_coef,
        backend=which,
    )

    def compute(need_h, need_w, need_b):
        run = _Chunks(h2[idx], w2, bias, safe, 1.0 / float(temperature), chunk, which, (need_h, need_w, need_b), z16)
        run.run(segments, head, with_ent=entropy)
        s = head.sums  # pg_loss, entropy agg, kl agg, then m [clipped], m [lower], -m d
        loss = s[0] - entropy_coef * s[1] if entropy_coef != 0.0 else s[0].clone()
        if kl_coef != 0.0:
            loss = loss + kl_coef * s[2]
        n_valid = m.sum()
        frac = torch.where(n_valid > 0, s[3:] / torch.clamp(n_valid, min=1e-30), torch.zeros_like(s[3:]))
        return _flag_nan(loss, bad), torch.cat([s[:3], frac]), run.grads(hidden, weight, bias, idx)

    loss, st = _GradInForward.apply(hidden, weight, bias, compute)
    stats = {"pg_loss": st[0], "entropy": st[1]} if entropy else {"pg_loss": st[0]}
    if ref_logp is not None:
        stats["kl"] = st[2]
    stats.update(clipfrac=st[3], clipfrac_lower=st[4], approx_kl=st[5])
    return loss, stats


def _ppo_recompute(
    hidden,
    weight,
    lab,
    old_logp,
    advantages,
    mask,
    ref_logp,
    kl_coef,
    kl_kind,
    entropy_coef,
    clip_low,
    clip_high,
    clip_c,
    agg,
    agg_scale,
    temperature,
    bias,
    backend,
    entropy,
):
    """fused_logprobs (logits recomputed in its backward), then the [B, T] losses."""
    out = fused_logprobs(
        hidden,
        weight,
        lab,
        temperature=temperature,
        bias=bias,
        return_entropy=entropy,
        ignore_index=_IGNORE,
        backend=backend,
    )
    logp, ent = out if entropy else (out, None)
    logp = logp.float()
    pg_loss, pstats = ppo_policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=clip_c,
        agg=agg,
        agg_scale=agg_scale,
        backend=backend,
    )
    loss, stats = pg_loss, {"pg_loss": pg_loss.detach()}
    if entropy_coef != 0.0:
        ent_agg = aggregate_loss(ent.float(), mask, agg, agg_scale)
        loss = loss - entropy_coef * ent_agg
    elif entropy:
        with torch.no_grad():
            ent_agg = aggregate_loss(ent.float(), mask, agg, agg_scale)
    if entropy:
        stats["entropy"] = ent_agg.detach()
    if ref_logp is not None:
        kl_agg = aggregate_loss(
            kl_penalty(logp, ref_logp.to(logp.dtype), kl_kind, backend=backend), mask, agg, agg_scale
        )
        if kl_coef != 0.0:
            loss = loss + kl_coef * kl_agg
        stats["kl"] = kl_agg.detach()
    stats.update(pstats)
    return loss, stats


# ----------------------------------------------------------------------------------------------
# PACS
# ----------------------------------------------------------------------------------------------
class _PACSHead:
    """Per-group upstream gradients c_i m_t and the loss's partial sums of PACS, whole groups at a
    time (``pacs_loss``'s torch math on the segment's samples)."""

    def __init__(self, tok, rows, *, beta, method, est, norm_by_std, eps, wmode, B):
        self.tok, self.rows, self.B = tok, rows, B
        self.opts = (beta, method, est, norm_by_std, eps, wmode)
        dev = tok["m"].device
        self.loss = torch.zeros((), dtype=torch.float32, device=dev)
        self.sums = torch.zeros(3, dtype=torch.float32, device=dev)  # r, A, [A > 0] == y

    def __call__(self, key, lp):
        (p0, p1, t0, t1, g0, n_groups) = key
        beta, method, est, norm_by_std, eps, wmode = self.opts
        m, old, loc = self.tok["m"][t0:t1], self.tok["old"][t0:t1], self.tok["pos"][t0:t1] - p0
        x = lp.float() if method == "2" else lp.float() - old
        rsum = torch.zeros(p1 - p0, dtype=torch.float32, device=m.device).index_add_(0, loc, m * x)
        cnt = self.rows["cnt"][p0:p1]
        if method == "1":
            inv_len = torch.ones_like(cnt)
        else:
            inv_len = torch.where(cnt > 0, 1.0 / torch.clamp(cnt, min=1e-30), torch.zeros_like(cnt))
        r = beta * rsum * inv_len
        y = self.rows["y"][p0:p1]
        adv, per, dr = _pacs_group_torch(
            r, y, self.rows["inv"][p0:p1] - g0, n_groups, est, norm_by_std, eps, wmode, self.B
        )
        self.loss += per.sum()
        self.sums += torch.stack([r.sum(), adv.sum(), ((adv > 0).float() == y).float().sum()])
        return (beta * dr * inv_len)[loc] * m, None


def _pacs_segments(inv_sorted, n_sorted, chunk):
    """Whole groups packed into segments of at most ``chunk`` tokens (a larger group alone), from
    the samples' group ids and valid-token counts in group order: [(t0, t1, key)] with key
    (p0, p1, t0, t1, first group id, number of groups), p a sample range in group order."""
    inv_l, n_l = inv_sorted.tolist(), n_sorted.tolist()
    segs = []  # [p0, p1, t0, t1]
    p0 = t0 = 0
    while p0 < len(inv_l):
        p1 = p0
        while p1 < len(inv_l) and inv_l[p1] == inv_l[p0]:
            p1 += 1
        n = sum(n_l[p0:p1])
        if segs and segs[-1][1] == p0 and segs[-1][3] - segs[-1][2] + n <= chunk:
            segs[-1][1], segs[-1][3] = p1, segs[-1][3] + n
        else:
            segs.append([p0, p1, t0, t0 + n])
        p0, t0 = p1, t0 + n
    return [(t0, t1, (p0, p1, t0, t1, inv_l[p0], inv_l[p1 - 1] - inv_l[p0] + 1)) for p0, p1, t0, t1 in segs]


def fused_linear_pacs_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
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
    temperature: float = 1.0,
    bias: torch.Tensor | None = None,
    grad_in_forward: bool | None = None,
    chunk_bytes: int | None = None,
    backend: str = "auto",
    logits_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PACS loss from hidden states: ``pacs_loss(fused_logprobs(hidden, weight, labels), ...)``.

    Args:
        hidden: [B, T, H]; weight: [V, H]; labels, old_logp, mask: [B, T]; scores: [B] 0/1 labels;
        index: [B] group id per sample. The rest as ``pacs_loss`` and ``fused_logprobs``.
        grad_in_forward, chunk_bytes, logits_dtype: as ``fused_linear_ppo_loss``. Chunks hold
            whole groups: a group with more valid tokens than one chunk holds takes two passes
            (four GEMMs).
    Returns:
        (loss scalar fp32, stats of ``pacs_loss``: ``reward_mean``, ``advantage_mean``, ``accuracy``).
    """
    lab, B, T = _masked_labels(hidden, labels, mask)
    _check_bt("old_logp", old_logp, B, T)
    path = _grad_path(grad_in_forward, hidden, weight, bias, backend)
    z16 = _logits16(logits_dtype, path)
    if path is None:
        logp = fused_logprobs(
            hidden, weight, lab, temperature=temperature, bias=bias, ignore_index=_IGNORE, backend=backend
        )
        return pacs_loss(
            logp.float(),
            old_logp,
            scores,
            mask,
            index,
            beta=beta,
            reward_method=reward_method,
            estimator=estimator,
            weight_mode=weight_mode,
            norm_by_std=norm_by_std,
            eps=eps,
            backend=backend,
        )
    which, h2, w2 = path
    y, not_01, inv, _ = pacs_inputs(B, scores, index, reward_method, estimator, weight_mode, mask.device)
    order = torch.argsort(inv, stable=True)  # samples by group
    idx, row = _pack(mask, order)
    pos = torch.empty_like(order)
    pos[order] = torch.arange(B, device=order.device)
    mf = mask.to(torch.float32)
    rows = dict(y=y[order], inv=inv[order], cnt=mf.sum(-1)[order])
    tok = dict(m=mf.reshape(-1)[idx], old=old_logp.reshape(-1)[idx].float(), pos=pos[row])
    safe, bad = _check_labels(lab.reshape(-1)[idx], w2.shape[0])
    chunk = _chunk_tokens(chunk_bytes, w2.shape[0], h2, z16)
    segments = _pacs_segments(rows["inv"], (mask != 0)[order].sum(-1), chunk)
    head = _PACSHead(
        tok,
        rows,
        beta=float(beta),
        method=str(reward_method),
        est=ESTIMATORS[estimator],
        norm_by_std=bool(norm_by_std),
        eps=float(eps),
        wmode=WEIGHT_MODES[weight_mode],
        B=B,
    )

    def compute(need_h, need_w, need_b):
        run = _Chunks(h2[idx], w2, bias, safe, 1.0 / float(temperature), chunk, which, (need_h, need_w, need_b), z16)
        run.run(segments, head, with_ent=False)
        return _flag_nan(head.loss.clone(), not_01, bad), head.sums / B, run.grads(hidden, weight, bias, idx)

    loss, st = _GradInForward.apply(hidden, weight, bias, compute)
    return loss, {"reward_mean": st[0], "advantage_mean": st[1], "accuracy": st[2]}


# ----------------------------------------------------------------------------------------------
# Shared checks
# ----------------------------------------------------------------------------------------------
def _check_bt(name, t, B, T):
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != (B, T):
        raise ValueError(f"{name} must have shape [B={B}, T={T}], got {tuple(getattr(t, 'shape', ()))}")


def _masked_labels(hidden, labels, mask):
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
        raise ValueError(f"hidden must be [B, T, H], got {tuple(getattr(hidden, 'shape', ()))}")
    B, T, _ = hidden.shape
    _check_bt("labels", labels, B, T)
    _check_bt("mask", mask, B, T)
    keep = mask.bool() if mask.dtype == torch.bool else mask != 0
    return torch.where(keep, labels.long(), torch.full_like(labels, _IGNORE, dtype=torch.long)), B, T
