"""CTRL's prompts, all in one place: what the generator, the critic, the stage-1 writer and the
reviser are asked.

Two styles (``ctrl.prompts``):

- ``paper`` (the default): the layout of the CTRL paper's released prompts, in our words. The
  generator gets an instruction that depends on how the problem is tested (a program reading
  standard input, or a function the tests call), the problem between ``<problem>`` tags and a
  ``<format>`` block; the critic gets an instruction to analyse the answer and not to give a direct
  solution, the problem, the answer between ``<answer>`` tags and the format of its reply, ending
  in a fixed verdict line; the stage-1 writer gets the critic's prompt plus the execution feedback
  as a hint it must not reveal; the reviser gets its own conversation back with the critique and a
  request to finalise the answer.
- ``compact``: the same parts in a few words, for the tiny CPU models, whose 256-token contexts
  cannot take the paper's instructions (the demo's tokenizer has the compact texts as whole words).

In both styles every prompt that asks for code, or shows the problem to a critic, shows the
starter code and the signature of the function the tests call whenever the statement does not
already show them (LiveCodeBench's functional problems and APPS / TACO's call-based ones name the
function only there).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from fastcrit.data.problems import Problem

STYLES = ("paper", "compact")
FINALIZE = "Please finalize your answer accordingly using the same format."

# compact style: the texts the tiny tokenizer was trained on (fastcrit.data.critique.TEMPLATE_TEXTS)
COMPACT_CRITIC = (
    'Review the solution to the programming problem below. Write "Analysis:" with what the code '
    'does and where it goes wrong, then "Improvement suggestions:" with how to fix it, and end with '
    'the line "Overall judgment: Correct" or "Overall judgment: Incorrect".'
)
COMPACT_WRITER = (
    "The hint below says what running the solution showed. Let it guide the review, but "
    "never mention the hint and never quote a test or its expected result."
)

PAPER_CRITIC = (
    "Your task is to analyse an answer to a problem and give constructive feedback. Reason "
    "step by step about what the answer does and where it fails. Do NOT give a direct "
    "solution: no corrected code."
)
PAPER_WRITER = (
    PAPER_CRITIC + "\nThe hint below tells you what running the answer showed: think it "
    "through to guide the author.\n**Important: never mention the hint, and never quote a "
    "test case or its expected output.**"
)
REPLY_FORMAT = (
    "Write your reply in this format (leave out the <format> tags):\n<format>\nAnalysis:\n"
    "{analysis}\n\nImprovement suggestions:\n{suggestions}\n\nOverall judgment: "
    "{Correct or Incorrect}\n</format>"
)

GEN_STDIO = (
    "Write a Python program that solves the coding problem below. It must obey the problem's "
    "constraints and pass its example tests."
)
GEN_STDIO_FORMAT = (
    "The program reads its input from standard input and writes its answer to standard "
    "output. Put the whole program in one ```python code block."
)
GEN_FUNCTION = "Write Python code that solves the coding problem below."
GEN_FUNCTION_FORMAT = (
    "Define {what}; the tests call it. Do not read input or print the answer, and do "
    "not include test cases. Put the code in one ```python code block."
)


@dataclass(frozen=True)
class Hint:
    """What running a solution showed, as the stage-1 writer and the execution-feedback baseline
    are told it: ``text`` in words, and what a critique must not give away: ``quotes`` (the failing
    test, its call or input, as the tests hold them) and ``expected`` (the output it expected)."""

    text: str
    quotes: tuple[str, ...] = ()
    expected: str | None = None


def check_style(style: str) -> str:
    if style not in STYLES:
        raise ValueError(f"ctrl.prompts: must be one of {STYLES}, got {style!r}")
    return style


# ---------------------------------------------------------------------------------------------
# The problem as shown


def signature(problem: Problem) -> str | None:
    """The header of the function the tests call, as ``def name(args):`` (a method as
    ``class Solution:`` + its header), from the starter code, else from a reference solution; None
    for programs read from standard input, or when neither source defines it."""
    if problem.test_kind == "stdio" or not problem.entry_point:
        return None
    for source in (problem.starter_code, *problem.solutions):
        header = _header(source, problem.entry_point)
        if header:
            return header
    return None


def _header(source: str, name: str) -> str | None:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        tree = _parse_stub(source)
        if tree is None:
            return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name == name:
                    return f"class {node.name}:\n    {_def(sub)}"
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return _def(node)
    return None


def _parse_stub(source: str):
    """Starter code is often a header with no body (``def f(x):``, LiveCodeBench's ``class
    Solution: def f(self, ...):``): parse it with a body added."""
    try:
        return ast.parse(source.rstrip() + "\n" + " " * (_last_indent(source) + 4) + "pass\n")
    except (SyntaxError, ValueError):
        return None


def _last_indent(source: str) -> int:
    lines = [ln for ln in source.splitlines() if ln.strip()]
    return len(lines[-1]) - len(lines[-1].lstrip()) if lines else 0


def _def(node) -> str:
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return f"{prefix} {node.name}({ast.unparse(node.args)}){returns}:"


def _squash(text: str) -> str:
    return " ".join(text.split())


def problem_text(problem: Problem) -> str:
    """The statement, with the starter code after it when the statement does not contain it, and
    the signature of the function the tests call when neither shows that function."""
    text = problem.question.rstrip()
    starter = problem.starter_code.rstrip().strip("\n")
    if starter.strip() and _squash(starter) not in _squash(text):
        text += f"\n\nStarter code:\n```python\n{starter}\n```"
    ep = problem.entry_point
    if ep and problem.test_kind != "stdio" and not re.search(rf"\b{re.escape(ep)}\s*\(", text):
        sig = signature(problem)
        text += (
            f"\n\nThe tests call this function:\n```python\n{sig}\n```"
            if sig
            else f"\n\nThe tests call a function named `{ep}`"
            + (f" with {_arity(problem)} argument(s)." if _arity(problem) is not None else ".")
        )
    return text


def _arity(problem: Problem) -> int | None:
    if problem.test_kind != "call":
        return None
    counts = {len(t["args"]) + len(t["kwargs"]) for t in problem.tests}
    return counts.pop() if len(counts) == 1 else None


def _target(problem: Problem) -> str:
    """What the generation prompt asks to define."""
    sig = signature(problem)
    if sig and sig.startswith("class "):
        return f"the method `{problem.entry_point}` of class `{sig.split()[1].rstrip(':')}`"
    return f"the function `{problem.entry_point}`" if problem.entry_point else "the function the problem asks for"


# ---------------------------------------------------------------------------------------------
# The conversations


def generation_messages(problem: Problem, style: str = "paper") -> list[dict]:
    """The generator's prompt for a first answer."""
    return [{"role": "user", "content": generation_prompt(problem, style)}]


