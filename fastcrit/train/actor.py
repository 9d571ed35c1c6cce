"""The trainable policy (and the frozen reference): build, score, update.

Micro-batches are chosen so that the mini-batch loss equals the loss one big batch would give: each
micro-batch's aggregated loss is weighted by its share of the mini-batch's valid tokens (token-mean)
or valid sequences (seq-mean-*). Across processes FSDP averages gradients, i.e. the loss is the
mean over ranks of each rank's loss (as verl does); ranks roll out equal numbers of groups.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fastcrit.algos.losses import Objective, PPOObjective
from fastcrit.config import AlgorithmConfig, OptimConfig
from fastcrit.models.hf import load_model, parse_dtype
from fastcrit.models.liger import apply_liger
from fastcrit.train.policy import CausalLMLogprobs, shard
from fastcrit.types import RolloutBatch


@dataclass
class Actor:
    module: CausalLMLogprobs
    optimizer: torch.optim.Optimizer | None
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    device: torch.device


def lr_factor(optim: OptimConfig, total_updates: int):
    """The learning rate's multiplier per optimizer step: linear warm-up over ``optim.warmup_steps``,
    then constant, or a cosine from 1 down to ``optim.min_lr_ratio`` at step ``total_updates``."""
    warm = max(0, optim.warmup_steps)

    def factor(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        if optim.lr_schedule == "constant" or total_updates <= warm:
            return 1.0
        progress = min(1.0, (s - warm) / max(1, total_updates - warm))
        return optim.min_lr_ratio + (1.0 - optim.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_actor(model_path: str, *, dtype: str, device: torch.device, world_size: int,
                optim: OptimConfig | None = None, total_updates: int = 0, liger: bool = False) -> Actor:
    """The FSDP2 policy with AdamW by ``optim``, or a frozen model (a reference) when it is None.
    ``total_updates`` (optimizer steps in the whole run) is where a cosine schedule ends.

    A trainable policy keeps fp32 master weights and computes in ``dtype`` (FSDP2 mixed precision,
    gradients reduced in fp32); a frozen one is simply stored in ``dtype``. With ``liger`` on a CUDA
    device, Liger-Kernel's RMSNorm / SwiGLU / RoPE patches are applied where the architecture is
    supported (fastcrit.models.liger).
    """
    trainable = optim is not None
    lm = load_model(model_path, dtype=torch.float32 if trainable else parse_dtype(dtype), device="cpu")
    lm.config.use_cache = False
    if liger and device.type == "cuda":
        apply_liger(lm)
    return wrap_trainable(CausalLMLogprobs(lm), dtype=dtype, device=device, world_size=world_size,
                          optim=optim, total_updates=total_updates)


def wrap_trainable(module: torch.nn.Module, *, dtype: str, device: torch.device, world_size: int,
                   optim: OptimConfig | None, total_updates: int) -> Actor:
    """Shard ``module`` (loaded in fp32 when trainable, else in ``dtype``, on CPU) with FSDP2 onto
    ``device`` (mixed precision in ``dtype`` when trainable) and give it AdamW and the lr schedule by
    ``optim``; frozen (no gradients, no optimizer) when ``optim`` is None.

    The module is not moved to ``device`` first: ``fully_shard`` moves each group's parameters and
    buffers to the mesh's device just before sharding them (torch 2.13 _fsdp_init.py:565-567), so
    the device holds the shards plus one layer in full, never the whole model."""
    trainable = optim is not None
    compute = parse_dtype(dtype)
    module.train(trainable)
    if not trainable:
        module.requires_grad_(False)
    mixed = trainable and compute != torch.float32
    shard(module, world_size, device, param_dtype=compute if mixed else None)
    if not trainable:
        return Actor(module, None, None, device)
    opt = torch.optim.AdamW(module.parameters(), lr=optim.lr, betas=(optim.beta1, optim.beta2),
                            eps=optim.eps, weight_decay=optim.weight_decay, foreach=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(optim, total_updates))
    return Actor(module, opt, sched, device)


def optimizer_step(actor: Actor, grad_clip: float) -> dict[str, float]:
    """Clip the gradient norm (a collective on sharded gradients), step the optimizer unless that
    norm is not finite (a non-finite gradient would poison the weights: the step is skipped and
    counted), and advance the lr schedule. Returns grad_norm, lr and, if it happened, the skip."""
    gn = torch.nn.utils.clip_grad_norm_(actor.module.parameters(), grad_clip)
    gn = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
    out = {"grad_norm": gn}
    if math.isfinite(gn):
        actor.optimizer.step()
    else:
        out["skipped_nonfinite_steps"] = 1.0
    actor.scheduler.step()
    out["lr"] = actor.optimizer.param_groups[0]["lr"]
    return out


def _micro_slices(n: int, micro: int):
    for s in range(0, n, micro):
        yield slice(s, min(n, s + micro))


def _forward(actor: Actor, mb: RolloutBatch, temperature: float, entropy: bool):
    d = actor.device
    return actor.module(mb.input_ids.to(d), mb.attention_mask.to(d), mb.position_ids.to(d),
                        mb.responses.to(d), mb.response_mask.to(d), temperature=temperature,
                        return_entropy=entropy)


@torch.no_grad()
def compute_logprobs(actor: Actor, batch: RolloutBatch, temperature: float,
                     micro_batch_size: int) -> torch.Tensor:
    """[B, R] fp32 log-probs of the responses under ``actor`` (0 on padding), on CPU."""
    out = []
    for sl in _micro_slices(len(batch), micro_batch_size):
        mb = batch.select(torch.arange(len(batch))[sl])
        out.append(_forward(actor, mb, temperature, False).float().cpu())
    return torch.cat(out) * batch.response_mask


def _weight(mb_mask: torch.Tensor, full_mask: torch.Tensor, agg: str) -> float:
    if agg == "token-mean":
        return mb_mask.sum().item() / max(full_mask.sum().item(), 1.0)
    if agg == "sample-mean":  # every row counts, with or without valid tokens
        return mb_mask.shape[0] / max(full_mask.shape[0], 1)
    valid = lambda m: (m.sum(-1) > 0).sum().item()  # noqa: E731 (sequences with a valid token)
    return valid(mb_mask) / max(valid(full_mask), 1)


def _mini_batches(batch: RolloutBatch, n: int, whole_groups: bool,
                  generator: torch.Generator | None) -> list[torch.Tensor]:
    """Row indices of ``n`` mini-batches, shuffled when n > 1; whole groups stay together."""
    B = len(batch)
    if n == 1:
        return [torch.arange(B)]
    if not whole_groups:
        return list(torch.randperm(B, generator=generator).chunk(n))
    groups = torch.unique(batch.group_ids)
    order = groups[torch.randperm(len(groups), generator=generator)]
    return [torch.cat([torch.nonzero(batch.group_ids == g).flatten() for g in part])
            for part in order.chunk(n) if len(part)]


def _micro_batches(mini: RolloutBatch, micro: int, whole_groups: bool) -> list[torch.Tensor]:
    """Row indices of micro-batches of at most ``micro`` rows (or one whole group, when larger)."""
    if not whole_groups:
        return [torch.arange(len(mini))[sl] for sl in _micro_slices(len(mini), micro)]
    out: list[list[int]] = []
    for g in torch.unique(mini.group_ids):
        rows = torch.nonzero(mini.group_ids == g).flatten().tolist()
        if out and len(out[-1]) + len(rows) <= micro:
            out[-1] += rows
        else:
            out.append(rows)
    return [torch.tensor(r, dtype=torch.long) for r in out]


def update_policy(actor: Actor, batch: RolloutBatch, algo: AlgorithmConfig, *, temperature: float,
                  micro_batch_size: int, grad_clip: float, generator: torch.Generator | None = None,
                  objective: Objective | None = None) -> dict[str, float]:
    """Optimizer steps on ``batch`` minimising ``objective`` (default: PPO's clipped objective on
    ``batch.advantages`` by ``algo``: clip range, dual clip, loss aggregation, KL and entropy terms).

    ``algo`` says how many optimizer steps one batch makes (ppo_epochs x mini_batches). Returns
    metrics averaged over optimizer steps (loss terms, clip fractions, grad norm, lr).
    """
    assert actor.optimizer is not None, "update_policy needs a trainable actor"
    objective = objective or PPOObjective(algo)
    objective.check(batch)
    sums: dict[str, float] = {}
    n_steps = 0
    for _ in range(algo.ppo_epochs):
        for mini_idx in _mini_batches(batch, algo.mini_batches, objective.whole_groups, generator):
            mini = batch.select(mini_idx)
            actor.optimizer.zero_grad(set_to_none=True)
            step_stats: dict[str, float] = {}
            for idx in _micro_batches(mini, micro_batch_size, objective.whole_groups):
                mb = mini.select(idx)
                # No skipping of empty micro-batches: every rank must run the same collectives.
                w = _weight(mb.response_mask, mini.response_mask, objective.agg)
                out = _forward(actor, mb, temperature, objective.entropy)
                logp, ent = out if objective.entropy else (out, None)
                loss, stats = objective(logp, ent, mb)
                (loss * w).backward()
                for k, v in stats.items():
                    step_stats[k] = step_stats.get(k, 0.0) + v * w
            step_stats.update({f"actor/{k}": v for k, v in optimizer_step(actor, grad_clip).items()})
            for k, v in step_stats.items():
                sums[k] = sums.get(k, 0.0) + v
            n_steps += 1
    return {k: v / max(n_steps, 1) for k, v in sums.items()}


def sft_step(actor: Actor, batch: RolloutBatch, *, micro_batch_size: int,
             grad_clip: float) -> dict[str, float]:
    """One optimizer step of token-mean negative log-likelihood on ``batch.responses``."""
    assert actor.optimizer is not None
    actor.optimizer.zero_grad(set_to_none=True)
    total = batch.response_mask.sum().clamp(min=1.0)
    nll_sum = 0.0
    for sl in _micro_slices(len(batch), micro_batch_size):
        mb = batch.select(torch.arange(len(batch))[sl])
        logp = _forward(actor, mb, 1.0, False)
        loss = -(logp * mb.response_mask.to(actor.device)).sum() / total.to(actor.device)
        loss.backward()
        nll_sum += loss.item()
    step = optimizer_step(actor, grad_clip)
    return {"sft/nll": nll_sum, "sft/grad_norm": step["grad_norm"], "sft/lr": step["lr"]}
