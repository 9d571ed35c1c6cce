"""Outcome advantage estimators, chosen by name. Pure tensor math over fastcrit_kernels."""
from __future__ import annotations

import torch

from fastcrit_kernels import broadcast_to_tokens, group_advantages

ESTIMATORS = ("grpo", "rloo")


def outcome_advantages(name: str, scores: torch.Tensor, group_ids: torch.Tensor,
                       response_mask: torch.Tensor, *, norm_by_std: bool = True) -> torch.Tensor:
    """Sequence scores [B] + group ids [B] -> token advantages [B, R] (0 on masked tokens).

    grpo: (s - mean) / (std + 1e-6) per group (unbiased std; a group of one keeps its raw score);
    rloo: n/(n-1) (s - mean) per group (loop version: a group of one keeps its raw score).
    """
    if name not in ESTIMATORS:
        raise ValueError(f"algorithm.name: unknown advantage estimator {name!r} (known: {ESTIMATORS})")
    adv = group_advantages(scores.float(), group_ids, name, norm_by_std=norm_by_std)
    return broadcast_to_tokens(adv, response_mask)
