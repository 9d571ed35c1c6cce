"""The coefficient of PPO's KL penalty in the reward, fixed or adapted towards a target KL (verl's
``FixedKLController`` / ``AdaptiveKLController``, Ziegler et al. 2019). Pure math: the caller
measures the step's KL over all ranks and keeps the coefficient (and checkpoints it)."""

from __future__ import annotations

import torch

KL_CONTROLLERS = ("fixed", "adaptive")


def kl_row_means(kl: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """kl, mask: [B, R] -> [B] each row's mean KL over its valid tokens (0 for a row without one).
    The step's measured KL is the mean of these over all rows (verl's ``apply_kl_penalty``)."""
    m = mask.double()
    return (kl.double() * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def next_kl_coef(coef: float, kl: float, n_seqs: float, *, ctrl: str, target: float, horizon: float) -> float:
    """The coefficient for the next step after one with KL ``kl`` over ``n_seqs`` sequences:
    fixed: ``coef``; adaptive: ``coef * (1 + clip(kl / target - 1, -0.2, 0.2) * n_seqs / horizon)``."""
    if ctrl not in KL_CONTROLLERS:
        raise ValueError(f"algorithm.kl_ctrl: unknown controller {ctrl!r} (known: {KL_CONTROLLERS})")
    if ctrl == "fixed":
        return coef
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * n_seqs / horizon)
