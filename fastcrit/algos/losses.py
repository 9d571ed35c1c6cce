"""Policy losses for the RL recipes, and the objectives ``train.actor.update_policy`` minimises.

An objective turns one micro-batch's log-probs into a scalar loss and float stats, and says how
micro-batch losses combine into the mini-batch loss (``agg``) and whether its samples must stay with
their group (a loss that couples a group's samples, as PACS's advantages of log-prob ratios do).
"""

from __future__ import annotations

from typing import Protocol

import torch

from fastcrit.config import AlgorithmConfig, PACSConfig
from fastcrit.types import RolloutBatch
from fastcrit_kernels import aggregate_loss, group_advantages, kl_penalty, pacs_loss, ppo_policy_loss


def policy_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
    agg: str,
    agg_scale: float | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = AlgorithmConfig.kl_kind,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """All [B, R] (``advantages`` may be [B]). Returns the scalar loss to minimise and detached
    float stats.

    loss = agg(w * pg) + kl_coef * agg(kl(logp, ref_logp)) - entropy_coef * agg(entropy), with the
    same aggregation for every term (verl's use_kl_loss form: KL as a loss term, not in the reward);
    ``agg_scale`` is seq-mean-token-sum-norm's constant divisor. ``token_weights`` w (constants,
    e.g. ``tis_weights``) multiply the per-token policy-gradient loss pg. They are applied to the
    advantage, which for w > 0 is the same thing: max(-wA r, -wA clip(r)) = w max(-A r, -A clip(r))
    (and so for the dual clip), with the clip statistics unchanged.
    """
    if token_weights is not None:
        a = advantages[:, None] if advantages.dim() == 1 else advantages
        advantages = a * token_weights
    pg_loss, stats = ppo_policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=clip_c,
        agg=agg,
        agg_scale=agg_scale,
    )
    loss = pg_loss
    out = {"loss/policy": pg_loss.item()}
    out.update({f"actor/{k}": float(v) for k, v in stats.items()})
    loss, out = _with_kl(loss, out, logp, ref_logp, mask, kl_coef, kl_kind, agg, agg_scale)
    if entropy is not None:
        ent = aggregate_loss(entropy, mask, agg, agg_scale)
        out["actor/entropy"] = ent.item()
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * ent
    return loss, out


