"""CTRL's critiques: the judgment parser, the reviews a critique may carry, and the synthetic
critiques the template writer builds from execution feedback (stage 1, ``ctrl.synth_writer:
template``). The prompts themselves are in ``fastcrit.data.ctrl_prompts``.

A critique has three parts, as in the CTRL paper: "Analysis:", "Improvement suggestions:" and a
last line "Overall judgment: Correct" or "Overall judgment: Incorrect".
"""

from __future__ import annotations

import re

from fastcrit.data.ctrl_prompts import COMPACT_CRITIC, FINALIZE

# Spaces, then optional emphasis and more spaces: the old "\s*\**\s*" let its two space runs share
# a long run of spaces, so "Overall judgment:" and 100 kB of spaces (a critic's output) took minutes.
JUDGMENT_RE = re.compile(r"Overall judgment:\s*(?:\*+\s*)?(Correct|Incorrect)\b")
NO_SUGGESTION = "none."

# Texts the tiny tokenizer should know as whole words (fastcrit.models.tokenizer adds them).
TEMPLATE_TEXTS = (
    COMPACT_CRITIC,
    FINALIZE,
    "Problem:\n",
    "Solution:\n",
    "Analysis:",
    "Improvement suggestions:",
    "Overall judgment: Correct",
    "Overall judgment: Incorrect",
)


def parse_judgment(critique: str) -> bool | None:
    """True for "Overall judgment: Correct", False for "... Incorrect", None when the critique has
    neither (it then scores 0 and is not executed). The last such line decides."""
    found = JUDGMENT_RE.findall(critique)
    if not found:
        return None
    return found[-1] == "Correct"


def format_critique(analysis: str, suggestion: str, correct: bool) -> str:
    return (
        f"Analysis: {analysis.strip()}\nImprovement suggestions: {suggestion.strip()}\n"
        f"Overall judgment: {'Correct' if correct else 'Incorrect'}"
    )


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


def synthetic_critique(passed: bool, failures: list[str], solution_code: str, reference_code: str | None) -> str:
    """A critique grounded in execution feedback, whose judgment is the real outcome.

    Where the solution and a reference solution differ in one line (or not at all), the analysis
    copies the code's line word by word, each word that differs from the reference's written as
    ``[has -> needed]`` ("the code's line, checked: `return max(xs) * 6 + [5 -> 4]`"), or names both
    lines when their words do not pair up (``line_review``); then it says what the execution showed:
    the first failing test with expected and actual values, or the error (the sandbox's message), or
    that every test passes. The suggestion is a targeted edit of the code ("change `+ 5` to `+ 4`",
    ``line_edit``) when the two lines differ, else a request to make the failing case hold: it says
    what to change, not the whole answer, so a reviser that follows it applies it to its own code.
    Departure from the paper: CTRL has a strong model write the critique from the execution
    feedback; here the writer is this function, and it also reads the reference solution.
    """
    lines = key_lines(solution_code, reference_code)
    analysis = feedback_sentence(passed, failures)
    if lines:
        analysis = f"{line_review(*lines)}. {analysis}"
    if passed:
        return format_critique(analysis, NO_SUGGESTION, True)
    edit = line_edit(*lines) if lines else None
    return format_critique(analysis, edit_suggestion(*edit) if edit else VAGUE_SUGGESTION, False)


VAGUE_SUGGESTION = "change the code so that the failing case gives the expected result."
EDIT_RE = re.compile(r"Improvement suggestions:\s*change `([^`\n]+)` to `([^`\n]+)`")
OPERATORS = frozenset({"+", "-", "*", "//", "%"})


def edit_suggestion(old: str, new: str) -> str:
    return f"change `{old}` to `{new}`."


def suggested_edit(critique: str) -> tuple[str, str] | None:
    """The edit a critique suggests ("Improvement suggestions: change `OLD` to `NEW`") as (OLD,
    NEW), if any."""
    m = EDIT_RE.search(critique)
    return (m.group(1).strip(), m.group(2).strip()) if m else None


def _count(words: list[str], part: list[str]) -> int:
    n = len(part)
    return sum(words[i : i + n] == part for i in range(len(words) - n + 1)) if n else 0


def _balance(words: list[str]) -> int:
    text = "".join(words)
    return text.count("(") - text.count(")")


def line_edit(needed: str, has: str) -> tuple[str, str] | None:
    """The targeted edit (OLD, NEW) that turns the code's line ``has`` into ``needed``, in whole
    words: the words between the lines' common first and last words, widened so that it reads as a
    part of the expression and names one place in the line. A number takes its operator ("`* 5`",
    not "`5`"), an operator alone its operand, a part with unclosed parentheses the words that close
    them ("`max(x, 4)`", "`(x - 3)`"), and a part that occurs twice in the line the word before it.
    None when the lines have the same words."""
    a, b = has.split(), needed.split()
    if a == b:
        return None
    lo = 0
    while lo < min(len(a), len(b)) and a[lo] == b[lo]:
        lo += 1
    tail = 0
    while tail < min(len(a), len(b)) - lo and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    hi_a, hi_b = len(a) - tail, len(b) - tail

    def span() -> tuple[list[str], list[str]]:
        return a[lo:hi_a], b[lo:hi_b]

    def wider(left: bool) -> bool:
        nonlocal lo, hi_a, hi_b
        if left and lo > 0:
            lo -= 1
        elif not left and hi_a < len(a) and hi_b < len(b):
            hi_a, hi_b = hi_a + 1, hi_b + 1
        else:
            return False
        return True

    if not a[lo:hi_a] or not b[lo:hi_b]:  # a word only added or only dropped: take a neighbour
        wider(left=lo > 0)
    old, new = span()
    if all(w in OPERATORS for w in old + new):
        wider(left=False)
    elif lo > 0 and a[lo - 1] in OPERATORS and old[0] not in OPERATORS:
        wider(left=True)
    while any(_balance(p) for p in span()) and wider(left=max(map(_balance, span())) <= 0):
        pass
    while _count(a, a[lo:hi_a]) > 1 and wider(left=lo > 0):
        pass
    old, new = span()
    return " ".join(old), " ".join(new)


