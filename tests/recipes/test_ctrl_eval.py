"""`fastcrit critique`: the paper's protocol (k solutions per problem, seeds with mean ± standard
error, pass@1 / pass@k / Δ↑ / Δ↓ per round) with its baselines in the same table, on tiny models."""

import json
import math
import os

import pytest

from fastcrit.cli import main
from fastcrit.data.problems import Problem
from fastcrit.data.tasks import task_path
from fastcrit.recipes.ctrl.evaluate import combine, format_table, mean_se
from fastcrit.recipes.ctrl.rounds import Attempt, pass_at_k

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CPU_CONFIG = os.path.join(ROOT, "configs", "cpu", "ctrl.yaml")


def test_mean_and_standard_error_over_seeds():
    m = mean_se([0.5, 0.7, 0.6])
    assert m["mean"] == pytest.approx(0.6) and m["se"] == pytest.approx(math.sqrt(0.01) / math.sqrt(3))
    assert mean_se([0.4])["se"] is None
    table = combine({"generator": [{"pass@1": 0.5, "pass@k": 0.8}, {"pass@1": 0.7, "pass@k": 0.9}], "none": []})
    assert set(table) == {"generator"} and table["generator"]["pass@k"]["runs"] == [0.8, 0.9]
    lines = format_table(table, 5)
    assert "pass@5" in lines[0] and "generator (evaluated" in lines[1] and "0.600 ± 0.100" in lines[1]
    assert "pass@5" not in format_table(table, 1)[0]  # one solution: pass@k is pass@1


def test_pass_at_k_counts_a_problem_once_one_of_its_chains_passes():
    p = Problem.from_dict({"id": "p", "question": "q", "test_kind": "assert", "tests": ["assert True"]})
    a = [Attempt(p, "", ok, float(ok), []) for ok in (False, True, False, False, False, False)]
    assert pass_at_k(a, 3) == 0.5 and pass_at_k(a, 1) == pytest.approx(1 / 6) and pass_at_k(a, 6) == 1.0


BARS = []  # the progress bars `fastcrit critique` made in the run below


class RecordingBar:
    def __init__(self, **kw):
        self.kw, self.n, self.shown, self.closed = kw, 0, [], False
        BARS.append(self)

    def update(self, n):
        self.n += n

    def set_postfix_str(self, text):
        self.shown.append(text)

    def close(self):
        self.closed = True


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from fastcrit.models.hf import resolve_model_path

    d = tmp_path_factory.mktemp("eval")
    model = resolve_model_path("tiny:hidden=64,layers=2,heads=2,kv_heads=1,intermediate=128")
    val = d / "val.jsonl"
    with open(task_path("minicode", "test")) as f, open(val, "w") as g:
        g.writelines(line for _, line in zip(range(4), f))
    out = str(d / "run")
    sets = [
        f"model.path={model}",
        f"proxy.model.path={model}",
        f"ctrl.critic={model}",
        f"data.val={val}",
        "data.val_size=4",
        "rollout.max_new_tokens=8",
        "proxy.rollout.max_new_tokens=6",
        "sandbox.workers=1",
        "ctrl.eval_solutions=3",
        "ctrl.eval_seeds=2",
        "ctrl.rounds=2",
        "ctrl.critique_temperature=1.0",
        "ctrl.critique_samples=2",
        "ctrl.solution_temperature=1.0",
        f"trainer.output_dir={out}",
    ]
    argv = ["critique", CPU_CONFIG]
    for s in sets:
        argv += ["--set", s]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("fastcrit.recipes.ctrl.evaluate.tqdm", RecordingBar)
        assert main(argv) == 0
    with open(os.path.join(out, "critique_summary.json")) as f:
        return out, json.load(f)


def test_the_table_has_every_method_over_every_seed(run):
    out, s = run
    assert s["seeds"] == [0, 1] and s["solutions_per_problem"] == 3 and s["prompts"] == "compact"
    assert list(s["methods"]) == [
        "generator_greedy",
        "generator",
        "critic_round_1",
        "critic_round_2",
        "no_critique",
        "self_critique",
        "execution_feedback",
    ]
    assert len(s["methods"]["generator_greedy"]["pass@1"]["runs"]) == 1  # greedy has no seed
    for name in ("generator", "critic_round_1", "critic_round_2", "no_critique", "self_critique", "execution_feedback"):
        m = s["methods"][name]
        assert len(m["pass@1"]["runs"]) == 2 and m["pass@1"]["se"] is not None
        assert all(k >= p for k, p in zip(m["pass@k"]["runs"], m["pass@1"]["runs"]))
    for name in ("critic_round_1", "self_critique"):  # a critic's round has verdicts
        assert {"judgment_acc", "valid_rate", "delta_up", "delta_down"} <= set(s["methods"][name])
    assert "judgment_acc" not in s["methods"]["no_critique"]


def test_a_progress_bar_counts_every_phase(run):
    import sys

    (bar,) = BARS
    phases = ["generator greedy"] + [
        f"seed {s}: {what}"
        for s in (0, 1)
        for what in ("solutions", "2 critique rounds", "no_critique", "self_critique", "execution_feedback")
    ]
    assert bar.kw["total"] == bar.n == len(phases) and bar.closed
    assert bar.shown == phases + [""]  # each phase named while it runs
    assert bar.kw["file"] is sys.stderr and bar.kw["disable"] is None  # none when stderr is no terminal


def test_records_cover_every_chain_of_every_seed(run):
    out, s = run
    with open(s["records"]) as f:
        recs = [json.loads(line) for line in f]
    assert len(recs) == 2 * 2 * 4 * 3 * 2  # seeds x rounds x problems x solutions x critique samples
    first = [r for r in recs if r["seed"] == 0 and r["round"] == 1]
    assert s["methods"]["critic_round_1"]["pass@1"]["runs"][0] == pytest.approx(
        sum(r["passed_after"] for r in first) / len(first)
    )
    with open(s["baseline_records"]) as f:
        base = [json.loads(line) for line in f]
    by = {m: [r for r in base if r["method"] == m and r["seed"] == 1] for m in ("no_critique", "execution_feedback")}
    assert len(by["no_critique"]) == 12 and len(by["execution_feedback"]) == 12
    assert all(
        r["prompt"] == "Please finalize your answer accordingly using the same format." for r in by["no_critique"]
    )
    failing = [r for r in by["execution_feedback"] if not r["passed_before"]]
    assert failing and all("The answer" in r["prompt"] and "assert" in r["prompt"] for r in failing)
    assert s["methods"]["no_critique"]["pass@1"]["runs"][1] == pytest.approx(
        sum(r["passed_after"] for r in by["no_critique"]) / 12
    )
