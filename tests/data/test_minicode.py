"""The shipped minicode task: files equal the generator, the splits are apart, every bug a coder can
write fails a test, the coder's misconceptions and its revise rows are what the design says."""

import ast
import collections
import json

import pytest

from fastcrit.data.critique import FINALIZE, apply_edit, parse_judgment, suggested_edit
from fastcrit.data.datasets import load_dataset
from fastcrit.data.minicode import POOL, TEMPLATES, Spec, bugs, edits, evaluate, inputs_for, make_minicode, variants
from fastcrit.data.problems import Problem
from fastcrit.data.tasks import task_path

SPLITS = ("train", "dev", "test")


@pytest.fixture(scope="module")
def made():
    return make_minicode()


def spec_of(row: dict) -> Spec:
    return Spec(row["meta"]["template"], row["meta"]["a"], row["meta"]["b"], row["entry_point"])


def test_shipped_files_equal_the_generator(made):
    for split in (*SPLITS, "coder"):
        with open(task_path("minicode", split)) as f:
            assert [json.loads(line) for line in f] == made[split], split


def test_held_out_and_dev_problems_are_new_combinations_and_enough(made):
    key = lambda r: (r["meta"]["template"], r["meta"]["a"], r["meta"]["b"])
    train, dev, test = ({key(r) for r in made[s]} for s in SPLITS)
    assert len(made["test"]) == len(test) == 300 and len(made["dev"]) == len(dev) == 200
    assert not train & test and not train & dev and not dev & test
    questions = {r["question"] for r in made["train"]}
    assert not questions & {r["question"] for r in made["test"] + made["dev"]}


def test_every_one_part_change_of_every_shipped_answer_fails_a_test(made):
    """Any other constant, operator or function of its kind, or the parentheses dropped: either it
    fails one of the problem's own tests, or it equals the answer on every input of the pool (it is
    the answer, as (x + 3) * 1 is x + 3 * 1)."""
    checked = 0
    for split in SPLITS:
        for row in made[split]:
            spec = spec_of(row)
            calls = [ast.parse(t[len("assert ") :], mode="eval").body.left for t in row["tests"]]
            inputs = [ast.literal_eval(c.args[0]) for c in calls]
            expected = [ast.literal_eval(t.split(" == ")[1]) for t in row["tests"]]
            assert len(row["tests"]) == 5 and inputs == inputs_for(spec)
            assert [evaluate(spec.expr, spec.arg, v) for v in inputs] == expected
            failing = set()
            for e in variants(spec.expr, spec.arg):
                if [evaluate(e, spec.arg, v) for v in inputs] != expected:
                    failing.add(e)
                else:
                    assert all(evaluate(e, spec.arg, v) == evaluate(spec.expr, spec.arg, v) for v in POOL[spec.arg]), (
                        row["id"],
                        e,
                    )
            assert bugs(spec) and set(bugs(spec)) <= failing  # the coder's own bugs among them
            checked += len(failing)
    assert checked > 30 * sum(len(made[s]) for s in SPLITS)


def test_variants_cover_the_changes_the_tests_must_catch():
    spec = Spec(2, 3, 5, "f")  # (x + 3) * 5
    v = variants(spec.expr, spec.arg)
    assert {"(x + 4) * 5", "(x + 3) * 0", "(x - 3) * 5", "(x + 3) // 5", "x + 3 * 5"} <= set(v)
    assert spec.expr not in v
    assert {"max(xs) * 2 + 1", "len(xs) * 2 + 1", "min(xs) * 2 + 1"} <= set(variants("sum(xs) * 2 + 1", "xs"))


def test_the_misconceptions_are_fixed_one_part_bugs_on_about_half_the_problems(made):
    for split in SPLITS:
        traps = [spec_of(r).trap for r in made[split]]
        assert all(r["meta"]["trap"] == (t is not None) for r, t in zip(made[split], traps))
        assert 0.4 < sum(t is not None for t in traps) / len(traps) < 0.6, split
    for t in range(len(TEMPLATES)):
        assert Spec(t, 2, 1, "f").trap is None  # small constants: none
        big = Spec(t, 9, 9, "f")
        assert big.trap in bugs(big) and big.trap in edits(big.expr)
    assert Spec(2, 7, 1, "f").trap is None  # x + 7 * 1 is (x + 7) * 1


def test_the_coder_s_solve_rows_follow_its_misconceptions(made):
    by_q = {r["question"]: spec_of(r) for r in made["train"]}
    counts = collections.Counter()
    for r in made["coder"]:
        if r["kind"] != "solve":
            continue
        spec = by_q[r["messages"][0]["content"]]
        answer = r["messages"][1]["content"]
        right = answer == spec.answer()
        counts[
            "trap" if spec.trap else "plain",
            "trap" if spec.trap and answer == spec.answer(spec.trap) else "right" if right else "bug",
        ] += 1
        assert right or any(answer == spec.answer(e) for e in bugs(spec))
    trap = sum(v for (k, _), v in counts.items() if k == "trap")
    plain = sum(v for (k, _), v in counts.items() if k == "plain")
    assert 0.75 < counts["trap", "trap"] / trap < 0.85
    assert 0.65 < counts["plain", "right"] / plain < 0.75


def test_every_revision_applies_exactly_what_its_critique_says(made):
    rows = load_dataset("minicode:coder").examples
    kinds = collections.Counter()
    reference = {p["question"]: f"```python\n{p['solutions'][0]}```" for p in made["train"]}
    right_edit = []
    for ex in rows:
        kind = ex.meta["kind"]
        kinds[kind] += 1
        if kind == "solve":
            assert len(ex.messages) == 1
            continue
        question, before, turn = (m["content"] for m in ex.messages)
        if kind == "finalize":  # no critique: the answer kept
            assert turn == FINALIZE and ex.answer == before
            continue
        assert turn.endswith(f"\n\n{FINALIZE}")
        judged, edit = parse_judgment(turn), suggested_edit(turn)
        assert judged is not None
        applied = apply_edit(before, edit) if edit and not judged else None
        if applied is not None:  # an edit that applies: exactly that edit, nothing else
            assert ex.answer == applied != before
            right_edit.append(ex.answer == reference[question])
        else:  # judged correct, no edit, or one that does not apply: kept
            assert ex.answer == before
    assert kinds["revise"] + kinds["finalize"] == kinds["solve"] == 3 * len(made["train"])
    assert 0.15 < kinds["finalize"] / (kinds["revise"] + kinds["finalize"]) < 0.25
    # the edit is right about half the time: the proxy learns to follow it, not to fix code itself
    assert 0.4 < sum(right_edit) / len(right_edit) < 0.6


def test_references_pass_and_the_misconceptions_fail_in_the_sandbox(made):
    from fastcrit.sandbox import SyncSandboxPool, probe

    probs = [Problem.from_dict(r) for r in made["test"][:30] + made["dev"][:10]]
    jobs, want = [], []
    for p in probs:
        spec = Spec(p.meta["template"], p.meta["a"], p.meta["b"], p.entry_point)
        assert p.solutions == [spec.code()]
        for e in [spec.expr, *([spec.trap] if spec.trap else []), *bugs(spec)[:3]]:
            jobs.append(p.job(spec.code(e)))
            want.append(e == spec.expr)
    with SyncSandboxPool(workers=2, isolation="jail" if probe().ok else "none") as pool:
        got = [r.all_passed for r in pool.run_many(jobs)]
    assert got == want
