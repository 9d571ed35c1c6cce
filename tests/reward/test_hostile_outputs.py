"""Model outputs written to break a reward: each one once hung it (a regex that backtracks
quadratically, sympy on a huge number), or scored a wrong output as right. Every bound here is a
verdict reached in time, not a longer wait. Sizes are chosen so that the old code took seconds
(it took minutes at 100 kB); the new one takes milliseconds."""

import time

import pytest

from fastcrit.data.critique import parse_judgment, review_agrees
from fastcrit.reward import RewardItem, get_reward_manager, math_answer
from fastcrit.reward.code import extract_program
from fastcrit.reward.math_answer import math_score


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def test_an_unclosable_fence_line_is_read_in_linear_time():
    # "```" + a long info string ending in a backtick is no fence; the old pattern tried every split
    # of the line between two runs (60 kB: ~9 s; 100 kB: minutes)
    (program, rule), took = timed(extract_program, "```" + "a" * 60_000 + "`")
    assert rule == "raw" and took < 1.0
    assert extract_program("``` python extra\nprint(1)\n```")[0] == "print(1)\n"  # info string: first word


def test_a_judgment_after_a_long_run_of_spaces_is_read_in_linear_time():
    verdict, took = timed(parse_judgment, "Overall judgment:" + " " * 30_000 + "maybe")
    assert verdict is None and took < 1.0
    assert parse_judgment("Overall judgment:   ** Incorrect**") is False
    assert parse_judgment("Overall judgment:\n\nCorrect") is True


def test_a_review_full_of_arrows_is_read_in_linear_time():
    critique = "the code's line, checked: `[" + " -> " * 6_000 + "`\nOverall judgment: Incorrect"
    verdict, took = timed(review_agrees, critique)
    assert took < 1.0 and verdict is False  # no closed bracket: no difference stated, yet "Incorrect"
    # the first " -> " splits a bracket, as before
    assert review_agrees("the code's line, checked: `return [x -> y -> z]`\nOverall judgment: Incorrect") is True


def test_a_raro_verdict_after_a_long_run_of_spaces_is_read_in_linear_time():
    mgr = get_reward_manager("raro")
    items = [
        RewardItem("q", "[" + " " * 15_000 + "x", "", {"expert_pos": 1}),
        RewardItem("q", "[ ** answer 1 ** ]", "", {"expert_pos": 1}),
    ]
    out, took = timed(mgr, items)
    assert took < 1.0
    assert out[0].info["unparseable"] is True and out[1].score == 1.0


@pytest.fixture
def short_deadline(monkeypatch):
    # the deadline covers the whole check; 1 s keeps the test quick (the old code used the same
    # constant for math-verify's own per-step timeouts, whose expiry it reported as a wrong answer)
    monkeypatch.setattr(math_answer, "TIMEOUT_S", 1.0)


@pytest.mark.parametrize("huge", ["\\boxed{10^{10^{10^{10}}}}", "\\boxed{(10^{10})!}"])
def test_an_answer_sympy_cannot_finish_is_a_timeout_verdict(short_deadline, huge):
    r, took = timed(math_score, huge, "3")
    assert r.score == 0.0 and r.info["timeout"] is True and "took more than 1 s" in r.info["reason"]
    assert took < 2.5
    assert math_score("\\boxed{3}", "3").info == {"correct": True, "no_answer": False, "timeout": False, "answer": "3"}


def test_an_overlong_boxed_answer_is_refused_unparsed(short_deadline):
    r, took = timed(math_score, "\\boxed{" + "1" * 200_000 + "}", "3")
    assert r.score == 0.0 and "200000 characters > 1000" in r.info["reason"] and r.info["timeout"] is False
    assert took < 0.9


def test_a_long_unboxed_run_of_numbers_is_searched_at_its_end_only(short_deadline):
    # math-verify's expression pattern is quadratic on "1 1 1 ...": 40 kB used up the time budget
    r, took = timed(math_score, "1 " * 20_000, "3")
    assert r.info["timeout"] is False and r.score == 0.0 and took < 0.9
    assert math_score("1 " * 20_000 + "so the answer is 3", "3").score == 1.0


@pytest.mark.parametrize("response", ["", "   \n", "anything"])
def test_a_row_without_a_reference_pays_no_output(response):
    # a missing answer column loads as ""; an empty output "matched" it and scored 1.0
    items = [RewardItem("p", response, "  "), RewardItem("p", response, "", {"task": "reverse"})]
    exact = get_reward_manager("exact_match")(items)
    assert [x.score for x in exact] == [0.0, 0.0] and "no reference answer" in exact[0].info["reason"]
    rule = get_reward_manager("rule")(items)
    assert [x.score for x in rule] == [0.0, 0.0] and [x.info["exact"] for x in rule] == [False, False]
    assert get_reward_manager("reverse")(items)[1].info["exact"] is False