def tis_weights(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance sampling (verl ``tis_imp_ratio_cap``; its token-level ``rollout_is``
    with ``rollout_is_threshold``): w = min(exp(old_logp - rollout_logp), cap), all [B, R], detached,
    0 on padding. ``old_logp`` is the trainer's log-prob of the behaviour policy, ``rollout_logp``
    the engine's for the same token: w corrects for the engine sampling from a slightly different
    distribution than the one the trainer differentiates. The log-ratio is clamped to [-20, 20]
    first (verl's SAFETY_BOUND), so w > 0. Stats (over valid tokens): ``tis/weight_mean``, and
    ``tis/clipped_frac``, the share of tokens whose ratio exceeded ``cap``."""
    with torch.no_grad():
        m = mask.float()
        ratio = torch.exp((old_logp.float() - rollout_logp.float()).clamp(-20.0, 20.0))
        w = ratio.clamp(max=cap) * m
        n = m.sum().clamp(min=1.0)
        stats = {"tis/weight_mean": float(w.sum() / n), "tis/clipped_frac": float(((ratio > cap) * m).sum() / n)}
    return w, stats


def _with_kl(loss, out, logp, ref_logp, mask, kl_coef, kl_kind, agg, agg_scale=None):
    if ref_logp is not None and kl_coef != 0.0:
        kl = aggregate_loss(kl_penalty(logp, ref_logp, kl_kind), mask, agg, agg_scale)
        loss = loss + kl_coef * kl
        out["kl/mean"] = kl.item()
    return loss, out


class Objective(Protocol):
    agg: str  # micro-batch weights: "token-mean" by valid tokens, "seq-mean-*" / "sample-mean" by rows
    whole_groups: bool  # micro- and mini-batches must hold whole groups
    entropy: bool  # the loss needs per-token entropy

    # Optional: ``begin_mini_batch(mini, total)``, called on every rank once per optimizer step before
    # its micro-batches, with this rank's rows of the mini-batch and ``total`` (sums a list of floats
    # over ranks: a collective), for terms normalised over the whole mini-batch of all ranks.

    def check(self, batch: RolloutBatch) -> None:
        """Raise ValueError naming what the batch lacks."""

    def __call__(
        self, logp: torch.Tensor, entropy: torch.Tensor | None, mb: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


class PPOObjective:
    """The clipped PPO objective on ``batch.advantages`` (+ KL loss, entropy bonus) by ``algorithm.*``,
    with truncated importance sampling when ``algorithm.tis_cap`` is set. ``agg_scale`` is
    seq-mean-token-sum-norm's divisor when ``algorithm.loss_scale_factor`` is not set (the recipes
    pass ``rollout.max_new_tokens``); that mode needs one of the two."""

    whole_groups = False

    def __init__(self, algo: AlgorithmConfig, agg_scale: float | None = None):
        self.algo, self.agg, self.entropy = algo, algo.loss_agg, algo.entropy_coef != 0.0
        self.agg_scale = algo.loss_scale_factor if algo.loss_scale_factor is not None else agg_scale
        if self.agg == "seq-mean-token-sum-norm" and self.agg_scale is None:
            raise ValueError(
                "loss_agg=seq-mean-token-sum-norm divides by a constant: set "
                "algorithm.loss_scale_factor (or pass agg_scale)"
            )

    def check(self, batch: RolloutBatch) -> None:
        if batch.advantages is None:
            raise ValueError("update_policy: batch.advantages is not set")
        if self.algo.kl_coef != 0.0 and batch.ref_logprobs is None:
            raise ValueError("update_policy: kl_coef != 0 needs batch.ref_logprobs")
        if self.algo.tis_cap is not None and batch.rollout_logprobs is None:
            raise ValueError("update_policy: algorithm.tis_cap needs batch.rollout_logprobs")

    def __call__(self, logp, entropy, mb):
        a, d = self.algo, logp.device
        old, mask = mb.old_logprobs.to(d), mb.response_mask.to(d)
        w, tis = (None, {}) if a.tis_cap is None else tis_weights(old, mb.rollout_logprobs.to(d), mask, a.tis_cap)
        loss, out = policy_objective(
            logp,
            old,
            mb.advantages.to(d),
            mask,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            clip_c=a.clip_c,
            agg=a.loss_agg,
            agg_scale=self.agg_scale,
            ref_logp=None if mb.ref_logprobs is None else mb.ref_logprobs.to(d),
            kl_coef=a.kl_coef,
            kl_kind=a.kl_kind,
            entropy=entropy,
            entropy_coef=a.entropy_coef,
            token_weights=w,
        )
        return loss, {**out, **tis}


class PACSObjective:
    """PACS: the policy's beta-scaled log-prob ratio (``reward_method`` "1") or mean log-prob ("2")
    is a score whose advantage within its group (rloo / grpo / naive) is trained by
    BCE-with-logits against the 0/1 outcome; the whole objective, plus a KL loss only when
    ``algorithm.kl_coef`` != 0. The loss is a mean over samples, coupled within each group."""

    agg, whole_groups, entropy = "sample-mean", True, False

    def __init__(self, pacs: PACSConfig, algo: AlgorithmConfig):
        self.pacs, self.algo = pacs, algo

    def check(self, batch: RolloutBatch) -> None:
        if batch.scores is None:
            raise ValueError("update_policy: PACS needs batch.scores (0/1 outcomes)")
        if self.algo.kl_coef != 0.0 and batch.ref_logprobs is None:
            raise ValueError("update_policy: kl_coef != 0 needs batch.ref_logprobs")

    def logits(
        self, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor
    ) -> torch.Tensor:
        """[B] the BCE's input (advantage of the scaled log-prob score), detached, for metrics."""
        p = self.pacs
        with torch.no_grad():
            if p.reward_method == "1":
                r = p.beta * ((logp - old_logp) * mask).sum(-1)
            else:
                r = p.beta * (logp * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
            r = torch.where(mask.sum(-1) > 0, r, torch.zeros_like(r))
            return group_advantages(
                r.float(), group_ids.to(r.device), p.estimator, norm_by_std=self.algo.norm_adv_by_std
            )

    def __call__(self, logp, entropy, mb):
        p, d = self.pacs, logp.device
        old, mask, y = mb.old_logprobs.to(d), mb.response_mask.to(d), mb.scores.to(d)
        loss, stats = pacs_loss(
            logp,
            old,
            y,
            mask,
            mb.group_ids.to(d),
            beta=p.beta,
            reward_method=p.reward_method,
            estimator=p.estimator,
            weight_mode=None if p.weight_mode == "none" else p.weight_mode,
            norm_by_std=self.algo.norm_adv_by_std,
        )
        out = {"pacs/loss": loss.item(), "pacs/accuracy": float(stats["accuracy"])}
        ref = None if mb.ref_logprobs is None else mb.ref_logprobs.to(d)
        return _with_kl(loss, out, logp, ref, mask, self.algo.kl_coef, self.algo.kl_kind, "token-mean")
