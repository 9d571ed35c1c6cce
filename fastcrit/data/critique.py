"""CTRL's texts: the critique prompt, the revision conversation, the judgment parser, and the
synthetic critiques written from execution feedback (stage 1).

The critique has three parts, as in the CTRL paper: "Analysis:", "Improvement suggestions:" and a
last line "Overall judgment: Correct" or "Overall judgment: Incorrect". The revision conversation
is the original one [user: problem, assistant: solution] plus a user turn holding the critique and
the request to finalise the answer in the same format. All texts go through the tokenizer's chat
template (``fastcrit.data.prompts.render_chat``); these functions only build the messages.
"""
from __future__ import annotations

import re

CRITIQUE_INSTRUCTIONS = (
    "Review the solution to the programming problem below. Write \"Analysis:\" with what the code "
    "does and where it goes wrong, then \"Improvement suggestions:\" with how to fix it, and end with "
    "the line \"Overall judgment: Correct\" or \"Overall judgment: Incorrect\".")
FINALIZE = "Please finalize your answer accordingly using the same format."
JUDGMENT_RE = re.compile(r"Overall judgment:\s*\**\s*(Correct|Incorrect)\b")
NO_SUGGESTION = "none."

# Texts the tiny tokenizer should know as whole words (fastcrit.models.tokenizer adds them).
TEMPLATE_TEXTS = (CRITIQUE_INSTRUCTIONS, FINALIZE, "Problem:\n", "Solution:\n", "Analysis:",
                  "Improvement suggestions:", "Overall judgment: Correct", "Overall judgment: Incorrect")


def critique_messages(question: str, solution: str) -> list[dict]:
    """The critic's prompt: the problem and the answer to review."""
    return [{"role": "user",
             "content": f"{CRITIQUE_INSTRUCTIONS}\n\nProblem:\n{question}\n\nSolution:\n{solution}"}]


def revision_messages(question: str, solution: str, critique: str) -> list[dict]:
    """The proxy generator's prompt: its own answer, then the critique and the request to revise."""
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": solution},
            {"role": "user", "content": f"{critique.strip()}\n\n{FINALIZE}"}]


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


def parts(line: str) -> list[str]:
    """A code line cut at spaces, each operator kept with the operand after it:
    ``return max(xs) * 6 + 4`` -> [``return max(xs)``, ``* 6``, ``+ 4``]."""
    out: list[str] = []
    for word in line.split():
        if out and (out[-1] in OPERATORS or out[-1] == "return"):
            out[-1] += " " + word
        else:
            out.append(word)
    return out


OPERATORS = {"+", "-", "*", "/", "//", "%", "**", "==", "!=", "<", ">", "<=", ">=", "and", "or", "=",
             "+=", "-=", "in", "not", "is", "if", "else"}


def part_review(needed: str, has: str) -> str | None:
    """The code line reviewed part by part against the needed one ("needs `* 6`, has `* 6`: ok;
    needs `+ 4`, has `+ 5`: wrong"), when both cut into as many parts; else None. Each part says
    what the problem needs before what the code has, and the verdict comes after both: a critic
    writes the part it would write itself, then compares it with the code's right beside it."""
    a, b = parts(has), parts(needed)
    if len(a) != len(b):
        return None
    return "; ".join(f"needs `{y}`, has `{x}`: {'ok' if x == y else 'wrong'}" for x, y in zip(a, b))


def line_review(needed: str, has: str) -> str:
    """The review of the code's line: first the line the problem needs, written whole, then the
    code's line part by part against it ("the problem needs `return max(xs) * 6 + 4`. By part: needs
    `return max(xs)`, has `return max(xs)`: ok; ..."), or both whole lines when they do not cut
    alike. The needed line comes first and whole because that is how a critic can write it: by
    solving the problem from its statement before it reads the code, not part by part beside the
    code's parts (where it copies what the code has)."""
    review = part_review(needed, has)
    if review is None:
        return f"the problem needs `{needed}` and the code has `{has}`"
    return f"the problem needs `{needed}`. By part: {review}"


def feedback_sentence(passed: bool, failures: list[str]) -> str:
    if passed:
        return "Every test passes."
    first = failures[0].strip() if failures else "the code does not pass the tests"
    return first if first.endswith(".") else first + "."


def synthetic_critique(passed: bool, failures: list[str], solution_code: str,
                       reference_code: str | None) -> str:
    """A critique grounded in execution feedback, whose judgment is the real outcome.

    Where the solution and a reference solution differ in one line (or not at all), the analysis
    names the reference's line whole, then reviews the code's line part by part against it ("needs
    `* 6`, has `* 6`: ok; needs `+ 4`, has `+ 5`: wrong"), or names both lines when they do not cut
    alike (``line_review``); then it says what the
    execution showed: the first failing test with expected and actual values, or the error (the
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


_PART_RE = re.compile(r"needs `([^`\n]*)`, has `([^`\n]*)`: (ok|wrong)\b")
_LINE_RE = re.compile(r"needs `([^`\n]*)` and the code has `([^`\n]*)`")


def _squash(text: str) -> str:
    return " ".join(text.split())


def review_agrees(critique: str, code: str | None = None) -> bool | None:
    """Whether a critique is true to its own review: in a part-by-part review every part marked
    "wrong" exactly when what it says the problem needs differs from what it says the code has; in
    a whole-line review ("the problem needs `...` and the code has `...`") or a part-by-part one,
    the verdict Incorrect exactly when something differs. Given the reviewed ``code``, the review
    must also quote it truly (every "has `...`" occurs in it, spaces aside), and a Correct verdict
    may not suggest a line the code does not have, nor an Incorrect one a line it already has (this
    holds with or without a review). None when it has no such review or no verdict."""
    verdict, part_marks = parse_judgment(critique), _PART_RE.findall(critique)
    if verdict is None:
        return None
    if code is not None:
        line = suggested_line(critique)
        if line is not None and verdict != (_squash(line) in map(_squash, code.splitlines())):
            return False  # Correct with a line the code lacks; Incorrect with one it has
    lines = [] if part_marks else _LINE_RE.findall(critique)
    if not part_marks and not lines:
        return None
    if code is not None:
        text = _squash(code)
        quoted = [has for _, has, *_ in part_marks] + [has for _, has in lines]
        if any(_squash(h) not in text for h in quoted):
            return False
    if part_marks:
        differ = [needs.strip() != has.strip() for needs, has, _ in part_marks]
        marks_ok = all((mark == "wrong") == d for d, (_, _, mark) in zip(differ, part_marks))
        return marks_ok and verdict == (not any(differ))
    return verdict == all(needs.strip() == has.strip() for needs, has in lines)
