"""Outcome advantage estimators, chosen by name. Pure tensor math over fastcrit_kernels."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fastcrit_kernels import broadcast_to_tokens, group_advantages

ESTIMATORS = ("grpo", "rloo")


def outcome_advantages(
    name: str, scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor, *, norm_by_std: bool = True
) -> torch.Tensor:
    """Sequence scores [B] + group ids [B] -> token advantages [B, R] (0 on masked tokens).

    grpo: (s - mean) / (std + 1e-6) per group (unbiased std; a group of one keeps its raw score);
    rloo: n/(n-1) (s - mean) per group (loop version: a group of one keeps its raw score).
    """
    if name not in ESTIMATORS:
        raise ValueError(f"algorithm.name: unknown advantage estimator {name!r} (known: {ESTIMATORS})")
    adv = group_advantages(scores.float(), group_ids, name, norm_by_std=norm_by_std)
    return broadcast_to_tokens(adv, response_mask)


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over response tokens (verl's ``compute_gae_advantage_return``).

    token_rewards, values, mask: [B, R]. Masked positions are skipped: the next valid token's value
    and advantage carry across them, and the value after the last valid token is 0.
    Returns (advantages, returns) [B, R], both 0 on masked tokens; returns = advantages + values.
    """
    B, R = token_rewards.shape
    adv = torch.zeros_like(token_rewards, dtype=torch.float32)
    next_value = torch.zeros(B, dtype=torch.float32, device=token_rewards.device)
    last = torch.zeros(B, dtype=torch.float32, device=token_rewards.device)
    m = mask.float()
    for t in reversed(range(R)):
        delta = token_rewards[:, t].float() + gamma * next_value - values[:, t].float()
        cur = delta + gamma * lam * last
        next_value = torch.where(m[:, t] > 0, values[:, t].float(), next_value)
        last = torch.where(m[:, t] > 0, cur, last)
        adv[:, t] = cur * m[:, t]
    returns = (adv + values.float()) * m
    return adv, returns


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, all_sum: Callable[[list[float]], list[float]] | None = None
) -> torch.Tensor:
    """x, mask: [B, R] -> [B, R]: (x - mean) * rsqrt(var + eps) on the valid tokens, 0 elsewhere
    (verl's ``masked_whiten``: var = the mean squared deviation times n / (n - 1), the unbiased one).

    ``all_sum`` sums a list of floats over the processes that hold the rest of the batch (e.g.
    ``fastcrit.train.dist.all_reduce``): mean and variance are then those of every process's valid
    tokens together, as verl whitens the whole batch on its driver. Two calls (the sum and count,
    then the squared deviations); sums in float64. Where verl raises (n <= 1) the variance here is
    0: a single token whitens to 0, no token leaves the batch as zeros."""
    total = all_sum or (lambda v: v)
    m, xd = mask.double(), x.double()
    s, n = total([float((xd * m).sum()), float(m.sum())])
    mean = s / max(n, 1.0)
    (ss,) = total([float(((xd - mean) ** 2 * m).sum())])
    var = ss / max(n - 1.0, 1.0)
    return ((xd - mean) * (var + eps) ** -0.5 * m).to(x.dtype)


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """[B] the position of each row's last nonzero mask entry, any padding side (the last position
    for an empty row, which callers skip): where a sequence reward sits and a reward model reads."""
    return mask.shape[1] - 1 - (mask != 0).flip(1).int().argmax(1)
