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


def one_line_fix(solution_code: str, reference_code: str) -> str | None:
    """When the solution differs from the reference in exactly one line (same number of lines),
    that line of the reference, stripped; else None."""
    a, b = _lines(solution_code), _lines(reference_code)
    if len(a) != len(b):
        return None
    diff = [(x, y) for x, y in zip(a, b) if x != y]
    if len(diff) != 1:
        return None
    return diff[0][1].strip()


def synthetic_critique(passed: bool, failures: list[str], solution_code: str,
                       reference_code: str | None) -> str:
    """A critique grounded in execution feedback, whose judgment is the real outcome.

    ``failures``: messages of the failed tests (the sandbox's, which carry the failing assertion or
    input with expected and actual values, or the error); the first one is the analysis. The
    suggestion is the reference solution's line when the solution differs from it in one line,
    otherwise a request to make the failing case hold. Departure from the paper: CTRL has a strong
    model write the critique from this feedback; here the writer is this function.
    """
    if passed:
        return format_critique("the code does what the problem asks; every test passes.",
                               NO_SUGGESTION, True)
    first = failures[0].strip() if failures else "the code does not pass the tests."
    analysis = first if first.endswith(".") else first + "."
    fix = one_line_fix(solution_code, reference_code) if reference_code else None
    if fix:
        suggestion = f"use `{fix}`."
    else:
        suggestion = "change the code so that the failing case gives the expected result."
    return format_critique(analysis, suggestion, False)


SUGGESTION_RE = re.compile(r"Improvement suggestions:\s*use `([^`\n]+)`")


def suggested_line(critique: str) -> str | None:
    """The line a critique suggests ("Improvement suggestions: use `...`"), if any."""
    m = SUGGESTION_RE.search(critique)
    return m.group(1).strip() if m else None
