"""The PPO critic (and the reward model's scoring): a backbone with a value head, FSDP2-wrapped like
the policy, with its own optimizer. Values of a response are read at the positions that predict its
tokens (the state before each token), as verl's critic does."""

from __future__ import annotations

import torch
import torch.nn as nn

from fastcrit.algos.advantages import last_valid_index
from fastcrit.config import AlgorithmConfig, OptimConfig, PPOConfig
from fastcrit.models.hf import load_value_model, parse_dtype
from fastcrit.train.actor import (
    Actor,
    GlobalWeights,
    _mini_batches,
    micro_plan,
    micro_slices,
    optimizer_step,
    reads_weights,
    reshard,
    wrap_trainable,
)
from fastcrit.train.dist import masked_mean_over_ranks
from fastcrit.train.policy import graph_attention
from fastcrit.types import RolloutBatch
from fastcrit_kernels import value_loss


class ValueModel(nn.Module):
    """Wraps a Hugging Face ``*ForTokenClassification`` / ``*ForSequenceClassification`` model with
    one label (``lm``, named like the policy's wrapper for the shared sharding and saving code)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.lm = model

    @property
    def base(self) -> nn.Module:
        return getattr(self.lm, self.lm.base_model_prefix)

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """[B, T] fp32 value of every position."""
        with graph_attention(self):
            hidden = self.base(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).last_hidden_state
        return self.lm.score(hidden)[..., 0].float().clone()


def build_value_actor(
    model_path: str,
    *,
    dtype: str,
    device: torch.device,
    world_size: int,
    optim: OptimConfig | None = None,
    total_updates: int = 0,
    checkpointing: bool = False,
    compile: bool = False,
) -> Actor:
    """A value model (head kept from a value-head checkpoint, fresh on a causal LM), sharded with
    FSDP2, with AdamW by ``optim``, or frozen when ``optim`` is None (a reward model);
    ``checkpointing``: activation checkpointing per decoder layer when trainable; ``compile``: the
    decoder layers through ``torch.compile``."""
    dtype_load = torch.float32 if optim is not None else parse_dtype(dtype)
    model = load_value_model(model_path, dtype=dtype_load, meta=not reads_weights(world_size))
    return wrap_trainable(
        ValueModel(model),
        dtype=dtype,
        device=device,
        world_size=world_size,
        optim=optim,
        total_updates=total_updates,
        checkpointing=checkpointing,
        compile=compile,
    )


def _values(actor: Actor, mb: RolloutBatch) -> torch.Tensor:
    d, R = actor.device, mb.responses.shape[1]
    # the states before each response token: positions P-1 .. P+R-2 (the last one is not run)
    out = actor.module(mb.input_ids[:, :-1].to(d), mb.attention_mask[:, :-1].to(d), mb.position_ids[:, :-1].to(d))
    return out[:, -R:]


@torch.no_grad()
def compute_values(actor: Actor, batch: RolloutBatch, micro_batch_size: int) -> torch.Tensor:
    """[B, R] fp32 values of the states before each response token (0 on padding), on CPU."""
    out = [
        _values(actor, batch.select(torch.arange(len(batch))[sl])).cpu()
        for sl in micro_slices(len(batch), micro_batch_size)
    ]
    reshard(actor)
    return torch.cat(out) * batch.response_mask


def update_values(
    actor: Actor,
    batch: RolloutBatch,
    algo: AlgorithmConfig,
    ppo: PPOConfig,
    *,
    micro_batch_size: int,
    grad_clip: float,
    agg_scale: float | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Clipped value regression of ``batch.values`` (rollout-time predictions) towards
    ``batch.returns``, ppo_epochs x mini_batches optimizer steps, loss aggregated as the policy's
    (over all ranks' tokens, see ``train.actor``; ``agg_scale``: seq-mean-token-sum-norm's divisor
    when ``algorithm.loss_scale_factor`` is not set). Rows are dealt to mini-batches as the policy's
    are (by global group id and place, from ``generator``), and ranks run as many micro-batches (an
    empty one with weight 0), so N ranks take the steps one process takes on the whole batch."""
    if algo.loss_scale_factor is not None:
        agg_scale = algo.loss_scale_factor
    if batch.values is None or batch.returns is None:
        raise ValueError("update_values: batch.values and batch.returns must be set")
    sums, n_steps = {}, 0
    for _ in range(algo.ppo_epochs):
        for mini_idx in _mini_batches(batch, algo.mini_batches, False, generator):
            mini = batch.select(mini_idx)
            weight = GlobalWeights(mini.response_mask, algo.loss_agg)
            actor.optimizer.zero_grad(set_to_none=True)
            stats: dict[str, float] = {}
            for idx in micro_plan(mini, micro_batch_size, 0, whole_groups=False):
                mb = mini.select(idx) if len(idx) else batch.select(torch.zeros(1, dtype=torch.long))
                w = weight(mb.response_mask) if len(idx) else 0.0
                d = actor.device
                loss, s = value_loss(
                    _values(actor, mb),
                    mb.values.to(d),
                    mb.returns.to(d),
                    mb.response_mask.to(d),
                    clip=ppo.value_clip,
                    agg=algo.loss_agg,
                    agg_scale=agg_scale,
                )
                (loss * w).backward()
                stats["critic/value_loss"] = stats.get("critic/value_loss", 0.0) + loss.item() * w
                stats["critic/vf_clipfrac"] = stats.get("critic/vf_clipfrac", 0.0) + float(s["clipfrac"]) * w
            stats.update({f"critic/{k}": v for k, v in optimizer_step(actor, grad_clip).items()})
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
            n_steps += 1
    return {k: v / max(n_steps, 1) for k, v in sums.items()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the valid tokens of all ranks together
    (1 = perfect, 0 = a constant; collectives)."""

    def var(x):
        mean = masked_mean_over_ranks(x, mask)
        return masked_mean_over_ranks((x.double() - mean) ** 2, mask)

    vr = var(returns)
    return float(1.0 - var(returns - values) / vr) if vr > 0 else 0.0


def last_token_values(actor: Actor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B] the value at each row's last valid token (any padding side): a reward model's score."""
    d = actor.device
    pos = (torch.cumsum(attention_mask, 1) - 1).clamp(min=0)
    last = last_valid_index(attention_mask).to(d)
    v = actor.module(input_ids.to(d), attention_mask.to(d), pos.to(d))
    return v.gather(1, last[:, None])[:, 0]


@torch.no_grad()
def last_token_scores(
    actor: Actor, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batch_size: int
) -> torch.Tensor:
    """[B] scores of a frozen reward model, micro-batch by micro-batch, on CPU."""
    out = torch.cat(
        [
            last_token_values(actor, input_ids[sl], attention_mask[sl]).cpu()
            for sl in micro_slices(len(input_ids), micro_batch_size)
        ]
    )
    reshard(actor)
    return out