def apply_edit(code: str, edit: tuple[str, str]) -> str | None:
    """``code`` with the edit's OLD part (whole words, spaces aside) replaced by its NEW part, the
    edited line's words joined by single spaces after its indentation; None when OLD does not occur
    exactly once in the code, or OLD and NEW are the same."""
    old, new = edit[0].split(), edit[1].split()
    if old == new or not old:
        return None
    lines = code.split("\n")
    hits = [(i, _count(ln.split(), old)) for i, ln in enumerate(lines)]
    hits = [(i, n) for i, n in hits if n]
    if len(hits) != 1 or hits[0][1] != 1:
        return None
    i = hits[0][0]
    words = lines[i].split()
    at = next(k for k in range(len(words)) if words[k : k + len(old)] == old)
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    lines[i] = indent + " ".join(words[:at] + new + words[at + len(old) :])
    return "\n".join(lines)


_REVIEW_RE = re.compile(r"the code's line, checked: `([^`\n]*)`")
# A bracket's text, split on its first " -> " by _diffs: one pattern with both sides lazy tried
# every split of every " -> " against every end, so "[ -> -> -> ..." (100 kB) took minutes.
_BRACKET_RE = re.compile(r"\[([^\[\]\n]*)\]")
_LINE_RE = re.compile(r"needs `([^`\n]*)` and the code has `([^`\n]*)`")


def _squash(text: str) -> str:
    return " ".join(text.split())


def _diffs(review: str) -> list[tuple[str, str]]:
    """The (has, needed) pairs a review marks as ``[has -> needed]``."""
    out = []
    for inner in _BRACKET_RE.findall(review):
        has, arrow, needed = inner.partition(" -> ")
        if arrow:
            out.append((has, needed))
    return out


def _side(review: str, right: bool) -> str:
    """``review`` with each ``[has -> needed]`` read as its right (needed) or left (has) side."""

    def pick(m: re.Match) -> str:
        has, arrow, needed = m.group(1).partition(" -> ")
        return (needed if right else has) if arrow else m.group(0)

    return _BRACKET_RE.sub(pick, review)


def read_review(critique: str, words: list[str] | None = None) -> list[tuple[str, str]]:
    """The (needed, has) line pairs a critique's reviews state: from a word-by-word review, the line
    with every ``[has -> needed]`` read as its right side and as its left side; from a whole-line
    review, its two lines. Empty when it has no review. ``words``: its word-by-word reviews, when
    the caller has found them already."""
    words = _REVIEW_RE.findall(critique) if words is None else words
    pairs = [(_side(r, right=True), _side(r, right=False)) for r in words]
    return pairs + _LINE_RE.findall(critique)


def review_agrees(critique: str, code: str | None = None) -> bool | None:
    """Whether a critique is true to itself: the verdict Incorrect exactly when its review states a
    difference between what the problem needs and what the code has (a word marked ``[has ->
    needed]``, or two different whole lines), no word marked as different where both sides are the
    same, and the suggested edit the one its review states (applied to the line the review says the
    code has, it gives the line the review says is needed). Whatever the review, the edit must fit
    the verdict: a Correct verdict suggests no change, an Incorrect one a change (NEW differs from
    OLD). Given the reviewed ``code``, the review must also quote it truly (the line it says the code
    has occurs in it, spaces aside), and an Incorrect verdict's edit must apply to it (its OLD part
    occurs there exactly once). None when it has no such review (and no misfit edit) or no verdict."""
    verdict = parse_judgment(critique)
    if verdict is None:
        return None
    edit = suggested_edit(critique)
    if edit is not None:
        if verdict == (edit[0].split() != edit[1].split()):
            return False  # Correct with a change to make; Incorrect with a change that changes nothing
        if not verdict and code is not None and apply_edit(code, edit) is None:
            return False  # an edit of a part the code lacks, or has more than once
    words = _REVIEW_RE.findall(critique)
    pairs = read_review(critique, words)
    if not pairs:
        return None
    if any(_squash(x) == _squash(y) for r in words for x, y in _diffs(r)):
        return False  # a word marked [x -> x]: a difference where both sides are the same
    if code is not None:
        text = _squash(code)
        if any(_squash(has) not in text for _, has in pairs):
            return False
    differ = [(needs, has) for needs, has in pairs if _squash(needs) != _squash(has)]
    if (
        edit is not None
        and differ
        and not any(_squash(apply_edit(has, edit) or "") == _squash(needs) for needs, has in differ)
    ):
        return False  # an edit that is not the change its review states
    return verdict == (not differ)
