"""The shipped math task: files equal the generator, splits are disjoint, and every SFT target is
right under the `math` reward, often in a form that only math-verify sees as the reference."""

import json
import re
from fractions import Fraction

import pytest

from fastcrit.data.datasets import load_dataset
from fastcrit.data.math_words import decimal, forms, make_math
from fastcrit.data.tasks import task_path
from fastcrit.reward import RewardItem, get_reward_manager


@pytest.fixture(scope="module")
def shipped():
    out = {}
    for split in ("train", "test", "sft"):
        with open(task_path("math", split)) as f:
            out[split] = [json.loads(line) for line in f]
    return out


def test_shipped_files_equal_the_generator(shipped):
    assert shipped == make_math()


def test_splits_are_disjoint_and_rows_well_formed(shipped):
    train, test = shipped["train"], shipped["test"]
    assert (len(train), len(test)) == (4000, 200)
    prompts = [r["prompt"] for r in train + test]
    assert len(set(prompts)) == len(prompts)
    for r in train + test:
        assert set(r) == {"prompt", "answer", "task"} and r["task"] == "math"
        assert re.fullmatch(r"\d+|\d+/\d+|\d+\.\d+", r["answer"]), r["answer"]
    fractional = [r for r in test if not r["answer"].isdigit()]
    assert len(fractional) >= 40  # the held-out split has fraction and decimal references too


def test_sft_rows_are_the_training_problems_with_boxed_targets(shipped):
    examples = load_dataset("math:sft").examples
    assert [e.prompt for e in examples] == [r["prompt"] for r in shipped["train"]]
    assert all(re.search(r", so \\boxed\{[^{}]*(\{\d+\}\{\d+\})?\}$", e.answer) for e in examples)


def test_every_sft_target_scores_1_under_the_math_reward(shipped):
    mgr = get_reward_manager("math")
    items = [
        RewardItem(r["prompt"], e.answer, r["answer"])
        for r, e in zip(shipped["train"], load_dataset("math:sft").examples)
    ]
    results = mgr(items)
    wrong = [(it.response, it.answer) for it, res in zip(items, results) if res.score != 1.0]
    assert not wrong, wrong[:5]
    # ... and the equivalence is needed: many targets box another form than the reference's.
    other_form = [it for it in items if f"\\boxed{{{it.answer}}}" not in it.response]
    assert len(other_form) >= 300
    assert mgr([RewardItem("p", "1 / 2, so \\boxed{\\frac{1}{3}}", "1/2")])[0].score == 0.0


def test_forms_of_a_value():
    assert forms(Fraction(7)) == ["7"]
    assert forms(Fraction(1, 4)) == ["1/4", "\\frac{1}{4}", "0.25"]
    assert forms(Fraction(1, 3)) == ["1/3", "\\frac{1}{3}"]
    assert decimal(Fraction(19, 5)) == "3.8" and decimal(Fraction(2, 3)) is None
