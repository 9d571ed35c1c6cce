"""CTRL stage 1: synthetic critiques from execution feedback (`fastcrit ctrl-synth CONFIG`, and the
start of `fastcrit train` / `fastcrit sft` for CTRL when the directory is not complete).

The generator samples ``ctrl.solutions_per_problem`` solutions per training problem (and one per
held-out problem, for evaluation), asked in the prompts of ``ctrl.prompts``; the sandbox runs them;
each training solution gets a critique written from what the execution showed (the failing test
with expected and actual values, or the error): by a writer model told it as a hint it must not
reveal, or by a template (``ctrl.synth_writer``; fastcrit.recipes.ctrl.writer, which drops and
counts the model's critiques that leak the hint, lack a verdict or judge against the execution).
``synthesise`` is that unit of work: problems in, rows out. Writes to ``ctrl.synth_dir``:

- ``solutions_train.jsonl`` / ``solutions_val.jsonl``: problem, solution, outcome, failures, in
  problem order (stage 2's (problem, initial solution) pairs and the evaluation's starting point);
- ``critic_sft.jsonl``: chat rows [critique prompt -> synthetic critique] for `fastcrit sft`;
- ``synth_summary.json`` (with the writer's kept and filtered counts, and one dropped critique per
  reason) and ``COMPLETE``, written last (a directory with it is kept as it is).

Across ranks (fastcrit.train.shards): each split's problems are cut into chunks of
``ctrl.synth_chunk``, dealt round robin over the ranks. Every rank samples its chunks on its own
device's generator and runs them in its own sandbox pool, and writes each finished chunk to
``<synth_dir>/parts/`` (whole or not at all). Rank 0 then merges the chunks, in order, into the
files above and writes ``COMPLETE``; the others wait for it. All waiting is polling on files, never
a collective, since a share or the merge can outlast ``trainer.dist_timeout_s``; a rank gives up
with an error naming the missing chunks and their ranks when no new chunk has appeared for
``trainer.stage_wait_s``. Once every rank has seen ``COMPLETE``, ``parts/`` is removed. `fastcrit
ctrl-synth` runs the same code as one rank.

Restart: the chunks in ``parts/`` are kept and only the others are done, by whichever ranks the new
world size deals them to; a chunk cut short by a kill never reached its name and is done again.
``parts/plan.json`` holds the settings the chunks were made with (problems, generator, seeds,
lengths, sandbox limits, chunk size); a restart with other settings stops and says which differ.

Seeds: solution j of a split (problem-major: problem i's k solutions are i k ... i k + k - 1)
draws from the split's seed + j (``solution_seed``; a chunk's call starts at its first solution's
seed, and LocalChat / HTTPChat draw conversation c of a call from seed + c), so a sample does not
depend on the rank or the chunk that draws it. Chunks are cut the same under any world size, so
every generate call sees the same batch, and the files are the same whatever the number of ranks
and wherever a run was interrupted.

Sandbox: every rank runs its own pool at the same time, so ``sandbox.workers`` (0 = every CPU),
``sandbox.max_concurrency`` and ``sandbox.remote_concurrency`` count for the whole node here: each
of a node's L ranks gets 1/L of them (at least 1). ``proxy.concurrency`` (an endpoint generator's
requests in flight) is per rank.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass

from tqdm import tqdm

from fastcrit.config import Config, ConfigError
from fastcrit.data.problems import Problem
from fastcrit.recipes.ctrl.rounds import Attempt, execute, sample_solutions
from fastcrit.recipes.ctrl.shared import (
    attempt_row,
    critic_sft_path,
    generator_name,
    load_problem_set,
    make_generator,
    solutions_path,
    synth_complete,
    synth_dir,
)
from fastcrit.recipes.ctrl.writer import FILTERS, Written, make_writer, write_critiques, writer_name
from fastcrit.reward import make_reward
from fastcrit.sandbox.types import SandboxConfig
from fastcrit.train.dist import DistContext, barrier, local_world_size
from fastcrit.train.shards import Chunk, ChunkFiles, ShardError, cut, dealt, missing_message, wait_for, write_atomically


@dataclass
class Synthesis:
    """What stage 1 makes of some problems."""

    attempts: list[Attempt]  # k per problem, problem-major, with their outcomes
    # the critic SFT chat rows (writer.critique_row) the writer kept, and what it dropped;
    # None for held-out problems
    critiques: Written | None


def synthesise(
    generator,
    reward,
    problems: list[Problem],
    *,
    k: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    write=None,
    style: str = "paper",
    top_p: float = 1.0,
) -> Synthesis:
    """Stage 1's unit of work: ``k`` sampled solutions per problem, run in the sandbox, and (with
    ``write``: attempts -> ``Written``) a critique of each from its execution. Solution j
    (problem-major) draws from ``seed + j``."""
    sols = sample_solutions(
        generator,
        problems,
        k=k,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        seed=seed,
        style=style,
        top_p=top_p,
    )
    attempts = execute(reward, [p for p, _ in sols], [t for _, t in sols])
    return Synthesis(attempts, write(attempts) if write is not None else None)


def solution_seed(cfg: Config, split: str) -> int:
    """The seed of a split's initial solutions: ``trainer.seed`` for training, ``ctrl.val_seed``
    for the held-out problems (the same solutions whatever the training seed)."""
    return cfg.trainer.seed * 1_000_003 if split == "train" else cfg.ctrl.val_seed * 1_000_003 + 1


def solution_temperature(cfg: Config, split: str) -> float:
    """The training solutions' temperature, or the held-out ones' (``ctrl.eval_temperature``)."""
    c = cfg.ctrl
    return c.solution_temperature if split == "train" or c.eval_temperature is None else c.eval_temperature


def solutions_per_problem(cfg: Config, split: str) -> int:
    return cfg.ctrl.solutions_per_problem if split == "train" else 1


def rank_sandbox(sandbox: SandboxConfig, ranks_here: int) -> SandboxConfig:
    """One rank's sandbox settings where ``ranks_here`` ranks of a node run their pools at once: the
    node's workers (0 = every CPU), jobs in flight and remote requests shared out, at least 1 each."""

    def share(n: int) -> int:
        return max(1, n // ranks_here)

    return dataclasses.replace(
        sandbox,
        workers=share(sandbox.worker_count()),
        max_concurrency=share(sandbox.max_concurrency),
        remote_concurrency=share(sandbox.remote_concurrency),
    )


# ---------------------------------------------------------------------------------------------
# Across ranks


def run_synth(ctx: DistContext, cfg: Config) -> str:
    """Stage 1 into ``synth_dir(cfg)``, on every rank (kept when already complete); returns the
    directory once it is complete."""
    out = synth_dir(cfg)
    if synth_complete(out):
        return _checked(cfg, out)
    splits = _problem_sets(cfg, log=print if ctx.is_main else _quiet)
    files = ChunkFiles(os.path.join(out, "parts"))
    plan = _plan(cfg, splits)
    try:  # before any chunk: no chunk exists without the plan it was made with
        files.settle_plan(plan)
    except ShardError as e:
        raise ConfigError(f"ctrl.synth_dir: {e}") from None
    chunks = cut([(s, len(ps)) for s, ps in splits.items()], cfg.ctrl.synth_chunk)
    mine = [c for c in dealt(chunks, ctx.rank, ctx.world_size) if not files.done(c)]
    if ctx.is_main:
        done = len(chunks) - len(files.missing(chunks))
        print(
            f"ctrl-synth: {out}: {len(chunks)} chunks of up to {cfg.ctrl.synth_chunk} problems over "
            f"{ctx.world_size} rank(s)" + (f"; resuming, {done} already written" if done else ""),
            flush=True,
        )
    if mine:
        _run_chunks(ctx, cfg, splits, files, mine)
    wait_s = cfg.trainer.stage_wait_s
    if ctx.is_main:
        wait_for(
            lambda: not files.missing(chunks),
            files.count,
            wait_s=wait_s,
            failure=lambda: missing_message(files, chunks, ctx.world_size, wait_s, "trainer.stage_wait_s"),
        )
        _merge(out, files, chunks, plan, cfg.ctrl.sft_balance)
    else:

        def failure() -> str:
            if files.missing(chunks):
                return missing_message(files, chunks, ctx.world_size, wait_s, "trainer.stage_wait_s")
            return (
                f"{out}: every chunk is written but rank 0 has not merged them within {wait_s:g} s "
                "(trainer.stage_wait_s): it died, hangs, or writes where this rank cannot see (every node "
                "must share trainer.output_dir); its own output says which"
            )

        wait_for(lambda: synth_complete(out), files.count, wait_s=wait_s, failure=failure)
    barrier()  # every rank has seen COMPLETE (so no rank reads the chunks any more): one wait of a poll
    if ctx.is_main:
        shutil.rmtree(files.directory, ignore_errors=True)
    return _checked(cfg, out)


def _checked(cfg: Config, out: str) -> str:
    """``out``, unless the critic's SFT needs its critiques and the writer kept none (every rank
    stops with the same error, naming what the filters dropped)."""
    path = os.path.join(out, "synth_summary.json")
    if cfg.sft.steps <= 0 or cfg.sft.data or not os.path.exists(path):
        return out
    with open(path) as f:
        writer = json.load(f).get("writer", {})
    if writer and not writer.get("kept"):
        raise ConfigError(
            f"ctrl.synth_writer: {writer.get('name')} wrote no critique the filters kept "
            f"(dropped: {writer.get('filtered')}; examples in {path}), so the critic's SFT has no data. "
            "Use a stronger writer (ctrl.synth_writer_model / ctrl.synth_writer_endpoint), longer critiques "
            "(rollout.max_new_tokens), ctrl.synth_writer=template, or sft.steps=0; then delete "
            f"{out} to write them again"
        )
    return out


def _quiet(msg: str) -> None:
    pass


def _problem_sets(cfg: Config, log) -> dict[str, list[Problem]]:
    strict = cfg.data.strict
    splits = {"train": load_problem_set(cfg.data.train, cfg.data.format, what="data.train", log=log, strict=strict)}
    if cfg.data.val:
        splits["val"] = load_problem_set(
            cfg.data.val, cfg.data.format, limit=cfg.data.val_size, what="data.val", log=log, strict=strict
        )
    return splits


def _plan(cfg: Config, splits: dict[str, list[Problem]]) -> dict:
    """What the chunks' contents depend on (compared on a restart). Not the world size: any rank
    may do any chunk."""

    def digest(problems: list[Problem]) -> str:
        h = hashlib.sha256()
        for p in problems:
            h.update(json.dumps(p.to_dict(), sort_keys=True).encode())
            h.update(b"\n")
        return h.hexdigest()

    return {
        "chunk_problems": cfg.ctrl.synth_chunk,
        "generator": generator_name(cfg),
        "engine": cfg.proxy.rollout.engine,
        "dtype": cfg.proxy.model.dtype if cfg.ctrl.generator or cfg.proxy.model.path else cfg.model.dtype,
        "max_prompt_len": cfg.proxy.max_prompt_len,
        "solution_temperature": cfg.ctrl.solution_temperature,
        "solution_top_p": cfg.ctrl.solution_top_p,
        "max_new_tokens": cfg.proxy.rollout.max_new_tokens,
        "prompts": cfg.ctrl.prompts,
        "writer": {
            "name": writer_name(cfg),
            "temperature": cfg.ctrl.synth_writer_temperature,
            "top_p": cfg.ctrl.synth_writer_top_p,
            "max_new_tokens": cfg.rollout.max_new_tokens,
        },
        "sandbox": {"timeout_s": cfg.sandbox.timeout_s, "memory_mb": cfg.sandbox.memory_mb},
        "splits": {
            s: {
                "problems": len(ps),
                "sha256": digest(ps),
                "solutions_per_problem": solutions_per_problem(cfg, s),
                "temperature": solution_temperature(cfg, s),
                "seed": solution_seed(cfg, s),
            }
            for s, ps in splits.items()
        },
    }


def _run_chunks(
    ctx: DistContext, cfg: Config, splits: dict[str, list[Problem]], files: ChunkFiles, chunks: list[Chunk]
) -> None:
    """This rank's chunks, each written as soon as it is done."""
    generator = make_generator(cfg, ctx.device)
    reward = writer = owned = None
    try:
        writer, owned = make_writer(cfg, ctx.device, generator)
        rank_cfg = dataclasses.replace(cfg, sandbox=rank_sandbox(cfg.sandbox, local_world_size(ctx.world_size)))
        reward = make_reward(rank_cfg, files.directory, ctx.rank)  # its result cache goes with the parts
        # rank 0's chunks, on stderr; disable=None: none when stderr is not a terminal
        bar = tqdm(
            total=len(chunks),
            desc="ctrl-synth",
            unit="chunk",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=None if cfg.trainer.progress and ctx.is_main else True,
        )
        for c in chunks:
            t0 = time.perf_counter()
            k = solutions_per_problem(cfg, c.split)
            seed = solution_seed(cfg, c.split) + c.start * k
            write = (
                None
                if c.split != "train"
                else (lambda attempts, seed=seed: write_critiques(cfg, writer, attempts, seed=seed + 500_009))
            )
            made = synthesise(
                generator,
                reward,
                splits[c.split][c.start : c.stop],
                k=k,
                temperature=solution_temperature(cfg, c.split),
                max_new_tokens=cfg.proxy.rollout.max_new_tokens,
                seed=seed,
                write=write,
                style=cfg.ctrl.prompts,
                top_p=cfg.ctrl.solution_top_p,
            )
            w = made.critiques
            files.write(
                c,
                [{"solution": attempt_row(a)} for a in made.attempts]
                + (
                    []
                    if w is None
                    else [{"critique": r} for r in w.rows] + [{"filtered": dict(w.filtered), "examples": w.examples}]
                ),
            )
            passed = sum(a.passed for a in made.attempts) / max(len(made.attempts), 1)
            dropped = "" if w is None or not w.filtered else f", critiques dropped {dict(w.filtered)}"
            bar.write(
                f"ctrl-synth: rank {ctx.rank}: {c.name} ({c.split} problems {c.start}-{c.stop - 1}): "
                f"{len(made.attempts)} solutions, pass@1 {passed:.3f}{dropped}, "
                f"{time.perf_counter() - t0:.1f} s",
                file=sys.stdout,
            )  # above the bar
            sys.stdout.flush()
            bar.update(1)
        bar.close()
    finally:
        if reward is not None:
            reward.close()
        if owned:
            writer.close()
        generator.close()


def _merge(out: str, files: ChunkFiles, chunks: list[Chunk], plan: dict, balance: bool) -> None:
    """The chunks, in order, into the files stage 2 reads; ``COMPLETE`` last."""
    summary: dict = {"generator": plan["generator"], "prompts": plan["prompts"]}
    critiques: list[dict] = []
    dropped = Written([])
    for split, info in plan["splits"].items():
        counts = {"solutions": 0, "passed": 0}
        mine = [c for c in chunks if c.split == split]
        write_atomically(
            solutions_path(out, split),
            _solution_lines(files, mine, info["solutions_per_problem"], counts, critiques, dropped),
        )
        summary[split] = {
            "problems": info["problems"],
            "solutions": counts["solutions"],
            "pass@1": counts["passed"] / max(counts["solutions"], 1),
        }
    summary["writer"] = {
        "name": plan["writer"]["name"],
        "kept": len(critiques),
        "filtered": {k: dropped.filtered.get(k, 0) for k in FILTERS},
        "examples": dropped.examples,
    }
    summary["critic_sft"] = _write_sft(critiques, critic_sft_path(out), balance)
    write_atomically(os.path.join(out, "synth_summary.json"), [json.dumps(summary, indent=1)])
    write_atomically(os.path.join(out, "COMPLETE"), [])
    print(
        f"ctrl-synth: {out}: "
        + "; ".join(
            f"{s}: {v['solutions']} solutions, pass@1 {v['pass@1']:.3f}"
            for s, v in summary.items()
            if isinstance(v, dict) and "solutions" in v
        )
        + f"; critiques by {summary['writer']['name']}: {len(critiques)} kept"
        + (f", dropped {dict(dropped.filtered)}" if dropped.filtered else "")
        + f"; critic SFT rows: {summary['critic_sft']}",
        flush=True,
    )


def _solution_lines(
    files: ChunkFiles, chunks: list[Chunk], k: int, counts: dict, critiques: list[dict], dropped: Written
):
    """The chunks' solution rows as lines, in order, one chunk in memory at a time; counts them
    (``counts``) and collects the critique rows (``critiques``) and the writer's filter counts
    (``dropped``) on the way."""
    for c in chunks:
        rows = files.read(c)
        sols = [r["solution"] for r in rows if "solution" in r]
        if len(sols) != len(c) * k:
            raise ShardError(
                f"{files.path(c)}: {len(sols)} solutions for {len(c)} problems x {k}; "
                "delete it to have the chunk done again"
            )
        critiques.extend(r["critique"] for r in rows if "critique" in r)
        for r in rows:
            if "filtered" in r:
                dropped.filtered.update(r["filtered"])
                for why, ex in r["examples"].items():
                    dropped.examples.setdefault(why, ex)
        counts["solutions"] += len(sols)
        counts["passed"] += sum(bool(r["passed"]) for r in sols)
        for r in sols:
            yield json.dumps(r) + "\n"


def _write_sft(rows: list[dict], path: str, balance: bool) -> dict:
    """The critique rows (``critique_row``); with ``balance`` the rarer judgment's rows are
    repeated (in order, cycling) until both judgments have as many rows."""
    by = {True: [r for r in rows if r["passed"]], False: [r for r in rows if not r["passed"]]}
    counts = {"Correct": len(by[True]), "Incorrect": len(by[False])}
    if balance and by[True] and by[False]:
        n = max(len(by[True]), len(by[False]))
        for k in by:
            by[k] = [by[k][i % len(by[k])] for i in range(n)]
        counts["repeated"] = 2 * n - counts["Correct"] - counts["Incorrect"]
    # order is irrelevant: SFT reads a seeded permutation
    write_atomically(path, (json.dumps(r) + "\n" for r in by[True] + by[False]))
    return counts
