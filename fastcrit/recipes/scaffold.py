"""The scaffold every RL recipe shares: set-up, resume, the step loop, metrics, evaluation, summary
and checkpoints. A recipe file holds only what is its own (its data, its step, its evaluation):

    class MyRecipe:
        def __init__(self, run: Run): ...            # data, reward managers, extra engines
        def step(self, step: int) -> dict: ...       # one RL step; returns its metrics
        def evaluate(self) -> dict: ...              # "val/..." metrics (at start, every eval_every, end)
        # optional: summary(first, last) -> dict, summary_lines(summary) -> list[str],
        #           state_dict() / load_state_dict(d) (saved in checkpoints), close(),
        #           actors() -> {name: Actor} (more trainable models, e.g. PPO's critic: checkpointed
        #           in <checkpoint>/<name>/ and restored on resume)

    run_recipe(ctx, cfg, MyRecipe)

``Run`` carries the pieces one step composes (policy, reference, engine, timers) and the small
operations every recipe repeats, each named for what it does in the paper's pseudocode:
``generate`` (engine rollout), ``batch`` (rollouts -> padded batch; the engine sleeps; the
trainer recomputes the behaviour log-probs when ``algorithm.recompute_old_logprobs`` says so),
``reference`` (frozen-reference log-probs), ``update`` (the PPO-style policy update) and ``sync``
(wake the engine, load the new weights). Every timed phase (``Run.timer``: rollout, reward, ref,
update, sync, and the recipe's own) logs ``time/<phase>_s`` and its memory,
``memory/<phase>_peak_mb`` and ``memory/<phase>_current_mb`` (fastcrit.train.memory; the largest
over ranks, where timings are the mean). Every step that samples logs ``logprob/gap_mean`` and
``logprob/gap_max``, the engine's log-probs against the trainer's for the same tokens.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from fastcrit.algos.losses import Objective, PPOObjective
from fastcrit.config import Config
from fastcrit.config_values import loss_scale, recompute_old_logprobs
from fastcrit.data.datasets import load_dataset
from fastcrit.data.prompts import EncodedPrompt, encode_prompts
from fastcrit.models.hf import load_tokenizer
from fastcrit.recipes.common import prepare_output_dir, resolve_model, step_indices
from fastcrit.recipes.sft import run_sft
from fastcrit.registry import recipe
from fastcrit.reward import RewardItem
from fastcrit.rollout import make_engine
from fastcrit.rollout.base import Engine
from fastcrit.rollout.batch import collate
from fastcrit.train.actor import (
    Actor,
    balance_ranks,
    build_actor,
    compute_logprobs,
    free_gradients,
    logprob_gap,
    update_policy,
)
from fastcrit.train.checkpoint import clean_checkpoints, latest_checkpoint, load_checkpoint, save_checkpoint
from fastcrit.train.colocate import sync_weights
from fastcrit.train.dist import DistContext, agree_to_stop, all_reduce, all_reduce_mean, stop_if_asked
from fastcrit.train.memory import PhaseMemory, return_memory
from fastcrit.train.metrics import RunLog
from fastcrit.train.policy import compile_stats
from fastcrit.train.preempt import Stopped
from fastcrit.train.trackers import TrackerSettings
from fastcrit.types import Rollout, RolloutBatch, SamplingParams, scoring_temperature


@dataclass
class Run:
    ctx: DistContext
    cfg: Config
    out: str  # trainer.output_dir
    model_path: str  # what the policy started from (after the SFT warm start, if any)
    tok: Any
    actor: Actor
    ref: Actor | None  # frozen reference; None when algorithm.kl_coef == 0
    engine: Engine
    log: RunLog
    times: dict[str, float] = field(default_factory=dict)  # "time/<name>_s" of the current step
    tokens: int = 0  # tokens (prompt + response) trained on in the current step, this rank
    metrics: dict[str, float] = field(default_factory=dict)  # the shared pieces' metrics of the step
    memory: PhaseMemory | None = None  # "memory/<name>_..." of the current step's timed phases
    step: int = 0  # the current step (1-based; 0 before the first)
    updates: int = 0  # mini-batch dealings (shuffle() calls) in the current step

    # -- the pieces of a step -------------------------------------------------------------------

    @property
    def temperature(self) -> float:
        """The temperature log-probs are scored at (greedy rollouts are scored at 1)."""
        return scoring_temperature(self.cfg.rollout.temperature)

    @contextmanager
    def timer(self, name: str):
        if self.memory is not None:
            self.memory.begin(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            key = f"time/{name}_s"
            self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - t0
            if self.memory is not None:
                self.memory.end(name)

    def share(self, items: list, step: int) -> list:
        """This rank's part of the ``data.prompts_per_step`` items of 1-based ``step``."""
        c = self.cfg
        idx = step_indices(
            len(items), c.data.prompts_per_step, step, c.trainer.seed, self.ctx.rank, self.ctx.world_size
        )
        return [items[i] for i in idx]

    def load_prompts(
        self, spec: str, split: str, system: str | None = None, keep=None, why: str = "not kept"
    ) -> list[EncodedPrompt]:
        """``spec``'s examples (those ``keep`` accepts, when given; the others counted as ``why``) as
        chat-templated prompt ids with ``system`` (default ``data.system_prompt``); skipped rows and
        over-long prompts are logged."""
        c = self.cfg.data
        data = load_dataset(spec, c.prompt_key, c.answer_key, split, strict=c.strict)
        examples = [e for e in data.examples if keep is None or keep(e)]
        n_out = len(data.examples) - len(examples)
        dropped = [f"{spec}: {n_out} examples {why}"] if n_out else []
        prompts, too_long = encode_prompts(
            self.tok, examples, system=c.system_prompt if system is None else system, max_len=c.max_prompt_len
        )
        for msg in data.skipped + dropped + too_long:
            self.log.write(f"data: skipped {msg}")
        return prompts

    def sampling(self, step: int, n: int | None = None, stream: int = 0, first: int | None = None) -> SamplingParams:
        """``rollout.*`` sampling (``n`` samples per prompt, default ``rollout.n``), seeded so that
        sample k of this rank's call draws from (seed, step, stream) and ``first + k``: the engines
        give sample k the seed ``params.seed + k``, and ``first`` defaults to this rank's first
        sample in the step's global order (rank x its share of ``data.prompts_per_step`` x n). So
        a resumed run draws the same, and N processes draw what one process draws for the same
        prompts. ``stream`` (< 16) keeps other calls of a step (e.g. RARO's critic) apart."""
        r, c = self.cfg.rollout, self.cfg
        n = r.n if n is None else n
        if first is None:
            first = self.ctx.rank * (c.data.prompts_per_step // self.ctx.world_size) * n
        return SamplingParams(
            n=n,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            seed=sampling_seed(c.trainer.seed, step, stream, first),
        )

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Rollout]:
        with self.timer("rollout"):
            return self.engine.generate(prompt_ids, params)

    @property
    def recompute(self) -> bool:
        """Whether the trainer recomputes the old log-probs (``algorithm.recompute_old_logprobs``)."""
        return recompute_old_logprobs(self.cfg)

    def batch(self, rollouts: list[Rollout], scores: torch.Tensor) -> RolloutBatch:
        """The engine sleeps (training takes the memory); rollouts become a padded batch whose
        group ids are unique across ranks (each rank rolls out whole groups). When recomputing,
        ``old_logprobs`` become the trainer's (one forward pass) and the log-prob gap to the
        engine's is measured on the whole batch; otherwise ``update`` measures it for free."""
        self.engine.sleep()
        per_rank = self.cfg.data.prompts_per_step // self.ctx.world_size
        batch = collate(rollouts, self.tok.pad_token_id, group_offset=self.ctx.rank * per_rank)
        batch.scores = scores
        self.tokens += int(batch.attention_mask.sum())
        if self.recompute:
            with self.timer("old_logprobs"):
                t = self.cfg.trainer
                batch.old_logprobs = compute_logprobs(
                    self.actor,
                    batch,
                    self.temperature,
                    t.forward_micro_batch_size,
                    t.max_tokens_per_micro_batch,
                    t.pack_sequences,
                )
            self.metrics.update(logprob_gap(batch.old_logprobs, batch.rollout_logprobs, batch.response_mask))
        return batch

    def reference(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[B, R] log-probs under the frozen reference (None when there is no KL term)."""
        if self.ref is None:
            return None
        with self.timer("ref"):
            t = self.cfg.trainer
            return compute_logprobs(
                self.ref,
                batch,
                self.temperature,
                t.forward_micro_batch_size,
                t.max_tokens_per_micro_batch,
                t.pack_sequences,
            )

    def update(self, batch: RolloutBatch, objective: Objective | None = None) -> dict[str, float]:
        """Policy update: PPO's clipped objective on ``batch.advantages``, or ``objective``. When the
        old log-probs are the engine's, the log-prob gap is read from its first forward pass (over
        the first mini-batch; absent on a step without an update, e.g. PPO's critic_warmup)."""
        c = self.cfg
        objective = objective or PPOObjective(c.algorithm, loss_scale(c))
        budget, moved = c.trainer.max_tokens_per_micro_batch, {}
        with self.timer("update"):
            if budget > 0:  # rows move between ranks by work (Karmarkar-Karp)
                batch, moved = balance_ranks(batch, objective.whole_groups)
            stats = update_policy(
                self.actor,
                batch,
                c.algorithm,
                temperature=self.temperature,
                micro_batch_size=c.trainer.micro_batch_size,
                grad_clip=c.optim.grad_clip,
                objective=objective,
                measure_gap=not self.recompute,
                max_tokens=budget,
                packed=c.trainer.pack_sequences,
                generator=self.shuffle(),
            )
            free_gradients(self.actor)  # not kept through generation
            return {**stats, **moved}  # the padding as rolled out, before the rows moved

    def shuffle(self) -> torch.Generator:
        """The generator that deals the step's next mini-batches (a policy update, PPO's critic), from
        (seed, step, call): every rank, and one process, deal the same."""
        self.updates += 1
        return torch.Generator().manual_seed((self.cfg.trainer.seed * 1_000_003 + self.step) * 64 + self.updates)

    def sync(self) -> None:
        """Wake the engine and load all of the policy's weights into it (one ``load_weights``).
        First the device memory the trainer no longer uses goes back to the driver
        (``return_memory``): an SGLang engine wakes in its own processes, which cannot use blocks
        this process's allocator keeps cached."""
        with self.timer("sync"):
            return_memory(self.ctx.device)
            self.engine.wake()
            self.metrics["sync/gib"] = sync_weights(self.actor, self.engine, self.cfg.rollout, self.cfg.model.dtype)


def sampling_seed(seed: int, step: int, stream: int, first: int) -> int:
    """The engine seed of sample ``first`` of (``seed``, ``step``, ``stream``): ``key * 2**32 + first``
    with a 31-bit key, so sample ``first + k`` gets ``seed + k < 2**63`` as long as ``first + k <
    2**32`` (a step's samples). SGLang holds ``sampling_seed`` in an int64 and refuses larger values
    (0.5.23 sampling/sampling_params.py:302-312, sampling_batch_info.py:157-171); the native engine
    reads any int mod 2**64. A key below 2**31 is the one a 32-bit key gave, so those seeds are
    unchanged; only (seed, step) pairs whose 32-bit key overflowed int64 draw differently."""
    if not 0 <= first < 2**32:
        raise ValueError(f"sampling_seed: first={first} must be in [0, 2**32) (a sample's place in its step)")
    key = (seed * 1_000_003 + step * 16 + stream) % 2**31
    return key * 2**32 + first


def reward_items(rollouts: list[Rollout], texts: list[str], examples: list) -> list[RewardItem]:
    """One RewardItem per rollout; ``examples[r.prompt_index]`` is its prompt's data.Example."""
    return [
        RewardItem(examples[r.prompt_index].prompt, t, examples[r.prompt_index].answer, examples[r.prompt_index].meta)
        for r, t in zip(rollouts, texts)
    ]


def info_means(results, prefix: str) -> dict[str, float]:
    """Means of the numeric / boolean ``info`` fields that every result carries (e.g. ``exact``)."""
    if not results:
        return {}
    keys = set.intersection(*(set(r.info) for r in results))
    out = {}
    for k in sorted(keys):
        vals = [r.info[k] for r in results]
        if all(isinstance(v, (bool, int, float)) for v in vals):
            out[f"{prefix}{k}"] = sum(float(v) for v in vals) / len(vals)
    return out


def setup_run(ctx: DistContext, cfg: Config) -> Run:
    """Seeds, output directory, model (after the SFT warm start when sft.steps > 0), tokenizer,
    policy, frozen reference, rollout engine, metrics log."""
    torch.manual_seed(cfg.trainer.seed + ctx.rank)
    out = cfg.trainer.output_dir
    prepare_output_dir(cfg, ctx, out)
    model_path = resolve_model(cfg, ctx)
    if cfg.sft.steps > 0:  # warm start (reused once done)
        model_path = run_sft(ctx, cfg, model_path)
    tok = load_tokenizer(model_path)
    build = dict(
        dtype=cfg.model.dtype,
        device=ctx.device,
        world_size=ctx.world_size,
        liger=cfg.model.liger,
        packed=cfg.trainer.pack_sequences,
        share_prompts=cfg.trainer.share_prompts,
        compile=cfg.trainer.compile,
    )
    updates = cfg.trainer.total_steps * cfg.algorithm.ppo_epochs * cfg.algorithm.mini_batches
    actor = build_actor(
        model_path, optim=cfg.optim, total_updates=updates, checkpointing=cfg.trainer.gradient_checkpointing, **build
    )
    ref = build_actor(model_path, **build) if recipe(cfg.algorithm.name).needs_reference(cfg) else None
    engine = make_engine(
        cfg.rollout, model_path, dtype=cfg.model.dtype, device=ctx.device, seed=cfg.trainer.seed + ctx.rank
    )
    log = RunLog(
        out,
        enabled=ctx.is_main,
        total=cfg.trainer.total_steps,
        start=None,
        progress=cfg.trainer.progress,
        trackers=TrackerSettings.of(cfg),
    )
    return Run(ctx, cfg, out, model_path, tok, actor, ref, engine, log, memory=PhaseMemory(ctx.device))


def _resume(run: Run, recipe) -> int:
    for path in clean_checkpoints(run.ctx, run.out):
        run.log.write(f"removed an unfinished checkpoint (a killed save): {path}")
    ckpt = latest_checkpoint(run.out) if run.cfg.trainer.resume else None
    if not ckpt:
        run.log.restart_at(0)
        return 0
    others = recipe.actors() if hasattr(recipe, "actors") else None
    state = load_checkpoint(run.actor, run.ctx, ckpt, others)
    if hasattr(recipe, "load_state_dict"):
        path = os.path.join(ckpt, f"recipe_rank{run.ctx.rank}.pt")
        recipe.load_state_dict(torch.load(path, weights_only=False))
    run.log.restart_at(state["step"])
    run.log.write(f"resumed from {ckpt} at step {state['step']}")
    return state["step"]


def _save(run: Run, recipe, step: int) -> None:
    extra = {}
    if hasattr(recipe, "state_dict"):
        extra[f"recipe_rank{run.ctx.rank}.pt"] = recipe.state_dict()
    others = recipe.actors() if hasattr(recipe, "actors") else None
    save_checkpoint(
        run.actor,
        run.tok,
        run.ctx,
        run.out,
        step,
        {"model_path": run.model_path},
        extra_files=extra,
        others=others,
        keep_last=run.cfg.trainer.keep_last,
        dtype=run.cfg.model.dtype,
    )


def run_recipe(ctx: DistContext, cfg: Config, make_recipe: Callable[[Run], Any]) -> dict:
    """Set up, resume, loop over steps (metrics, evaluation, checkpoints), evaluate, summarise.

    A SIGTERM / SIGINT (fastcrit.train.preempt) stops the run after the step in progress, with a
    checkpoint of that step, by raising ``Stopped`` on every rank; during the set-up (the SFT warm
    start included) it stops without one, at the next point all ranks reach (an SFT step's end, or
    here before the first step). A signal during the last step lets the run finish."""
    run = setup_run(ctx, cfg)
    with run.log:  # its trackers close on every way out: an error, a stop, the end
        return _steps(run, make_recipe)


def _steps(run: Run, make_recipe: Callable[[Run], Any]) -> dict:
    ctx, cfg = run.ctx, run.cfg
    recipe = make_recipe(run)
    t = cfg.trainer
    try:
        start = _resume(run, recipe)
        run.sync()  # the engine starts from the policy's weights
        first = _first_evaluation(run, recipe, start)
        if start < t.total_steps:
            stop_if_asked(start or None)  # a signal during the set-up: nothing new to save
        history: list[float] = []
        last = first if start == t.total_steps else {}
        for step in range(start + 1, t.total_steps + 1):
            run.times, run.tokens, run.metrics = {}, 0, {}
            run.step, run.updates = step, 0
            run.memory.clear()
            t0 = time.perf_counter()
            metrics = recipe.step(step)
            dt = time.perf_counter() - t0
            compiled = compile_stats() if cfg.trainer.compile else {}  # this process's, so far
            row = all_reduce_mean(
                {
                    **metrics,
                    **run.metrics,
                    **run.times,
                    **compiled,
                    "time/step_s": dt,
                    "throughput/tokens_per_s": run.tokens / dt,
                }
            )
            mem = sorted(run.memory.metrics)  # the largest rank's: the one nearest to running out
            row.update(zip(mem, all_reduce([run.memory.metrics[k] for k in mem], "max")))
            row["throughput/tokens_per_s"] *= ctx.world_size  # all processes together
            # The final evaluation goes to the summary; it joins the row only on the eval_every
            # schedule (so a run stopped early and resumed logs the same rows as a straight one).
            if t.eval_every and step % t.eval_every == 0:
                row.update(recipe.evaluate())
                last = {k: row[k] for k in row if k.startswith("val/")}
            elif step == t.total_steps:
                last = recipe.evaluate()
            run.log.log({"step": step, **row})
            history.append(row.get("reward/mean", float("nan")))
            stop = agree_to_stop()  # one collective: every rank stops after this same step, or none
            if step == t.total_steps or (t.save_every and step % t.save_every == 0) or stop:
                _save(run, recipe, step)
            if stop and step < t.total_steps:
                raise Stopped(stop, step)
    finally:
        if hasattr(recipe, "close"):
            recipe.close()
        run.engine.close()
        run.log.close_bar()
    return _summarise(run, recipe, start, history, first, last)


def _first_evaluation(run: Run, recipe, start: int) -> dict:
    """The evaluation of the model training started from: run at step 0 and kept in
    ``eval_start.json``, so a resumed run's summary still compares with the true start."""
    path = os.path.join(run.out, "eval_start.json")
    if start > 0 and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    first = recipe.evaluate()
    if first:
        run.log.write(f"step {start}: " + _fmt(first))
        if start == 0 and run.ctx.is_main:
            with open(path + ".tmp", "w") as f:  # read back on resume: never half-written
                json.dump(first, f)
            os.replace(path + ".tmp", path)
    return first


def _fmt(metrics: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in metrics.items() if isinstance(v, float))


def _summarise(run: Run, recipe, start: int, history: list[float], first: dict, last: dict) -> dict:
    k = max(1, min(10, len(history) // 4)) if history else 0
    summary = {
        "steps": run.cfg.trainer.total_steps,
        "resumed_from": start,
        "train_reward_first": sum(history[:k]) / k if k else None,
        "train_reward_last": sum(history[-k:]) / k if k else None,
    }
    for key in sorted(set(first) | set(last)):
        name = key.split("/", 1)[-1]
        summary[f"val_{name}_start"] = first.get(key)
        summary[f"val_{name}_end"] = last.get(key)
    if hasattr(recipe, "summary"):
        summary.update(recipe.summary(first, last))
    summary["checkpoint"] = latest_checkpoint(run.out)
    run.log.summary(run.cfg.trainer.total_steps, summary)
    if run.ctx.is_main:
        with open(os.path.join(run.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        lines = [f"done: {summary['steps']} steps, output in {run.out}"]
        if k:
            lines.append(
                f"  train reward (mean of first/last {k} steps): "
                f"{summary['train_reward_first']:.3f} -> {summary['train_reward_last']:.3f}"
            )
        for key in sorted(set(first) & set(last)):
            lines.append(f"  {key} (start -> end): {first[key]:.3f} -> {last[key]:.3f}")
        if hasattr(recipe, "summary_lines"):
            lines += recipe.summary_lines(summary)
        lines.append(f"  checkpoint: {summary['checkpoint']}")
        print("\n".join(lines), flush=True)
    return summary
