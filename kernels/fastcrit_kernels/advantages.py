"""Sequence-level group advantages (GRPO, RLOO, naive) for outcome rewards.

Groups are given by an integer id per sample; ids need not be contiguous, sorted or dense, and
groups may have any size. Semantics (verl ``core_algos`` loop versions, v0.9):
- ``grpo``:  A = (s - mean) / (std + eps) with the unbiased std (``norm_by_std=False``: A = s - mean).
             A group of one has mean 0 and std 1, so A = s / (1 + eps) (verl's exact arithmetic).
- ``rloo``:  A = n / (n - 1) * (s - mean) = s - mean of the others, for n > 1; a group of one keeps
             its raw score (verl's vectorised RLOO gives 0 there; we follow the loop version).
- ``naive``: A = s, the raw score unchanged. This is PACS's ``compute_naive_advantage`` (verl has no
             estimator of that name; its REINFORCE++ whitens over the batch, which is not this).
No gradient flows through ``group_advantages`` (scores are rewards); ``pacs_loss`` has its own
differentiable group step.
"""

from __future__ import annotations

import torch

from fastcrit_kernels._dispatch import Variant, device_guard, jit, resolve_backend, tl
from fastcrit_kernels._reference import ref_group_advantages as ref_group_advantages  # re-exported for callers

ESTIMATORS = {"grpo": 1, "rloo": 2, "naive": 3}
_BLOCK = 128


@jit
def _group_adv_kernel(
    s_ptr,  # [B] scores (any float dtype)
    perm_ptr,  # [B] int64 sample indices sorted by group
    start_ptr,  # [G + 1] int64 segment offsets into perm
    out_ptr,  # [B] float32 advantages
    eps,
    EST: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK: tl.constexpr,
):
    g = tl.program_id(0)
    lo = tl.load(start_ptr + g)
    hi = tl.load(start_ptr + g + 1)
    n = hi - lo
    nf = n.to(tl.float32)
    total = tl.zeros((), dtype=tl.float32)
    for off in range(lo, hi, BLOCK):
        j = off + tl.arange(0, BLOCK)
        jm = j < hi
        idx = tl.load(perm_ptr + j, mask=jm, other=0)
        total += tl.sum(tl.load(s_ptr + idx, mask=jm, other=0.0).to(tl.float32))
    mean = total / nf
    sq = tl.zeros((), dtype=tl.float32)
    if EST == 1:
        if NORM:
            for off in range(lo, hi, BLOCK):
                j = off + tl.arange(0, BLOCK)
                jm = j < hi
                idx = tl.load(perm_ptr + j, mask=jm, other=0)
                dev = tl.load(s_ptr + idx, mask=jm, other=0.0).to(tl.float32) - mean
                sq += tl.sum(tl.where(jm, dev * dev, 0.0))
    std = tl.sqrt(sq / tl.maximum(nf - 1.0, 1.0))
    single = n == 1
    for off in range(lo, hi, BLOCK):
        j = off + tl.arange(0, BLOCK)
        jm = j < hi
        idx = tl.load(perm_ptr + j, mask=jm, other=0)
        s = tl.load(s_ptr + idx, mask=jm, other=0.0).to(tl.float32)
        if EST == 1:
            centred = tl.where(single, s, s - mean)
            if NORM:
                a = centred / (tl.where(single, 1.0, std) + eps)
            else:
                a = centred
        elif EST == 2:
            a = tl.where(single, s, (s - mean) * (nf / tl.maximum(nf - 1.0, 1.0)))
        else:
            a = s
        tl.store(out_ptr + idx, a, mask=jm)


