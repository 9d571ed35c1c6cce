"""The `math` reward: symbolic equivalence by math-verify, and a score with a reason (never an
exception) for responses without an answer or with LaTeX that does not parse."""

import threading

import pytest

from fastcrit.reward import RewardItem, get_reward_manager
from fastcrit.reward.math_answer import math_score


@pytest.mark.parametrize(
    "response,answer",
    [
        ("so the answer is \\boxed{\\frac{1}{2}}", "0.5"),
        ("The answer is 1/2", "\\frac12"),
        ("x = 3, so the answer is $4$", "4"),
        ("\\boxed{x^2+2x+1}", "(x+1)^2"),
        ("first \\boxed{7}, no wait: \\boxed{3}", "\\boxed{3}"),  # the last boxed answer counts
        ("The result is 12.", "12"),
    ],
)
def test_equivalent_answers_score_1(response, answer):
    r = math_score(response, answer)
    assert r.score == 1.0 and r.info["correct"] is True and r.info["no_answer"] is False


HALF = ("1/2", "0.5", "\\frac{1}{2}")


@pytest.mark.parametrize("said", HALF)
@pytest.mark.parametrize("reference", HALF)
def test_one_half_in_any_form_matches_any_other(said, reference):
    """1/2, 0.5 and \\frac{1}{2} agree both ways, boxed or bare, and none of them equals 1/3."""
    for response in (f"so \\boxed{{{said}}}", f"The answer is {said}"):
        assert math_score(response, reference).score == 1.0, (response, reference)
    assert math_score(f"\\boxed{{{said}}}", "1/3").score == 0.0


@pytest.mark.parametrize(
    "response,answer",
    [
        ("\\boxed{2}", "3"),
        ("\\boxed{3}, or maybe \\boxed{2}", "3"),
        ("1/3", "0.33"),  # not string-close: symbolically different
    ],
)
def test_different_answers_score_0(response, answer):
    assert math_score(response, answer).score == 0.0


def test_bad_output_is_a_score_with_a_reason():
    none = math_score("I do not know", "3")
    assert none.score == 0.0 and none.info["no_answer"] is True and none.info["reason"] == "no answer found"
    broken = math_score("\\boxed{\\frac{1}{", "1/2")
    assert broken.score == 0.0 and "does not parse as math" in broken.info["reason"]
    bad_ref = math_score("\\boxed{3}", "")
    assert bad_ref.score == 0.0 and "reference answer" in bad_ref.info["reason"]


def test_math_manager_by_name_and_off_the_main_thread():
    mgr = get_reward_manager("math")
    items = [RewardItem("p", "\\boxed{6}", "6"), RewardItem("p", "no idea", "6")]
    assert [r.score for r in mgr(items)] == [1.0, 0.0]
    out = []
    t = threading.Thread(target=lambda: out.extend(mgr(items)))  # math-verify's timeouts use signals
    t.start()
    t.join()
    assert [r.score for r in out] == [1.0, 0.0]
