"""What the tiny minicode coder (CTRL's generator and proxy) does, measured: run after
`fastcrit sft configs/cpu/ctrl_coder.yaml`.

    python benchmarks/probe_minicode_coder.py [CODER_DIR] [--splits test,dev] [--limit N]

Prints one JSON object per split, from the coder's greedy solutions (the starting point of
evaluation) and scripted critiques of them, every revision greedy as in `fastcrit critique`:
- ``greedy_pass@1`` and ``sampled_pass@1`` (temperature 1, seed 0): the generator alone;
- ``oracle``: a perfect critic, the stage-1 template critique (``synthetic_critique``) written from
  the real outcome and the reference solution: the round's pass@1 (the ceiling a critic can reach
  with this proxy), fixed, broken, and how often the revision is exactly the code with the
  critique's edit applied (``applied_exactly``), or kept when judged Correct;
- ``wrong_edit``: every solution called Incorrect with a wrong edit that applies to it (one of the
  coder's own one-part changes, never the fix): how often the revision applies exactly that edit;
- ``correct_verdict``: every solution called Correct: how often it is kept;
- ``vague``: every solution called Incorrect with no edit: how often it is kept;
- ``no_critique``: [problem, solution, "Please finalize..."]: how often it is kept, and pass@1.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]

from fastcrit.config import load_config
from fastcrit.data.critique import (
    NO_SUGGESTION,
    VAGUE_SUGGESTION,
    apply_edit,
    edit_suggestion,
    format_critique,
    line_edit,
    suggested_edit,
    synthetic_critique,
)
from fastcrit.data.ctrl_prompts import no_critique_messages, revision_messages
from fastcrit.data.minicode import Spec, critique_analysis, edits
from fastcrit.recipes.ctrl.rounds import execute, sample_solutions
from fastcrit.recipes.ctrl.shared import load_problem_set, make_proxy
from fastcrit.reward import make_reward
from fastcrit.reward.code import extract_program

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "cpu", "ctrl.yaml")


def program(text: str) -> str:
    return " ".join(extract_program(text)[0].split())


def spec_of(p) -> Spec:
    return Spec(p.meta["template"], p.meta["a"], p.meta["b"], p.entry_point)


def expr_of(code: str) -> str | None:
    line = [ln for ln in code.splitlines() if ln.strip().startswith("return ")]
    return line[0].strip()[len("return ") :] if len(line) == 1 else None


def wrong_critique(p, code: str, rng: random.Random) -> tuple[str, tuple[str, str]] | None:
    """An Incorrect critique, written as stage 1 writes them, whose edit applies to the code and
    does not give the reference (one of the coder's own one-part changes of the code's line)."""
    spec, expr = spec_of(p), expr_of(code)
    if expr is None:
        return None
    cands = [e for e in edits(expr) if e != spec.expr]
    rng.shuffle(cands)
    for e in cands:
        edit = line_edit(f"return {e}", f"return {expr}")
        if edit and apply_edit(code, edit) is not None:
            return format_critique(critique_analysis(spec, expr, e, False, rng), edit_suggestion(*edit), False), edit
    return None


def verdict_critique(p, code: str, correct: bool, rng: random.Random) -> str:
    """ "Correct" with the code's line reviewed as it is, or "Incorrect" with a failing test and no
    edit, as in the coder's training rows."""
    spec = spec_of(p)
    expr = expr_of(code) or spec.expr
    if correct:
        return format_critique(critique_analysis(spec, expr, expr, True, rng), NO_SUGGESTION, True)
    return format_critique(critique_analysis(spec, expr, None, False, rng), VAGUE_SUGGESTION, False)


def revise_all(proxy, attempts, critiques, tokens):
    convs = [
        revision_messages(a.problem, a.solution, c, "compact")
        if c is not None
        else no_critique_messages(a.problem, a.solution, "compact")
        for a, c in zip(attempts, critiques)
    ]
    return [o.text for o in proxy.chat(convs, max_new_tokens=tokens, temperature=0.0)]


