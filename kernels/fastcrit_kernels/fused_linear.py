"""Hidden states straight to a scalar RL loss, never materialising the [B, T, V] logits.

Both composites run ``fused_logprobs`` (the only O(tokens x V) work, done in vocab chunks with an
online log-sum-exp and recomputed in the backward) and then the element-wise losses of this package
(``ppo_policy_loss``, ``kl_penalty``, ``aggregate_loss``, ``pacs_loss``) on the [B, T] log-probs.
So the values are exactly those of the unfused path "full logits -> log_softmax -> gather -> loss"
with verl semantics, and the memory is that of ``fused_logprobs`` plus a few [B, T] tensors.

Departure from a fully fused kernel (e.g. Liger's chunked GRPO loss, which computes gradients in its
forward): the logits are computed twice (forward and recompute in backward), one matmul more than
the unfused path; in exchange the loss is an ordinary autograd graph (any upstream gradient, any
mix with other losses, ``backward`` called once by the caller).

Tokens with ``mask == 0`` are passed to ``fused_logprobs`` as ignored, so their labels may be any
value (padding) and they receive no gradient.
"""
from __future__ import annotations

import torch

from fastcrit_kernels.kl import KL_KINDS, kl_penalty
from fastcrit_kernels.logprobs import fused_logprobs
from fastcrit_kernels.pacs import pacs_loss
from fastcrit_kernels.ppo import aggregate_loss, ppo_policy_loss

_IGNORE = -100


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
    backend: str = "auto",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO/GRPO actor loss from hidden states (verl ``dp_actor`` composition).

        loss = ppo_policy_loss(logp, old_logp, A, mask, agg)
               - entropy_coef * agg(entropy, mask)
               + kl_coef * agg(kl_penalty(logp, ref_logp, kl_kind), mask)

    Args:
        hidden: [B, T, H] final hidden states of the response tokens' predecessors.
        weight: [V, H] lm_head; labels: [B, T] sampled token ids (any value where mask == 0).
        old_logp: [B, T] rollout log-probs; advantages: [B, T] or [B]; mask: [B, T] response mask.
        ref_logp: [B, T] reference log-probs, needed when ``kl_coef != 0``.
        kl_kind, clip_low, clip_high, clip_c, agg, agg_scale: as ``kl_penalty`` / ``ppo_policy_loss``.
        temperature, bias: as ``fused_logprobs``; backend: ``auto`` | ``triton`` | ``torch``.
    Returns:
        (loss scalar fp32, stats of detached scalars: ``pg_loss``, ``entropy`` (agg of the
        entropy), ``kl`` (agg of the KL; only with ``ref_logp``), ``clipfrac``, ``clipfrac_lower``,
        ``approx_kl``).
    """
    lab, B, T = _masked_labels(hidden, labels, mask)
    _check_bt("old_logp", old_logp, B, T)
    if kl_kind not in KL_KINDS:
        raise ValueError(f"kl_kind must be one of {sorted(KL_KINDS)}, got {kl_kind!r}")
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef != 0 needs ref_logp [B, T]")
    if ref_logp is not None:
        _check_bt("ref_logp", ref_logp, B, T)
    logp, ent = fused_logprobs(hidden, weight, lab, temperature=temperature, bias=bias,
                               return_entropy=True, ignore_index=_IGNORE, backend=backend)
    logp = logp.float()
    pg_loss, pstats = ppo_policy_loss(logp, old_logp, advantages, mask, clip_low=clip_low,
                                      clip_high=clip_high, clip_c=clip_c, agg=agg,
                                      agg_scale=agg_scale, backend=backend)
    loss = pg_loss
    if entropy_coef != 0.0:
        ent_agg = aggregate_loss(ent.float(), mask, agg, agg_scale)
        loss = loss - entropy_coef * ent_agg
    else:
        with torch.no_grad():
            ent_agg = aggregate_loss(ent.float(), mask, agg, agg_scale)
    stats = {"pg_loss": pg_loss.detach(), "entropy": ent_agg.detach()}
    if ref_logp is not None:
        kl_agg = aggregate_loss(kl_penalty(logp, ref_logp.to(logp.dtype), kl_kind, backend=backend),
                                mask, agg, agg_scale)
        if kl_coef != 0.0:
            loss = loss + kl_coef * kl_agg
        stats["kl"] = kl_agg.detach()
    stats.update(pstats)
    return loss, stats


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
    temperature: float = 1.0,
    bias: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PACS loss from hidden states: ``pacs_loss(fused_logprobs(hidden, weight, labels), ...)``.

    Args:
        hidden: [B, T, H]; weight: [V, H]; labels, old_logp, mask: [B, T]; scores: [B] 0/1 labels;
        index: [B] group id per sample. The rest as ``pacs_loss`` and ``fused_logprobs``.
    Returns:
        (loss scalar fp32, stats of ``pacs_loss``: ``reward_mean``, ``advantage_mean``, ``accuracy``).
    """
    lab, B, T = _masked_labels(hidden, labels, mask)
    _check_bt("old_logp", old_logp, B, T)
    logp = fused_logprobs(hidden, weight, lab, temperature=temperature, bias=bias,
                          ignore_index=_IGNORE, backend=backend)
    return pacs_loss(logp.float(), old_logp, scores, mask, index, beta=beta,
                     reward_method=reward_method, estimator=estimator, weight_mode=weight_mode,
                     backend=backend)
