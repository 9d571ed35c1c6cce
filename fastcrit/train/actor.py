"""The trainable policy (and the frozen reference): build, score, update.

Micro-batches and processes are weighted so that the loss is the one a single batch holding every
rank's mini-batch would give: each micro-batch's aggregated loss is weighted by its share of the
valid tokens (token-mean), valid sequences (seq-mean-*) or rows (sample-mean) of the mini-batches
of ALL ranks (one all-reduce of the count per mini-batch), times the world size, since FSDP averages
gradients over ranks. This is current verl's ``batch_num_tokens`` / ``global_batch_size`` with
``* dp_size``; ranks with different numbers of response tokens no longer weigh their tokens
differently (the mean over ranks of per-rank token-means did).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from fastcrit.algos.losses import Objective, PPOObjective
from fastcrit.config import AlgorithmConfig, OptimConfig
from fastcrit.models.hf import flash_attn_2_problem, load_model, parse_dtype
from fastcrit.models.liger import apply_liger
from fastcrit.models.mlp import patch_swiglu_mlps
from fastcrit.models.norm import patch_rms_norms
from fastcrit.train.balance import karmarkar_karp, split_to, token_micro_batches, workload
from fastcrit.train.dist import all_reduce, world_size
from fastcrit.train.policy import CausalLMLogprobs, checkpoint_layers, compile_layers, load_from_rank0, shard
from fastcrit.types import RolloutBatch


@dataclass
class Actor:
    module: CausalLMLogprobs
    optimizer: torch.optim.Optimizer | None
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    device: torch.device
    share_prompts: bool = False  # rows with the same prompt run it once (CausalLMLogprobs.forward)


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


def build_actor(
    model_path: str,
    *,
    dtype: str,
    device: torch.device,
    world_size: int,
    optim: OptimConfig | None = None,
    total_updates: int = 0,
    liger: bool = False,
    packed: bool = False,
    share_prompts: bool = False,
    checkpointing: bool = False,
    compile: bool = False,
) -> Actor:
    """The FSDP2 policy with AdamW by ``optim``, or a frozen model (a reference) when it is None.
    ``total_updates`` (optimizer steps in the whole run) is where a cosine schedule ends.

    A trainable policy keeps fp32 master weights and computes in ``dtype`` (FSDP2 mixed precision,
    gradients reduced in fp32); a frozen one is simply stored in ``dtype``. With ``liger`` on a CUDA
    device, Liger-Kernel's RMSNorm / SwiGLU / RoPE patches are applied where the architecture is
    supported (fastcrit.models.liger). ``packed`` on CUDA loads the model with flash-attn 2, whose
    varlen path keeps packed sequences apart (``_forward_packed``). ``share_prompts``: in the
    padded (not packed) forward, the rows that share a prompt run it once. ``checkpointing``: a
    trainable model's decoder layers are recomputed in the backward (``checkpoint_layers``).
    ``compile``: the decoder layers run through ``torch.compile`` (``compile_layers``).
    """
    trainable = optim is not None
    attn = None
    if packed and device.type == "cuda":  # Transformers imports flash-attn; we check it would work
        problem = flash_attn_2_problem()
        if problem is not None:
            raise RuntimeError(f"trainer.pack_sequences on CUDA runs on flash-attn 2's varlen path: {problem}")
        attn = "flash_attention_2"
    lm = load_model(
        model_path,
        dtype=torch.float32 if trainable else parse_dtype(dtype),
        device="cpu",
        attn_implementation=attn,
        meta=not reads_weights(world_size),
    )
    lm.config.use_cache = False
    if liger and device.type == "cuda":
        apply_liger(lm)
    actor = wrap_trainable(
        CausalLMLogprobs(lm),
        dtype=dtype,
        device=device,
        world_size=world_size,
        optim=optim,
        total_updates=total_updates,
        checkpointing=checkpointing,
        compile=compile,
    )
    actor.share_prompts = share_prompts
    return actor


def reads_weights(world_size: int) -> bool:
    """Whether this rank reads a model's weights from disk: every rank in one process, else rank 0
    alone. The other ranks build the architecture on the meta device and get their shards from
    rank 0 once sharded (``wrap_trainable``), so a node's host memory holds one copy of each model
    while they load, not one per rank."""
    return world_size == 1 or not dist.is_initialized() or dist.get_rank() == 0


def wrap_trainable(
    module: torch.nn.Module,
    *,
    dtype: str,
    device: torch.device,
    world_size: int,
    optim: OptimConfig | None,
    total_updates: int,
    checkpointing: bool = False,
    compile: bool = False,
) -> Actor:
    """Shard ``module`` (loaded in fp32 when trainable, else in ``dtype``, on CPU) with FSDP2 onto
    ``device`` (mixed precision in ``dtype`` when trainable) and give it AdamW and the lr schedule by
    ``optim``; frozen (no gradients, no optimizer) when ``optim`` is None. ``checkpointing`` (a
    trainable module only): activation checkpointing per decoder layer (``checkpoint_layers``).
    ``compile``: the decoder layers through ``torch.compile`` (``compile_layers``).

    The module is not moved to ``device`` first: ``fully_shard`` moves each group's parameters and
    buffers to the mesh's device just before sharding them (_fsdp_init.py:565-567 in torch 2.13 and
    2.14.1), so the device holds the shards plus one layer in full, never the whole model.

    One process without mixed precision (fp32 training, or a frozen model) runs the plain module
    on ``device``: FSDP2 over a world of one shards nothing and still copies every layer's
    parameters in and out of its all-gather buffers at each forward and backward, which slows
    small models' CPU updates for nothing (the figures: docs/LOG.md). Mixed
    precision keeps FSDP2, whose policy computes in ``dtype`` over fp32 master weights."""
    trainable = optim is not None
    compute = parse_dtype(dtype)
    # On a CPU one autograd function per RMSNorm and per gated MLP (fastcrit.models.norm, .mlp); CUDA
    # has Liger's kernels. Compiled layers keep Hugging Face's modules: Inductor fuses their
    # element-wise work itself, and the functions' row-block loops would tie a graph to a row count.
    if device.type == "cpu" and not compile:
        patch_rms_norms(module)
        patch_swiglu_mlps(module)
    module.train(trainable)
    if compile:
        compile_layers(module)
    if not trainable:
        module.requires_grad_(False)
    elif checkpointing:
        checkpoint_layers(module)
    mixed = trainable and compute != torch.float32
    module.math_attention_for_grad = mixed and device.type == "cpu"  # see policy.graph_attention
    if world_size == 1 and not mixed:
        module.to(device)
    else:
        # rank 0's full weights (host tensors, kept alive by this dict while FSDP2 shards the
        # module) go to every rank's shards once sharded; the other ranks' modules are weightless
        full = module.state_dict() if world_size > 1 and dist.get_rank() == 0 else None
        shard(module, world_size, device, param_dtype=compute if mixed else None)
        if world_size > 1:
            load_from_rank0(module, full, device)
            del full
    if not trainable:
        return Actor(module, None, None, device)
    # AdamW is torch's fused kernel: one pass per parameter, where the foreach path loops over ~8
    # element-wise ops per parameter with temporaries as large (several times slower on CPU; the
    # figures: docs/LOG.md), the same weights to rounding. FSDP2's sharded (DTensor) parameters
    # take it too (it steps each rank's local shard).
    opt = torch.optim.AdamW(
        module.parameters(),
        lr=optim.lr,
        betas=(optim.beta1, optim.beta2),
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        fused=True,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(optim, total_updates))
    return Actor(module, opt, sched, device)


def free_gradients(*actors: Actor | None) -> None:
    """Drop the gradients of trainable ``actors`` (their memory goes back to the allocator): an
    update's gradients are read by its last optimizer step only, and kept, they would hold 4 bytes
    per parameter (per shard) through generation."""
    for a in actors:
        if a is not None and a.optimizer is not None:
            a.optimizer.zero_grad(set_to_none=True)


def reshard(actor: Actor) -> None:
    """Free an FSDP2 model's gathered root parameters (embeddings, final norm, lm_head) after a
    forward-only pass: FSDP2 keeps the root gathered after its forward for the backward it
    expects (``reshard_after_forward`` is False for the root), which a frozen reference or a
    scoring pass never runs. The layers reshard after their own forwards."""
    if isinstance(actor.module, FSDPModule):
        actor.module.reshard()


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


def micro_slices(n: int, micro: int):
    """Slices of at most ``micro`` rows covering ``range(n)`` in order (rows of a mini-batch per pass)."""
    for s in range(0, n, micro):
        yield slice(s, min(n, s + micro))


def _forward(actor: Actor, mb: RolloutBatch, temperature: float, entropy: bool, packed: bool = False):
    d = actor.device
    if packed:
        return _forward_packed(actor, mb, temperature, entropy)
    return actor.module(
        mb.input_ids.to(d),
        mb.attention_mask.to(d),
        mb.position_ids.to(d),
        mb.responses.to(d),
        mb.response_mask.to(d),
        temperature=temperature,
        return_entropy=entropy,
        share_prompts=actor.share_prompts,
    )


def _forward_packed(actor: Actor, mb: RolloutBatch, temperature: float, entropy: bool):
    """The rows of ``mb`` end to end in one sequence without padding (positions restart at 0 for
    each row), scored in one forward; the [N] log-probs go back to [B, R] (0 on padding)."""
    d, am, P = actor.device, mb.attention_mask.bool(), mb.prompts.shape[1]
    ids, pos, index, rows, cols, offset = [], [], [], [], [], 0
    for i in range(len(mb)):
        p, r = int(am[i, :P].sum()), int(am[i, P:].sum())
        if p == 0:
            raise ValueError(f"packed forward: row {i} has no prompt token to predict its response from")
        ids.append(mb.input_ids[i][am[i]])
        pos.append(torch.arange(p + r))
        index.append(offset + p - 1 + torch.arange(r))
        rows.append(torch.full((r,), i))
        cols.append(torch.arange(r))
        offset += p + r
    index, rows, cols = torch.cat(index), torch.cat(rows), torch.cat(cols)
    if len(index) == 0:  # no response token at all: still run the forward (collectives), score nothing
        index, rows, cols = (
            torch.zeros(1, dtype=torch.long),
            torch.zeros(1, dtype=torch.long),
            torch.zeros(1, dtype=torch.long),
        )
        mask = torch.zeros(1)
    else:
        mask = mb.response_mask[rows, cols]
    out = actor.module(
        torch.cat(ids)[None].to(d),
        None,
        torch.cat(pos)[None].to(d),
        mb.responses[rows, cols].to(d),
        mask.to(d),
        temperature=temperature,
        return_entropy=entropy,
        packed_index=index.to(d),
    )
    shape, at = mb.responses.shape, (rows.to(d), cols.to(d))

    def back(v):
        return torch.zeros(shape, dtype=v.dtype, device=d).index_put(at, v * mask.to(d, v.dtype))

    return tuple(back(v) for v in out) if entropy else back(out)


@torch.no_grad()
def compute_logprobs(
    actor: Actor,
    batch: RolloutBatch,
    temperature: float,
    micro_batch_size: int,
    max_tokens: int = 0,
    packed: bool = False,
) -> torch.Tensor:
    """[B, R] fp32 log-probs of the responses under ``actor`` (0 on padding), on CPU. With
    ``max_tokens`` > 0, micro-batches by that token budget (see ``micro_plan``), ``packed`` or not."""
    out = torch.zeros(batch.responses.shape, dtype=torch.float32)
    for idx in micro_plan(batch, micro_batch_size, max_tokens, whole_groups=False, packed=packed):
        mb = batch.select(idx if len(idx) else torch.zeros(1, dtype=torch.long))
        mb = mb.trimmed() if max_tokens > 0 else mb
        logp = _forward(actor, mb, temperature, False, packed).float().cpu()
        if len(idx):
            out[idx, : logp.shape[1]] = logp
    reshard(actor)
    return out * batch.response_mask


def micro_plan(
    batch: RolloutBatch, micro_batch_size: int, max_tokens: int, whole_groups: bool, packed: bool = False
) -> list[torch.Tensor]:
    """Row indices of the micro-batches of ``batch``: ``micro_batch_size`` rows each (whole groups
    together when ``whole_groups``), or, with ``max_tokens`` > 0, by that token budget: rows x
    longest row <= max_tokens, longest rows first, each micro-batch then cut to its own longest
    row (``packed``: real tokens <= max_tokens, the rows end to end). Ranks agree on the count (a
    collective: FSDP gathers weights in every forward): by the token budget, splitting their
    largest micro-batches; an empty index (run with weight 0) where nothing is left to split, and
    by rows, always."""
    if max_tokens <= 0:
        plan = _micro_batches(batch, micro_batch_size, whole_groups)
        count = int(all_reduce([float(len(plan))], "max")[0])
        return plan + [torch.zeros(0, dtype=torch.long)] * (count - len(plan))
    groups = batch.group_ids.tolist() if whole_groups else None
    plan = token_micro_batches(batch.attention_mask.sum(-1).tolist(), max_tokens, groups, packed)
    count = int(all_reduce([float(len(plan))], "max")[0])
    return [torch.tensor(m, dtype=torch.long) for m in split_to(plan, count, groups)]


def balance_ranks(batch: RolloutBatch, whole_groups: bool) -> tuple[RolloutBatch, dict[str, float]]:
    """Re-partition the rows of all ranks' batches over the ranks by work (Karmarkar-Karp on
    24576 L + L^2 per row, or per group when ``whole_groups``): a collective. The loss is unchanged
    (micro-batch weights count over all ranks). Returns this rank's rows and
    ``batch/imbalance_before`` (max / mean real tokens per rank as rolled out). Keeps the batch as it
    is when some rank would get nothing (fewer rows or groups than ranks); also
    ``batch/pad_frac_padded`` of the batches as rolled out (each padded as one block)."""
    world = world_size()
    tokens = float(batch.attention_mask.sum())
    total, cells = all_reduce([tokens, float(batch.attention_mask.numel())])
    most = all_reduce([tokens], "max")[0]
    before = {
        "batch/imbalance_before": most * world / total if total > 0 else 1.0,
        "batch/pad_frac_padded": 1.0 - total / max(cells, 1.0),
    }
    if world == 1:
        return batch, before
    parts: list = [None] * world
    dist.all_gather_object(parts, batch)
    whole = RolloutBatch.concat(parts)
    cost = workload(whole.attention_mask.sum(-1).tolist())
    if whole_groups:
        ids = whole.group_ids.tolist()
        units = list(dict.fromkeys(ids))
        rows_of = {g: [i for i, x in enumerate(ids) if x == g] for g in units}
        unit_cost = [sum(cost[i] for i in rows_of[g]) for g in units]
    else:
        units, rows_of, unit_cost = list(range(len(whole))), {i: [i] for i in range(len(whole))}, list(cost)
    split = karmarkar_karp(unit_cost, world)
    if any(not p for p in split):
        return batch, before
    mine = sorted(i for u in split[dist.get_rank()] for i in rows_of[units[u]])
    return whole.select(torch.tensor(mine, dtype=torch.long)).trimmed(), before


def padding_stats(batch: RolloutBatch, plan: list[torch.Tensor], trim: bool, packed: bool = False) -> dict[str, float]:
    """``batch/pad_frac_padded``: the share of padding in the rank's batch padded as one block;
    ``batch/pad_frac``: in the micro-batches actually run; ``batch/imbalance``: max / mean real
    tokens per rank. Over all ranks (collectives)."""
    real = float(batch.attention_mask.sum())
    run = 0.0
    for idx in plan:
        if len(idx):
            mb = batch.select(idx)
            am = (mb.trimmed() if trim else mb).attention_mask
            run += float(am.sum() if packed else am.numel())
    world = world_size()
    real_all, whole_all, run_all = all_reduce([real, float(batch.attention_mask.numel()), run])
    (most,) = all_reduce([real], "max")
    return {
        "batch/pad_frac_padded": 1.0 - real_all / max(whole_all, 1.0),
        "batch/pad_frac": 1.0 - real_all / max(run_all, 1.0),
        "batch/imbalance": most * world / real_all if real_all > 0 else 1.0,
    }


def _agg_count(mask: torch.Tensor, agg: str) -> float:
    """What ``agg`` divides a batch's summed loss by: its valid tokens (token-mean), its rows
    (sample-mean: every row counts, with or without valid tokens) or its sequences with a valid
    token (the seq-mean modes)."""
    if agg == "token-mean":
        return float(mask.sum())
    if agg == "sample-mean":
        return float(mask.shape[0])
    return float((mask.sum(-1) > 0).sum())


class GlobalWeights:
    """Weights of micro-batch losses such that their sum, averaged over ranks by FSDP, is the loss
    aggregated over the mini-batches of all ranks together. A collective: every rank builds one per
    mini-batch."""

    def __init__(self, mini_mask: torch.Tensor, agg: str):
        self.agg = agg
        self.world = world_size()
        self.total = all_reduce([_agg_count(mini_mask, agg)])[0]

    def __call__(self, mb_mask: torch.Tensor) -> float:
        return _agg_count(mb_mask, self.agg) * self.world / self.total if self.total > 0 else 0.0


def logprob_gap(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``logprob/gap_mean`` and ``logprob/gap_max``: |trainer - engine| log-prob over the response
    tokens of all ranks ([B, R] each; collectives, so every rank gets the same numbers)."""
    gap = GapMeter()
    gap.add(trainer_logp, engine_logp, mask)
    return gap.result()


