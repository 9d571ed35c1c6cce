"""The shipped minicode task: files equal the generator, held-out problems are new, tests are real."""
import json

import pytest

from fastcrit.data.critique import parse_judgment, suggested_line
from fastcrit.data.datasets import load_dataset
from fastcrit.data.minicode import INPUTS, Spec, bugs, evaluate, make_minicode, nudge
from fastcrit.data.problems import Problem
from fastcrit.data.tasks import task_path


@pytest.fixture(scope="module")
def made():
    return make_minicode()


def test_shipped_files_equal_the_generator(made):
    for split in ("train", "test", "coder"):
        with open(task_path("minicode", split)) as f:
            assert [json.loads(line) for line in f] == made[split], split


def test_nudge_changes_the_last_constant():
    assert nudge("max(xs) * 6 + 4") == "max(xs) * 6 + 5"
    assert nudge("(x - 3) * 9") == "(x - 3) * 10"


def test_held_out_problems_are_new_combinations_and_enough(made):
    key = lambda r: (r["meta"]["template"], r["meta"]["a"], r["meta"]["b"])  # noqa: E731
    train, test = {key(r) for r in made["train"]}, [key(r) for r in made["test"]]
    assert len(test) >= 200 and len(set(test)) == len(test)
    assert not train & set(test)
    questions = {r["question"] for r in made["train"]}
    assert not questions & {r["question"] for r in made["test"]}


def test_every_bug_fails_a_test_and_references_pass_in_the_sandbox(made):
    from fastcrit.sandbox import SyncSandboxPool, probe

    probs = [Problem.from_dict(r) for r in made["test"][:40]]
    jobs, want = [], []
    for p in probs:
        spec = Spec(p.meta["template"], p.meta["a"], p.meta["b"], p.entry_point)
        assert p.solutions == [spec.code()]
        jobs.append(p.job(spec.code()))
        want.append(True)
        for e in bugs(spec):
            assert [evaluate(e, spec.arg, v) for v in INPUTS[spec.arg]] != \
                [evaluate(spec.expr, spec.arg, v) for v in INPUTS[spec.arg]]
            jobs.append(p.job(spec.code(e)))
            want.append(False)
    with SyncSandboxPool(workers=2, isolation="jail" if probe().ok else "none") as pool:
        got = [r.all_passed for r in pool.run_many(jobs)]
    assert got == want


def test_coder_rows_apply_the_critique_literally(made):
    rows = load_dataset("minicode:coder").examples
    kinds = {"solve": 0, "revise": 0}
    for ex in rows:
        kinds[ex.meta["kind"]] += 1
        if ex.meta["kind"] == "solve":
            assert len(ex.messages) == 1
            continue
        question, before, critique = ex.messages[0]["content"], ex.messages[1]["content"], ex.messages[2]["content"]
        line, judged = suggested_line(critique), parse_judgment(critique)
        assert judged is not None
        head = before.split("    return ")[0]
        if judged is True:  # judged correct: kept
            assert ex.answer == before
        elif line and f"    {line}\n" not in before:  # a new line: applied
            assert ex.answer == head + f"    {line}\n```"
        else:  # incorrect with nothing new to apply: changed anyway, always the same way
            expr = before.split("    return ")[1].split("\n")[0]
            assert ex.answer == head + f"    return {nudge(expr)}\n```" != before
    assert kinds["revise"] == 3 * kinds["solve"]
    # about 60% of the solve rows hold a wrong answer: the generator learns to err often
    reference = {p["question"]: f"```python\n{p['solutions'][0]}```" for p in made["train"]}
    solves = [r["messages"] for r in made["coder"] if r["kind"] == "solve"]
    wrong = sum(m[1]["content"] != reference[m[0]["content"]] for m in solves) / len(solves)
    assert 0.55 < wrong < 0.65
