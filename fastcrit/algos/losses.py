"""Policy losses for the RL recipes: PPO clipped objective + KL to a reference + entropy bonus."""
from __future__ import annotations

import torch

from fastcrit_kernels import aggregate_loss, kl_penalty, ppo_policy_loss


def policy_objective(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor, *, clip_low: float, clip_high: float, clip_c: float | None,
                     agg: str, ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0,
                     kl_kind: str = "low_var_kl", entropy: torch.Tensor | None = None,
                     entropy_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """All [B, R]. Returns the scalar loss to minimise and detached float stats.

    loss = pg_loss + kl_coef * agg(kl(logp, ref_logp)) - entropy_coef * agg(entropy), with the same
    aggregation for every term (verl's use_kl_loss form: KL as a loss term, not in the reward).
    """
    pg_loss, stats = ppo_policy_loss(logp, old_logp, advantages, mask, clip_low=clip_low,
                                     clip_high=clip_high, clip_c=clip_c, agg=agg)
    loss = pg_loss
    out = {"loss/policy": pg_loss.item()}
    out.update({f"actor/{k}": float(v) for k, v in stats.items()})
    if ref_logp is not None and kl_coef != 0.0:
        kl = aggregate_loss(kl_penalty(logp, ref_logp, kl_kind), mask, agg)
        loss = loss + kl_coef * kl
        out["kl/mean"] = kl.item()
    if entropy is not None:
        ent = aggregate_loss(entropy, mask, agg)
        out["actor/entropy"] = ent.item()
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * ent
    return loss, out
