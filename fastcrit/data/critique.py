"""CTRL's critiques: the judgment parser, the reviews a critique may carry, and the synthetic
critiques the template writer builds from execution feedback (stage 1, ``ctrl.synth_writer:
template``). The prompts themselves are in ``fastcrit.data.ctrl_prompts``.

A critique has three parts, as in the CTRL paper: "Analysis:", "Improvement suggestions:" and a
last line "Overall judgment: Correct" or "Overall judgment: Incorrect".
"""
from __future__ import annotations

import re

from fastcrit.data.ctrl_prompts import COMPACT_CRITIC, FINALIZE

JUDGMENT_RE = re.compile(r"Overall judgment:\s*\**\s*(Correct|Incorrect)\b")
NO_SUGGESTION = "none."

# Texts the tiny tokenizer should know as whole words (fastcrit.models.tokenizer adds them).
TEMPLATE_TEXTS = (COMPACT_CRITIC, FINALIZE, "Problem:\n", "Solution:\n", "Analysis:",
                  "Improvement suggestions:", "Overall judgment: Correct", "Overall judgment: Incorrect")


def parse_judgment(critique: str) -> bool | None:
    """True for "Overall judgment: Correct", False for "... Incorrect", None when the critique has
    neither (it then scores 0 and is not executed). The last such line decides."""
    found = JUDGMENT_RE.findall(critique)
    if not found:
        return None
    return found[-1] == "Correct"


def format_critique(analysis: str, suggestion: str, correct: bool) -> str:
    return (f"Analysis: {analysis.strip()}\nImprovement suggestions: {suggestion.strip()}\n"
            f"Overall judgment: {'Correct' if correct else 'Incorrect'}")


def _lines(code: str) -> list[str]:
    return [ln.rstrip() for ln in code.strip("\n").split("\n")]


def key_lines(solution_code: str, reference_code: str | None) -> tuple[str, str] | None:
    """(line the reference has, line the solution has) where the two differ in exactly one line;
    (last line, last line) where they are the same; None otherwise (or without a reference)."""
    if not reference_code:
        return None
    a, b = _lines(solution_code), _lines(reference_code)
    if len(a) != len(b):
        return None
    diff = [(x.strip(), y.strip()) for x, y in zip(a, b) if x.strip() != y.strip()]
    if not diff:
        return a[-1].strip(), a[-1].strip()
    if len(diff) == 1:
        return diff[0][1], diff[0][0]
    return None


def word_review(needed: str, has: str) -> str | None:
    """The code's line copied word by word, each word that differs from the line the problem needs
    written as ``[has -> needed]`` ("the code's line, checked: `return max(xs) * [5 -> 6] + 4`"), when
    the two lines have as many words; else None.

    Why this form: a critic that copies the code's line word by word has, at each word, both the
    word it is copying and the word it would write itself from the problem; it marks a difference
    where the two part, right there. The part-by-part review this replaced ("needs `* 6`, has `* 5`:
    wrong") asked it to compare two quotes written apart, which the tiny CPU critic learnt poorly:
    the same coder, training solutions and 150 SFT steps judged 0.773 of the held-out solutions right
    with this form and 0.613 with that one."""
    a, b = has.split(), needed.split()
    if len(a) != len(b):
        return None
    return " ".join(x if x == y else f"[{x} -> {y}]" for x, y in zip(a, b))


def line_review(needed: str, has: str) -> str:
    """The review of the code's line against the line the problem needs: word by word
    (``word_review``: "the code's line, checked: `return x * [5 -> 6]`"), or both lines whole when
    their words do not pair up ("the problem needs `...` and the code has `...`")."""
    review = word_review(needed, has)
    if review is None:
        return f"the problem needs `{needed}` and the code has `{has}`"
    return f"the code's line, checked: `{review}`"


def feedback_sentence(passed: bool, failures: list[str]) -> str:
    if passed:
        return "Every test passes."
    first = failures[0].strip() if failures else "the code does not pass the tests"
    return first if first.endswith(".") else first + "."


