"""CTRL's critiques: the judgment rule, reviews, synthetic critiques (prompts: test_ctrl_prompts.py)."""

import pytest

from fastcrit.data.critique import (
    apply_edit,
    key_lines,
    line_edit,
    parse_judgment,
    read_review,
    review_agrees,
    suggested_edit,
    synthetic_critique,
    word_review,
)


@pytest.mark.parametrize(
    "text, want",
    [
        ("Analysis: ok.\nImprovement suggestions: none.\nOverall judgment: Correct", True),
        ("Analysis: no.\nImprovement suggestions: x.\nOverall judgment: Incorrect", False),
        ("Overall judgment: **Incorrect**", False),
        ("Overall judgment: Correct\n... on second thought\nOverall judgment: Incorrect", False),
        ("Analysis: fine.\nImprovement suggestions: none.\nOverall judgement: Correct", None),  # spelling
        ("Overall judgment: correct", None),  # the paper's words, capitalised
        ("Overall judgment: Correctness unclear", None),
        ("The code is Correct.", None),
        ("", None),
    ],
)
def test_judgment_rule(text, want):
    assert parse_judgment(text) is want


def test_synthetic_critique_is_grounded_and_its_judgment_is_the_outcome():
    ref = "def g(xs):\n    return max(xs) * 6 + 4\n"
    bad = "def g(xs):\n    return max(xs) * 6 + 5\n"
    c = synthetic_critique(False, ["AssertionError: assert g([1]) == 10 (returned 11)"], bad, ref)
    assert parse_judgment(c) is False
    assert c.startswith(
        "Analysis: the code's line, checked: `return max(xs) * 6 + [5 -> 4]`. "
        "AssertionError: assert g([1]) == 10 (returned 11).\n"
    )
    # the suggestion is a targeted edit of the code, not the answer: applied, it gives the reference
    assert "\nImprovement suggestions: change `+ 5` to `+ 4`.\n" in c
    assert suggested_edit(c) == ("+ 5", "+ 4") and apply_edit(bad, suggested_edit(c)) == ref
    good = synthetic_critique(True, [], ref, ref)
    assert parse_judgment(good) is True and "Every test passes." in good and suggested_edit(good) is None
    assert good.startswith("Analysis: the code's line, checked: `return max(xs) * 6 + 4`. Every test passes.")
    # lines whose words do not pair up are named whole
    c = synthetic_critique(False, ["f"], "def g(x):\n    return x\n", "def g(x):\n    return max(x, 2) + 1\n")
    assert "the problem needs `return max(x, 2) + 1` and the code has `return x`" in c
    assert suggested_edit(c) == ("x", "max(x, 2) + 1")
    # no reference, or a rewrite in several lines: the feedback alone, and no edit
    c = synthetic_critique(False, ["ZeroDivisionError: division by zero"], "x = 1/0\nprint(x)\n", None)
    assert parse_judgment(c) is False and "ZeroDivisionError" in c and suggested_edit(c) is None
    assert key_lines("a\nb\nc\n", "a\nB\nC\n") is None and key_lines("a\nb", "a\nb") == ("b", "b")
    assert key_lines("a\nb", "a") is None and key_lines("a\nb", "a\nc") == ("c", "b")


@pytest.mark.parametrize(
    "has, needed, edit",
    [
        ("return x * 7 + 7", "return x * 6 + 7", ("* 7", "* 6")),  # a number with its operator
        ("return x * 7 - 7", "return x * 7 + 7", ("- 7", "+ 7")),  # an operator with its operand
        ("return x % 7 + 2", "return x // 7 + 2", ("% 7", "// 7")),
        ("return min(x, 7) * 3", "return max(x, 7) * 3", ("min(x, 7)", "max(x, 7)")),  # the call closed
        ("return min(x, 8) * 3", "return min(x, 7) * 3", ("min(x, 8)", "min(x, 7)")),
        ("return (x + 4) * 3", "return (x - 4) * 3", ("(x + 4)", "(x - 4)")),
        ("return x + 3 * 2", "return (x + 3) * 2", ("x + 3", "(x + 3)")),  # parentheses added
        ("return sum(xs) * 3 + 2", "return len(xs) * 3 + 2", ("sum(xs)", "len(xs)")),
        ("return x + 7 + 7", "return x * 7 + 7", ("x + 7", "x * 7")),  # "+ 7" twice: one place named
        ("return x", "return x * 7", ("x", "x * 7")),  # a part added: with its neighbour
        ("return x * 7", "return x * 7", None),
    ],
)
def test_line_edit_names_one_part_of_the_line_and_applies_to_it(has, needed, edit):
    assert line_edit(needed, has) == edit
    if edit:
        code = f"def f(x):\n    {has}\n"
        assert apply_edit(code, edit) == f"def f(x):\n    {needed}\n"


def test_apply_edit_needs_one_place_and_a_change():
    code = "def f(x):\n    return  x * 7 +  7\n"
    assert apply_edit(code, ("* 7", "* 6")) == "def f(x):\n    return x * 6 + 7\n"  # spaces aside
    assert apply_edit(code, ("7", "6")) is None  # twice in the code: which one?
    assert apply_edit(code, ("* 5", "* 6")) is None  # not in the code
    assert apply_edit(code, ("* 7", "* 7")) is None  # no change
    assert apply_edit(code, ("x *7", "x * 6")) is None  # whole words: "*7" is no word of it
    assert apply_edit("def f(x):\n    return x*7\n", ("* 7", "* 6")) is None


