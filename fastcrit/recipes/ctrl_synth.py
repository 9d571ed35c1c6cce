"""CTRL stage 1: synthetic critiques from execution feedback (`fastcrit ctrl-synth CONFIG`).

The generator samples ``ctrl.solutions_per_problem`` solutions per training problem (and one per
held-out problem, for evaluation); the sandbox runs them; each training solution gets a critique
written from what the execution showed (the failing test with expected and actual values, or the
error) whose judgment is the real outcome. Writes to ``ctrl.synth_dir``:

- ``solutions_train.jsonl`` / ``solutions_val.jsonl``: problem, solution, outcome, failures
  (stage 2's (problem, initial solution) pairs and the evaluation's starting point);
- ``critic_sft.jsonl``: chat rows [critique prompt -> synthetic critique] for `fastcrit sft`;
- ``synth_summary.json`` and ``COMPLETE`` (a directory without it is redone).

Runs on rank 0 (the others wait): for a large generator, serve it and set ``proxy.endpoint``.
"""
from __future__ import annotations

import json
import os
import shutil

from fastcrit.config import Config
from fastcrit.data.critique import critique_messages, synthetic_critique
from fastcrit.recipes.critique import execute, sample_solutions
from fastcrit.recipes.ctrl_common import (attempt_row, critic_sft_path, load_problem_set, make_generator,
                                          solutions_path, synth_complete, synth_dir)
from fastcrit.reward import make_reward
from fastcrit.reward.code import extract_program
from fastcrit.train.dist import DistContext, barrier


def run_synth(ctx: DistContext, cfg: Config) -> str:
    """Stage 1 into ``synth_dir(cfg)`` (kept when already complete); returns the directory."""
    out = synth_dir(cfg)
    if synth_complete(out):
        return out
    if ctx.is_main:
        _synthesise(cfg, out, ctx.device)
    barrier()
    return out


def _synthesise(cfg: Config, out: str, device) -> None:
    shutil.rmtree(out, ignore_errors=True)  # a partial earlier attempt
    os.makedirs(out)
    splits = {"train": load_problem_set(cfg.data.train, cfg.data.format, what="data.train")}
    if cfg.data.val:
        splits["val"] = load_problem_set(cfg.data.val, cfg.data.format, limit=cfg.data.val_size,
                                         what="data.val")
    generator, reward = make_generator(cfg, device), make_reward(cfg, out)
    summary: dict = {"generator": generator.name}
    try:
        for split, problems in splits.items():
            k = cfg.ctrl.solutions_per_problem if split == "train" else 1
            sols = sample_solutions(generator, problems, k=k, temperature=cfg.ctrl.solution_temperature,
                                    max_new_tokens=cfg.proxy.rollout.max_new_tokens, seed=solution_seed(cfg, split))
            attempts = execute(reward, [p for p, _ in sols], [t for _, t in sols])
            with open(solutions_path(out, split), "w") as f:
                for a in attempts:
                    f.write(json.dumps(attempt_row(a)) + "\n")
            summary[split] = {"problems": len(problems), "solutions": len(attempts),
                              "pass@1": sum(a.passed for a in attempts) / max(len(attempts), 1)}
            if split == "train":
                summary["critic_sft"] = _write_sft(attempts, critic_sft_path(out), cfg.ctrl.sft_balance)
    finally:
        reward.close()
        generator.close()
    with open(os.path.join(out, "synth_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    open(os.path.join(out, "COMPLETE"), "w").close()
    print(f"ctrl-synth: {out}: " + "; ".join(
        f"{s}: {v['solutions']} solutions, pass@1 {v['pass@1']:.3f}" for s, v in summary.items()
        if isinstance(v, dict) and "solutions" in v)
        + f"; critic SFT rows: {summary['critic_sft']}", flush=True)


def solution_seed(cfg: Config, split: str) -> int:
    """The seed of a split's initial solutions: ``trainer.seed`` for training, ``ctrl.val_seed``
    for the held-out problems (the same solutions whatever the training seed)."""
    return cfg.trainer.seed * 1_000_003 if split == "train" else cfg.ctrl.val_seed * 1_000_003 + 1


def _write_sft(attempts, path: str, balance: bool) -> dict:
    """Chat rows [critique prompt -> synthetic critique]; with ``balance`` the rarer judgment's
    rows are repeated (in order, cycling) until both judgments have as many rows."""
    rows = {True: [], False: []}
    for a in attempts:
        code, _ = extract_program(a.solution)
        refs = a.problem.solutions
        reference = extract_program(refs[0])[0] if refs else None
        critique = synthetic_critique(a.passed, a.failures, code, reference)
        rows[a.passed].append({"messages": critique_messages(a.problem.question, a.solution)
                               + [{"role": "assistant", "content": critique}],
                               "problem_id": a.problem.id, "passed": a.passed})
    counts = {"Correct": len(rows[True]), "Incorrect": len(rows[False])}
    if balance and rows[True] and rows[False]:
        n = max(len(rows[True]), len(rows[False]))
        for k in rows:
            rows[k] = [rows[k][i % len(rows[k])] for i in range(n)]
        counts["repeated"] = 2 * n - counts["Correct"] - counts["Incorrect"]
    with open(path, "w") as f:  # order is irrelevant: SFT reads a seeded permutation
        for r in rows[True] + rows[False]:
            f.write(json.dumps(r) + "\n")
    return counts