def generation_prompt(problem: Problem, style: str = "paper") -> str:
    if check_style(style) == "compact":
        return problem_text(problem)
    if problem.test_kind == "stdio":
        head, fmt = GEN_STDIO, GEN_STDIO_FORMAT
    else:
        head, fmt = GEN_FUNCTION, GEN_FUNCTION_FORMAT.format(what=_target(problem))
    return (
        f"{head}\n\nProblem description:\n<problem>\n{problem_text(problem)}\n</problem>\n\n"
        f"Format:\n<format>\n{fmt}\n</format>"
    )


def critique_messages(problem: Problem, solution: str, style: str = "paper") -> list[dict]:
    """The critic's prompt: the problem and the answer to review."""
    return [{"role": "user", "content": _review_prompt(problem, solution, style, hint=None)}]


def writer_messages(problem: Problem, solution: str, hint: Hint, style: str = "paper") -> list[dict]:
    """Stage 1's writer: the critic's prompt plus the execution feedback as a hint it must not
    reveal. Its reply, without the hint, becomes an SFT target for the critic's own prompt."""
    return [{"role": "user", "content": _review_prompt(problem, solution, style, hint=hint)}]


def _review_prompt(problem: Problem, solution: str, style: str, hint: Hint | None) -> str:
    if check_style(style) == "compact":
        head = COMPACT_CRITIC if hint is None else f"{COMPACT_CRITIC} {COMPACT_WRITER}"
        out = f"{head}\n\nProblem:\n{problem_text(problem)}\n\nSolution:\n{solution}"
        return out if hint is None else f"{out}\n\nHint:\n{hint.text}"
    out = (
        f"{PAPER_CRITIC if hint is None else PAPER_WRITER}\n\nProblem description:\n<problem>\n"
        f"{problem_text(problem)}\n</problem>\n\nAnswer:\n<answer>\n{solution}\n</answer>\n\n"
    )
    if hint is not None:
        out += f"Hint:\n<hint>\n{hint.text}\n</hint>\n\n"
    return out + REPLY_FORMAT


def revision_messages(problem: Problem, solution: str, critique: str, style: str = "paper") -> list[dict]:
    """The reviser's prompt: its own conversation [problem, answer], then the critique and the
    request to finalise the answer in the same format."""
    return _followup(problem, solution, f"{clean_critique(critique)}\n\n{FINALIZE}", style)


def no_critique_messages(problem: Problem, solution: str, style: str = "paper") -> list[dict]:
    """The no-critique baseline: the same conversation with the critique left out (what a second
    look alone gives; the critique's words add the rest)."""
    return _followup(problem, solution, FINALIZE, style)


def feedback_messages(problem: Problem, solution: str, hint: Hint, style: str = "paper") -> list[dict]:
    """The execution-feedback baseline: the reviser is told what running its answer showed (the
    failing test itself), an upper bound for a critic that has no tests."""
    return _followup(problem, solution, f"{hint.text}\n\n{FINALIZE}", style)