def test_word_review_marks_each_differing_word_where_it_stands():
    assert word_review("return x * 2", "return x * 3") == "return x * [3 -> 2]"
    assert word_review("return (x + 3) * 2", "return x + 3 * 2") == "return [x -> (x] + [3 -> 3)] * 2"
    assert word_review("return max(xs) + 1", "return max(xs) + 1") == "return max(xs) + 1"
    assert word_review("return x * 2", "return x") is None  # words that do not pair up
    # read back: the line the problem needs (right sides) and the line the code has (left sides)
    c = synthetic_critique(False, ["e"], "def g(x):\n    return x + 3 * 2\n", "def g(x):\n    return (x + 3) * 2\n")
    assert read_review(c) == [("return (x + 3) * 2", "return x + 3 * 2")]
    assert read_review("Analysis: the problem needs `return y` and the code has `return x`.") == [
        ("return y", "return x")
    ]
    assert read_review("Analysis: fine.") == []


def test_review_agrees_checks_the_verdict_against_the_critique_s_own_review():
    ref, bad = "def g(x):\n    return x * 6 + 4\n", "def g(x):\n    return x * 6 + 5\n"
    wrong = synthetic_critique(False, ["AssertionError: x"], bad, ref)
    right = synthetic_critique(True, [], ref, ref)
    assert review_agrees(wrong) is True and review_agrees(right) is True
    assert review_agrees(wrong.replace("Overall judgment: Incorrect", "Overall judgment: Correct")) is False
    assert review_agrees(right.replace("Overall judgment: Correct", "Overall judgment: Incorrect")) is False
    # a word marked as different where both sides are the same: not true to its review
    assert review_agrees(wrong.replace("[5 -> 4]", "[5 -> 5]")) is False
    assert review_agrees(right.replace("+ 4`", "+ [4 -> 4]`").replace("Correct", "Incorrect")) is False
    assert review_agrees("Analysis: fine.\nOverall judgment: Correct") is None  # no review
    # a whole-line review (the words do not pair up): the verdict must follow it
    line = synthetic_critique(
        False, ["AssertionError: x"], "def g(x):\n    return x\n", "def g(x):\n    return max(x, 3) * 2\n"
    )
    assert "the problem needs `return max(x, 3) * 2` and the code has `return x`" in line
    assert review_agrees(line) is True
    same = "Analysis: the problem needs `return x` and the code has `return x`.\nOverall judgment: {}"
    assert review_agrees(same.format("Correct")) is True and review_agrees(same.format("Incorrect")) is False
    assert review_agrees(wrong.replace("Overall judgment: Incorrect", "")) is None  # no verdict


def test_review_agrees_given_the_code_checks_that_the_review_quotes_it_truly():
    ref, bad = "def g(x):\n    return x * 6 + 4\n", "def g(x):\n    return x * 6 + 5\n"
    wrong, right = synthetic_critique(False, ["AssertionError: x"], bad, ref), synthetic_critique(True, [], ref, ref)
    assert review_agrees(wrong, bad) is True and review_agrees(right, ref) is True
    assert review_agrees(wrong, f"```python\n{bad}```") is True  # fenced, as answers are
    assert review_agrees(wrong, "def g(x):\n    return  x *  6 +  5") is True  # spacing aside
    # true to itself, not to the code: it copies "+ 4" where the code has "+ 5"
    assert review_agrees(right) is True and review_agrees(right, bad) is False
    assert review_agrees(wrong, ref) is False  # the code's side "+ 5" is not in the reviewed code
    # a Correct verdict may not suggest a change, with or without the code
    sneak = right.replace("none.", "change `+ 4` to `+ 3`.")
    assert review_agrees(sneak) is False and review_agrees(sneak, ref) is False
    assert review_agrees(right.replace("none.", "change `+ 4` to `+ 4`."), ref) is True  # no change
    line = "Analysis: the problem needs `return x` and the code has `return y`.\nOverall judgment: Incorrect"
    assert review_agrees(line, "return y") is True and review_agrees(line, "return x") is False
    assert review_agrees("Analysis: fine.\nOverall judgment: Correct", ref) is None
    # an Incorrect verdict's edit must change something, be the change its review states, and
    # (given the code) apply to it: its old part once in the code
    own = wrong.replace("change `+ 5` to `+ 4`.", "change `+ 5` to `+ 5`.")
    assert own != wrong and review_agrees(own) is False and review_agrees(own, bad) is False
    other = wrong.replace("change `+ 5` to `+ 4`.", "change `* 6` to `* 7`.")
    assert other != wrong and review_agrees(other) is False and review_agrees(other, bad) is False
    bare = "Analysis: fine.\nImprovement suggestions: change `+ 4` to `+ 3`.\nOverall judgment: Incorrect"
    assert review_agrees(bare) is None and review_agrees(bare, ref) is None  # a real change, no review
    assert review_agrees(bare, bad) is False  # "+ 4" is not in that code