class GapMeter:
    """Sums |trainer - engine| log-prob over batches, then reduces over ranks (``result``)."""

    def __init__(self):
        self.total, self.count, self.biggest = 0.0, 0.0, 0.0

    def add(self, trainer_logp, engine_logp, mask) -> None:
        m = mask.to(trainer_logp.device, torch.float32)
        d = (trainer_logp.detach().float() - engine_logp.to(trainer_logp.device).float()).abs() * m
        self.total += float(d.sum())
        self.count += float(m.sum())
        self.biggest = max(self.biggest, float(d.max()) if d.numel() else 0.0)

    def result(self) -> dict[str, float]:
        total, count = all_reduce([self.total, self.count])
        (biggest,) = all_reduce([self.biggest], "max")
        return {"logprob/gap_mean": total / max(count, 1.0), "logprob/gap_max": biggest}


def _mini_batches(
    batch: RolloutBatch, n: int, whole_groups: bool, generator: torch.Generator | None
) -> list[torch.Tensor]:
    """Row indices of up to ``n`` mini-batches (those empty on every rank left out). Units (whole
    groups, or rows keyed by group and place in the group) are dealt out stratified: each aligned
    block of ``n`` consecutive unit keys goes to the ``n`` mini-batches in a random order, from one
    table drawn with ``generator`` per call. Group ids are global (``collate``'s offset), so a
    unit's mini-batch depends on its key alone, not on which rank holds it: N ranks with the same
    generator state make the mini-batches one process makes, and a rank whose share is whole blocks
    holds the same number of units in each. A collective (the largest key and the counts)."""
    B = len(batch)
    if n == 1:
        return [torch.arange(B)]
    gid = batch.group_ids.long()
    if whole_groups:
        key = gid
    else:  # rows: group id x the largest group + the row's place in its group (rows keep their order)
        order = torch.argsort(gid, stable=True)
        sorted_g = gid[order]
        starts = torch.searchsorted(sorted_g, sorted_g, right=False)
        place = torch.empty_like(gid)
        place[order] = torch.arange(B) - starts
        size = int(all_reduce([float(place.max()) + 1 if B else 0.0], "max")[0])
        key = gid * size + place
    top = int(all_reduce([float(key.max()) if B else -1.0], "max")[0])
    table = torch.rand(top // n + 1, n, generator=generator).argsort(dim=1)  # block -> mini-batch per slot
    which = table[key // n, key % n]
    minis = [torch.nonzero(which == m).flatten() for m in range(n)]
    counts = all_reduce([float(len(m)) for m in minis])
    return [m for m, c in zip(minis, counts) if c > 0]


def _micro_batches(mini: RolloutBatch, micro: int, whole_groups: bool) -> list[torch.Tensor]:
    """Row indices of micro-batches of at most ``micro`` rows (or one whole group, when larger)."""
    if not whole_groups:
        return [torch.arange(len(mini))[sl] for sl in micro_slices(len(mini), micro)]
    out: list[list[int]] = []
    for g in torch.unique(mini.group_ids):
        rows = torch.nonzero(mini.group_ids == g).flatten().tolist()
        if out and len(out[-1]) + len(rows) <= micro:
            out[-1] += rows
        else:
            out.append(rows)
    return [torch.tensor(r, dtype=torch.long) for r in out]


def update_policy(
    actor: Actor,
    batch: RolloutBatch,
    algo: AlgorithmConfig,
    *,
    temperature: float,
    micro_batch_size: int,
    grad_clip: float,
    generator: torch.Generator | None = None,
    objective: Objective | None = None,
    measure_gap: bool = False,
    max_tokens: int = 0,
    packed: bool = False,
) -> dict[str, float]:
    """Optimizer steps on ``batch`` minimising ``objective`` (default: PPO's clipped objective on
    ``batch.advantages`` by ``algo``: clip range, dual clip, loss aggregation, KL and entropy terms).

    ``algo`` says how many optimizer steps one batch makes (ppo_epochs x mini_batches). Returns
    metrics averaged over optimizer steps (loss terms, clip fractions, grad norm, lr); each rank's
    are its part of the global mean, which averaging over ranks completes. With ``measure_gap``,
    also ``logprob_gap`` between the first optimizer step's log-probs (the weights have not moved
    yet) and ``batch.rollout_logprobs``: free, but over the first mini-batch only. With
    ``max_tokens`` > 0, micro-batches by that token budget (``micro_plan``; ``packed``: the rows
    of a micro-batch end to end, no padding), and the padding metrics of ``padding_stats`` (over
    the first epoch's micro-batches).
    """
    assert actor.optimizer is not None, "update_policy needs a trainable actor"
    objective = objective or PPOObjective(algo)
    objective.check(batch)
    gap = GapMeter() if measure_gap and batch.rollout_logprobs is not None else None
    sums: dict[str, float] = {}
    n_steps = 0
    run_plans: list[torch.Tensor] = []
    for epoch in range(algo.ppo_epochs):
        for mini_idx in _mini_batches(batch, algo.mini_batches, objective.whole_groups, generator):
            mini = batch.select(mini_idx)
            weight = GlobalWeights(mini.response_mask, objective.agg)
            if hasattr(objective, "begin_mini_batch"):  # terms normalised over all ranks' mini-batch
                objective.begin_mini_batch(mini, all_reduce)
            actor.optimizer.zero_grad(set_to_none=True)
            step_stats: dict[str, float] = {}
            for idx in micro_plan(mini, micro_batch_size, max_tokens, objective.whole_groups, packed):
                if epoch == 0 and max_tokens > 0:
                    run_plans.append(mini_idx[idx])
                # No skipping of empty micro-batches: every rank must run the same collectives
                # (an empty index runs one row with weight 0).
                mb = mini.select(idx) if len(idx) else batch.select(torch.zeros(1, dtype=torch.long))
                mb = mb.trimmed() if max_tokens > 0 else mb
                w = weight(mb.response_mask) if len(idx) else 0.0
                out = _forward(actor, mb, temperature, objective.entropy, packed)
                logp, ent = out if objective.entropy else (out, None)
                if gap is not None and n_steps == 0 and len(idx):
                    gap.add(logp, mb.rollout_logprobs, mb.response_mask)
                loss, stats = objective(logp, ent, mb)
                (loss * w).backward()
                for k, v in stats.items():
                    step_stats[k] = step_stats.get(k, 0.0) + v * w
            step_stats.update({f"actor/{k}": v for k, v in optimizer_step(actor, grad_clip).items()})
            for k, v in step_stats.items():
                sums[k] = sums.get(k, 0.0) + v
            n_steps += 1
    out = {k: v / max(n_steps, 1) for k, v in sums.items()}
    if max_tokens > 0:
        out.update(padding_stats(batch, run_plans, trim=True, packed=packed))
    return {**out, **gap.result()} if gap is not None else out


def sft_step(
    actor: Actor,
    batch: RolloutBatch,
    *,
    micro_batch_size: int,
    grad_clip: float,
    max_tokens: int = 0,
    packed: bool = False,
) -> dict[str, float]:
    """One optimizer step of token-mean negative log-likelihood on ``batch.responses``, the mean
    over the tokens of all ranks' batches (FSDP averages the ranks' gradients, so each rank's sum
    is scaled by world size / global token count); ``sft/nll`` is this rank's part of it x world
    size, which averaging over ranks completes. Micro-batches of ``micro_batch_size`` rows, or by
    the ``max_tokens`` budget (``micro_plan``; ``packed``: rows end to end) when it is > 0."""
    assert actor.optimizer is not None
    actor.optimizer.zero_grad(set_to_none=True)
    total = all_reduce([float(batch.response_mask.sum())])[0]
    scale = world_size() / max(total, 1.0)
    nll_sum = 0.0
    for idx in micro_plan(batch, micro_batch_size, max_tokens, whole_groups=False, packed=packed):
        # an empty index (ranks agree on the count) runs one row with weight 0: the same collectives
        mb = batch.select(idx if len(idx) else torch.zeros(1, dtype=torch.long))
        mb = mb.trimmed() if max_tokens > 0 else mb
        logp = _forward(actor, mb, 1.0, False, packed)
        loss = -(logp * mb.response_mask.to(actor.device)).sum() * (scale if len(idx) else 0.0)
        loss.backward()
        nll_sum += loss.item()
    step = optimizer_step(actor, grad_clip)
    return {"sft/nll": nll_sum, "sft/grad_norm": step["grad_norm"], "sft/lr": step["lr"]}