def _followup(problem: Problem, solution: str, turn: str, style: str) -> list[dict]:
    return [
        {"role": "user", "content": generation_prompt(problem, style)},
        {"role": "assistant", "content": solution},
        {"role": "user", "content": turn},
    ]


_FORMAT_TAGS = re.compile(r"</?format>")


def clean_critique(critique: str) -> str:
    """A critique as the reviser sees it: the paper's format tags, if the critic wrote them, left
    out."""
    return _FORMAT_TAGS.sub("", critique).strip()


# ---------------------------------------------------------------------------------------------
# Execution feedback as a hint


def hint_for(problem: Problem, passed: bool, failures: list[str], failed_tests: list[int] | None = None) -> Hint:
    """What running a solution showed, in words: correct; too slow; the error it raised; or one
    failing test with what it expected and what came back. ``failed_tests``: indices of the tests
    that did not pass (in the order of ``failures``), when known."""
    if passed:
        return Hint(
            "The answer is correct: it passes every test. A short, positive review with no needless suggestions fits."
        )
    failed_tests = list(failed_tests or [])
    message = (failures[0] if failures else "").strip()
    test = problem.tests[failed_tests[0]] if failed_tests and failed_tests[0] < len(problem.tests) else None
    total = len(problem.tests)
    lead = (
        "The answer is incorrect"
        if not failed_tests
        else "The answer fails its only test"
        if total == 1
        else "The answer fails every test"
        if len(failed_tests) >= total
        else f"The answer fails {len(failed_tests)} of {total} tests"
    )
    if "timeout" in message or "time limit" in message.lower():
        return Hint(f"{lead}: it runs out of time and needs a more efficient approach.")
    shown, quotes, expected = _test_shown(problem, test, message)
    text = f"{lead}. " + (f"On this test:\n{shown}\n" if shown else "") + (f"It gives: {message}" if message else "")
    return Hint(text.strip(), tuple(dict.fromkeys(q for q in quotes if q.strip())), expected)


_ASSERT_EQ = re.compile(r"assert\s+(.+?)\s*==\s*(.+?)(?:\s+\(returned .*\))?$")


def _test_shown(problem: Problem, test, message: str) -> tuple[str, list[str], str | None]:
    """A failing test in words, the pieces of it a critique may not quote, and its expected output."""
    if test is None:
        return "", [], None
    if problem.test_kind == "stdio":
        inp, out = str(test["input"]).strip(), str(test["output"]).strip()
        return f"Input:\n{inp}\nExpected output:\n{out}", [inp], out
    if problem.test_kind == "call":
        args = ", ".join([*map(repr, test["args"]), *(f"{k}={v!r}" for k, v in test["kwargs"].items())])
        call = f"{problem.entry_point}({args})"
        return f"{call} should return {test['expected']!r}", [call], repr(test["expected"])
    src = str(test).strip()
    quotes = [ln.strip() for ln in src.splitlines() if ln.strip().startswith("assert")]
    m = _ASSERT_EQ.search(message.split("\n")[0].removeprefix("AssertionError:").strip())
    expected = None
    if m:  # the failing assert as the judge reported it: its call and its expected value
        quotes += [m.group(0).split(" (returned")[0], m.group(1)]
        expected = m.group(2)
    return (src if len(src) <= 600 else ""), quotes, expected


# ---------------------------------------------------------------------------------------------
# Filters on written critiques

_EXPECT_PHRASES = (
    r"expected(?: output| result| value)?(?: is| was| of)?:?",
    r"==",
    r"should (?:return|output|"
    r"print|be|give|equal)",
    r"must (?:return|output|print|be)",
    r"correct (?:output|answer|result) "
    r"is:?",
)
DISTINCT = 8  # a quote this long (spaces squashed) is taken as copied, wherever it stands


def leaks(critique: str, hint: Hint) -> str | None:
    """Why a written critique gives the hint away (None when it does not): it mentions the hint;
    it quotes the failing test (an assert line, the call, the input) where that is distinctive
    (``DISTINCT`` characters or more); or it states the expected output: quoted anywhere where
    distinctive, else after "expected", "==", "should return" and the like."""
    text = _squash(critique)
    if re.search(r"\bhint\b", text, re.IGNORECASE):
        return "mentions the hint"
    for q in hint.quotes:
        piece = _squash(q)
        if len(piece) >= DISTINCT and piece in text:
            return f"quotes the test: {piece[:60]!r}"
    if hint.expected is not None:
        piece = _squash(hint.expected)
        if len(piece) >= DISTINCT and piece in text:
            return f"states the expected output {piece[:60]!r}"
        for phrase in _EXPECT_PHRASES:
            if piece and re.search(rf"{phrase}\s*[`'\"]?{re.escape(piece)}(?!\w|\.\d)", text, re.IGNORECASE):
                return f"states the expected output {piece[:60]!r}"
    return None