def probe(split: str, proxy, reward, tokens: int, limit: int | None) -> dict:
    problems = load_problem_set(f"minicode:{split}", "auto", limit=limit, what=split)
    n = len(problems)
    greedy = sample_solutions(proxy, problems, k=1, temperature=0.0, max_new_tokens=tokens, seed=0, style="compact")
    sampled = sample_solutions(proxy, problems, k=1, temperature=1.0, max_new_tokens=tokens, seed=0, style="compact")
    attempts = execute(reward, problems, [t for _, t in greedy])
    samples = execute(reward, problems, [t for _, t in sampled])
    codes = [extract_program(a.solution)[0] for a in attempts]
    out = {
        "split": split,
        "problems": n,
        "greedy_pass@1": sum(a.passed for a in attempts) / n,
        "sampled_pass@1": sum(a.passed for a in samples) / n,
        "greedy_pass@1_trap": _share([a.passed for a in attempts if a.problem.meta.get("trap")]),
        "greedy_pass@1_no_trap": _share([a.passed for a in attempts if not a.problem.meta.get("trap")]),
    }

    def outcome(critiques):
        texts = revise_all(proxy, attempts, critiques, tokens)
        return texts, execute(reward, problems, texts)

    # the oracle: stage 1's critique from the real outcome and the reference
    oracle = [synthetic_critique(a.passed, a.failures, c, a.problem.solutions[0]) for a, c in zip(attempts, codes)]
    texts, after = outcome(oracle)
    failing = [i for i, a in enumerate(attempts) if not a.passed]
    passing = [i for i, a in enumerate(attempts) if a.passed]
    edited = [i for i in failing if suggested_edit(oracle[i]) and apply_edit(codes[i], suggested_edit(oracle[i]))]
    out["oracle"] = {
        "pass@1": sum(b.passed for b in after) / n,
        "fixed": f"{sum(after[i].passed for i in failing)} / {len(failing)}",
        "broken": f"{sum(not after[i].passed for i in passing)} / {len(passing)}",
        "applied_exactly": _ratio(
            [program(texts[i]) == program(apply_edit(codes[i], suggested_edit(oracle[i]))) for i in edited]
        ),
        "kept_when_correct": _ratio([program(texts[i]) == program(codes[i]) for i in passing]),
    }
    # a wrong edit that applies
    rng = random.Random(0)
    made = [wrong_critique(a.problem, c, rng) for a, c in zip(attempts, codes)]
    idx = [i for i, m in enumerate(made) if m]
    texts, after = outcome([m[0] if m else None for m in made])  # no wrong edit to make: counted nowhere
    out["wrong_edit"] = {
        "applied_exactly": _ratio([program(texts[i]) == program(apply_edit(codes[i], made[i][1])) for i in idx]),
        "kept": _ratio([program(texts[i]) == program(codes[i]) for i in idx]),
        "pass@1": sum(after[i].passed for i in idx) / max(len(idx), 1),
    }
    for name, correct in (("correct_verdict", True), ("vague", False)):
        texts, after = outcome([verdict_critique(a.problem, c, correct, rng) for a, c in zip(attempts, codes)])
        out[name] = {
            "kept": _ratio([program(t) == program(c) for t, c in zip(texts, codes)]),
            "pass@1": sum(b.passed for b in after) / n,
        }
    texts, after = outcome([None] * n)
    out["no_critique"] = {
        "kept": _ratio([program(t) == program(c) for t, c in zip(texts, codes)]),
        "pass@1": sum(b.passed for b in after) / n,
    }
    return out


def _ratio(flags) -> str:
    flags = list(flags)
    return f"{sum(flags)} / {len(flags)}"


def _share(flags) -> float | None:
    return sum(flags) / len(flags) if flags else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("coder", nargs="?", default="runs/cpu-coder/final")
    ap.add_argument("--splits", default="test,dev")
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="probe-coder-")
    cfg = load_config(CONFIG, [f"proxy.model.path={args.coder}", f"trainer.output_dir={work}"])
    proxy = make_proxy(cfg, "cpu")
    reward = make_reward(cfg, work)
    try:
        for split in args.splits.split(","):
            print(json.dumps(probe(split, proxy, reward, cfg.proxy.rollout.max_new_tokens, args.limit)), flush=True)
    finally:
        reward.close()
        proxy.close()


if __name__ == "__main__":
    main()