def group_ids(index, batch: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Dense group ids [B] int64 in [0, G) and G, from any per-sample ids.

    ``index`` may be an integer tensor, or a numpy array / list of hashables (e.g. verl's uid
    strings); samples with equal ids form a group.
    """
    if isinstance(index, torch.Tensor):
        if index.dim() != 1 or index.shape[0] != batch:
            raise ValueError(f"index must have shape [{batch}], got {tuple(index.shape)}")
        if index.is_floating_point() or index.is_complex():
            raise ValueError(f"index must hold integer group ids, got dtype {index.dtype}")
        _, inv = torch.unique(index.to(device), return_inverse=True)
        return inv.long(), int(inv.max().item()) + 1 if batch else 0
    # Any sequence of hashables (list, tuple, numpy array of uid strings): plain Python, so the
    # package needs nothing beyond torch and triton. Group numbering is by first appearance.
    if getattr(index, "ndim", 1) != 1 or len(index) != batch:
        shape = getattr(index, "shape", (len(index),))
        raise ValueError(f"index must have shape [{batch}], got {tuple(shape)}")
    dense: dict = {}
    try:
        ids = [dense.setdefault(x, len(dense)) for x in index]
    except TypeError as e:
        raise ValueError(f"index entries must be hashable group ids: {e}") from None
    inv = torch.tensor(ids, dtype=torch.long, device=device)
    return inv, len(dense)


def group_segments(inv: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(perm [B], starts [G + 1], counts [G]): samples sorted by group id and each group's slice."""
    perm = torch.argsort(inv, stable=True)
    counts = torch.bincount(inv, minlength=num_groups)
    starts = torch.zeros(num_groups + 1, dtype=torch.long, device=inv.device)
    starts[1:] = torch.cumsum(counts, 0)
    return perm, starts, counts


def _group_mean_std(s: torch.Tensor, inv: torch.Tensor, num_groups: int):
    """Per-sample group size, group mean and unbiased group std (0 for groups of one), float32."""
    counts = torch.bincount(inv, minlength=num_groups).to(s.dtype)
    sums = torch.zeros(num_groups, dtype=s.dtype, device=s.device).index_add_(0, inv, s)
    mean = (sums / counts)[inv]
    dev = s - mean
    sq = torch.zeros(num_groups, dtype=s.dtype, device=s.device).index_add_(0, inv, dev * dev)
    n = counts[inv]
    std = torch.sqrt(sq[inv] / torch.clamp(n - 1, min=1))
    return n, mean, std


def _group_advantages_torch(s, inv, num_groups, est, norm_by_std, eps):
    if est == 3:
        return s.clone()
    n, mean, std = _group_mean_std(s, inv, num_groups)
    single = n == 1
    if est == 2:
        return torch.where(single, s, (s - mean) * (n / torch.clamp(n - 1, min=1)))
    centred = torch.where(single, s, s - mean)
    if not norm_by_std:
        return centred
    return centred / (torch.where(single, torch.ones_like(std), std) + eps)


def _norm_flag(est: int, norm_by_std: bool) -> bool:
    """NORM matters to GRPO only; fixing it elsewhere halves the compiled variants."""
    return bool(norm_by_std) and est == ESTIMATORS["grpo"]


def _gpu_variants() -> list[Variant]:
    """Every compilation a GPU launch of this module can ask for."""
    return [
        Variant.of(
            _group_adv_kernel,
            dt,
            dict(s_ptr=dt, perm_ptr="i64", start_ptr="i64", out_ptr="fp32"),
            floats=("eps",),
            constexprs=dict(EST=est, NORM=norm, BLOCK=_BLOCK),
        )
        for dt in ("fp32", "bf16", "fp16")
        for est in sorted(ESTIMATORS.values())
        for norm in sorted({_norm_flag(est, False), _norm_flag(est, True)})
    ]


def group_advantages(
    scores: torch.Tensor,
    index,
    estimator: str = "grpo",
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    backend: str = "auto",
) -> torch.Tensor:
    """Sequence-level advantages [B] of outcome scores within groups (see module docstring).

    Args:
        scores: [B] float outcome score per sample (e.g. the sum of its token rewards).
        index: [B] group id per sample: an integer tensor, or a numpy array / list of hashables.
        estimator: ``grpo`` | ``rloo`` | ``naive``.
        norm_by_std: GRPO only; divide by (std + eps) (verl ``norm_adv_by_std_in_grpo``).
        eps: GRPO only; added to the std.
        backend: ``auto`` | ``triton`` | ``torch``.
    Returns:
        [B] advantages, float32 (float64 for float64 scores). No autograd graph.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}, got {estimator!r}")
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point() or scores.dim() != 1:
        raise ValueError("scores must be a 1-D floating-point tensor [B]")
    B = scores.shape[0]
    out_dtype = torch.promote_types(scores.dtype, torch.float32)
    if B == 0:
        return torch.empty(0, dtype=out_dtype, device=scores.device)
    inv, G = group_ids(index, B, scores.device)
    chosen = resolve_backend(backend, scores)
    est = ESTIMATORS[estimator]
    with torch.no_grad():
        if chosen == "torch":
            return _group_advantages_torch(scores.to(out_dtype), inv, G, est, norm_by_std, eps)
        perm, starts, _ = group_segments(inv, G)
        out = torch.empty(B, dtype=torch.float32, device=scores.device)
        with device_guard(scores):
            _group_adv_kernel[(G,)](
                scores.contiguous(),
                perm,
                starts,
                out,
                float(eps),
                EST=est,
                NORM=_norm_flag(est, norm_by_std),
                BLOCK=_BLOCK,
            )
        return out.to(out_dtype)


def broadcast_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] sequence advantages -> [B, T] token advantages, zero where ``mask`` is 0 (verl's
    ``scores.unsqueeze(-1) * response_mask``)."""
    if advantages.dim() != 1:
        raise ValueError(f"advantages must be [B], got shape {tuple(advantages.shape)}")
    if mask.dim() != 2 or mask.shape[0] != advantages.shape[0]:
        raise ValueError(f"mask must be [B={advantages.shape[0]}, T], got shape {tuple(mask.shape)}")
    return advantages[:, None] * mask.to(advantages.dtype)