def synthetic_critique(passed: bool, failures: list[str], solution_code: str,
                       reference_code: str | None) -> str:
    """A critique grounded in execution feedback, whose judgment is the real outcome.

    Where the solution and a reference solution differ in one line (or not at all), the analysis
    copies the code's line word by word, each word that differs from the reference's written as
    ``[has -> needed]`` ("the code's line, checked: `return max(xs) * 6 + [5 -> 4]`"), or names both
    lines when their words do not pair up (``line_review``); then it says what the execution showed:
    the first failing test with expected and actual values, or the error (the
    sandbox's message), or that every test passes. The suggestion is the needed line when there is
    one, else a request to make the failing case hold. Departure from the paper: CTRL has a strong
    model write the critique from the execution feedback; here the writer is this function, and it
    also reads the reference solution.
    """
    lines = key_lines(solution_code, reference_code)
    analysis = feedback_sentence(passed, failures)
    if lines:
        analysis = f"{line_review(*lines)}. {analysis}"
    if passed:
        return format_critique(analysis, NO_SUGGESTION, True)
    if lines and lines[0] != lines[1]:
        suggestion = f"use `{lines[0]}`."
    else:
        suggestion = VAGUE_SUGGESTION
    return format_critique(analysis, suggestion, False)


VAGUE_SUGGESTION = "change the code so that the failing case gives the expected result."
SUGGESTION_RE = re.compile(r"Improvement suggestions:\s*use `([^`\n]+)`")


def suggested_line(critique: str) -> str | None:
    """The line a critique suggests ("Improvement suggestions: use `...`"), if any."""
    m = SUGGESTION_RE.search(critique)
    return m.group(1).strip() if m else None


_REVIEW_RE = re.compile(r"the code's line, checked: `([^`\n]*)`")
_DIFF_RE = re.compile(r"\[([^\[\]\n]*?) -> ([^\[\]\n]*?)\]")
_LINE_RE = re.compile(r"needs `([^`\n]*)` and the code has `([^`\n]*)`")


def _squash(text: str) -> str:
    return " ".join(text.split())


def read_review(critique: str, words: list[str] | None = None) -> list[tuple[str, str]]:
    """The (needed, has) line pairs a critique's reviews state: from a word-by-word review, the line
    with every ``[has -> needed]`` read as its right side and as its left side; from a whole-line
    review, its two lines. Empty when it has no review. ``words``: its word-by-word reviews, when
    the caller has found them already."""
    words = _REVIEW_RE.findall(critique) if words is None else words
    pairs = [(_DIFF_RE.sub(lambda m: m.group(2), r), _DIFF_RE.sub(lambda m: m.group(1), r)) for r in words]
    return pairs + _LINE_RE.findall(critique)


def review_agrees(critique: str, code: str | None = None) -> bool | None:
    """Whether a critique is true to its own review: the verdict Incorrect exactly when its review
    states a difference between what the problem needs and what the code has (a word marked
    ``[has -> needed]``, or two different whole lines), and no word marked as different where both
    sides are the same. Given the reviewed ``code``, the review must also quote it truly (the line
    it says the code has occurs in it, spaces aside), and a Correct verdict may not suggest a line
    the code does not have, nor an Incorrect one a line it already has (this holds with or without
    a review). None when it has no such review or no verdict."""
    verdict = parse_judgment(critique)
    if verdict is None:
        return None
    if code is not None:
        line = suggested_line(critique)
        if line is not None and verdict != (_squash(line) in map(_squash, code.splitlines())):
            return False  # Correct with a line the code lacks; Incorrect with one it has
    words = _REVIEW_RE.findall(critique)
    pairs = read_review(critique, words)
    if not pairs:
        return None
    if any(_squash(x) == _squash(y) for r in words for x, y in _DIFF_RE.findall(r)):
        return False  # a word marked [x -> x]: a difference where both sides are the same
    if code is not None:
        text = _squash(code)
        if any(_squash(has) not in text for _, has in pairs):
            return False
    return verdict == all(_squash(needs) == _squash(has) for needs, has in pairs)
