"""`minicode`: small programming problems where tiny models can show CTRL's mechanism on a CPU.

Each problem asks, in words, for a one-line Python function ("Write a Python function calc(xs) that
returns the largest item of xs times 3 plus 2.") and is checked by five real assert tests in the
sandbox. Problems come from twelve templates with two constants each; the held-out split uses
(template, constants) combinations that never occur in the training split, so no test problem is a
renamed training problem.

Two shipped files are problems (``minicode_train.jsonl``, ``minicode_test.jsonl``, the
``fastcrit.data.problems`` layout). The third, ``minicode_coder.jsonl``, is chat SFT data for the
tiny *coder* that plays CTRL's generator and proxy:
- solve rows (problem -> solution) whose answer is wrong in 60% of the rows, in ways a critique
  can name (a constant off by one, a swapped operator or function, dropped parentheses), so the
  generator's sampled solutions are often wrong;
- revise rows [problem, solution, critique + "Please finalize..."] -> the solution with the
  critique applied literally: a critique that judges the code correct leaves it unchanged; the line
  an "Incorrect" critique suggests ("use `return ...`") replaces the return line; and an
  "Incorrect" critique with nothing new to apply (no line, or the same line again) makes the proxy
  change its line anyway, as a generator told that its code is wrong does: always the same change,
  its last constant plus one (``nudge``), which a greedy proxy can learn. Every revision is thus its
  own code, the critique's line, or its code nudged: the proxy learns to copy, not to solve the
  problem again. The suggested line is
  the right one only half the time, so the proxy learns to follow the critique, not to fix the code
  by itself: a good critique helps, a bad one does not, and calling correct code incorrect breaks it.

`python -m fastcrit.data.tasks` writes the files (deterministic, seed 0).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from fastcrit.data.critique import (FINALIZE, NO_SUGGESTION, VAGUE_SUGGESTION, feedback_sentence,
                                   format_critique, line_review)

# (arg, phrase, expression): the expression is what the function returns.
TEMPLATES = (
    ("x", "x times {a} plus {b}", "x * {a} + {b}"),
    ("x", "x times {a} minus {b}", "x * {a} - {b}"),
    ("x", "x plus {a}, all times {b}", "(x + {a}) * {b}"),
    ("x", "x minus {a}, all times {b}", "(x - {a}) * {b}"),
    ("x", "x modulo {a} plus {b}", "x % {a} + {b}"),
    ("x", "x divided by {a}, rounded down, plus {b}", "x // {a} + {b}"),
    ("x", "the larger of x and {a}, plus {b}", "max(x, {a}) + {b}"),
    ("x", "the smaller of x and {a}, times {b}", "min(x, {a}) * {b}"),
    ("xs", "the sum of xs times {a} plus {b}", "sum(xs) * {a} + {b}"),
    ("xs", "the largest item of xs times {a} plus {b}", "max(xs) * {a} + {b}"),
    ("xs", "the smallest item of xs times {a} minus {b}", "min(xs) * {a} - {b}"),
    ("xs", "the length of xs times {a} plus {b}", "len(xs) * {a} + {b}"),
)
NAMES = ("f", "g", "calc", "solve", "compute", "value")
INPUTS = {"x": [0, 1, 2, 5, -3], "xs": [[1, 2, 3], [5], [4, -2, 7], [0, 0], [9, 1]]}
A_RANGE, B_RANGE = range(2, 10), range(1, 10)
BUG_RATE = 0.6
_SWAPS = {"+": "-", "-": "+", "*": "+", "%": "//", "//": "%", "max": "min", "min": "max",
          "sum": "len", "len": "sum"}
_OPERATOR = re.compile(r"(?<= )(//|[-+*%])(?= )|\b(max|min|sum|len)(?=\()")


@dataclass(frozen=True)
class Spec:
    template: int
    a: int
    b: int
    name: str

    @property
    def arg(self) -> str:
        return TEMPLATES[self.template][0]

    @property
    def expr(self) -> str:
        return TEMPLATES[self.template][2].format(a=self.a, b=self.b)

    @property
    def question(self) -> str:
        phrase = TEMPLATES[self.template][1].format(a=self.a, b=self.b)
        return f"Write a Python function {self.name}({self.arg}) that returns {phrase}."

    def code(self, expr: str | None = None) -> str:
        return f"def {self.name}({self.arg}):\n    return {expr or self.expr}\n"

    def answer(self, expr: str | None = None) -> str:
        """The solution as the coder writes it: one fenced Python block."""
        return f"```python\n{self.code(expr)}```"


def evaluate(expr: str, arg: str, value):
    """The expression's value for one input (trusted: expressions are ours, not a model's)."""
    try:
        return eval(expr, {"__builtins__": {}, "max": max, "min": min, "sum": sum, "len": len},  # noqa: S307
                    {arg: value})
    except (ZeroDivisionError, TypeError, ValueError):
        return None


def tests_for(spec: Spec) -> list[str]:
    out = []
    for v in INPUTS[spec.arg]:
        out.append(f"assert {spec.name}({v!r}) == {evaluate(spec.expr, spec.arg, v)!r}")
    return out


_INT = re.compile(r"\b\d+\b")


def edits(expr: str) -> list[str]:
    """Every one-part change of an expression, as a generator told "wrong" makes it: a constant off
    by one, one operator or function swapped, or parentheses dropped ((x + a) * b -> x + a * b)."""
    cands = []
    for m in _INT.finditer(expr):
        for d in (-1, 1):
            if int(m.group()) + d >= 1:
                cands.append(expr[:m.start()] + str(int(m.group()) + d) + expr[m.end():])
    for m in _OPERATOR.finditer(expr):
        cands.append(expr[:m.start()] + _SWAPS[m.group()] + expr[m.end():])
    if expr.startswith("("):
        cands.append(expr.replace("(", "").replace(")", ""))
    out = []
    for e in cands:
        if e != expr and e not in out:
            out.append(e)
    return out


def nudge(expr: str) -> str:
    """The one change a coder told "wrong" with nothing new to apply makes: its last constant plus
    one. Always the same change, so that a greedy proxy makes it (a change drawn at random is, at
    every single token, less likely than copying, and greedy decoding would copy)."""
    m = list(_INT.finditer(expr))[-1]
    return expr[:m.start()] + str(int(m.group()) + 1) + expr[m.end():]


def bugs(spec: Spec) -> list[str]:
    """Wrong expressions a generator might write: one-part changes of the right one that fail at
    least one of the problem's tests."""
    good = [evaluate(spec.expr, spec.arg, v) for v in INPUTS[spec.arg]]
    return [e for e in edits(spec.expr) if [evaluate(e, spec.arg, v) for v in INPUTS[spec.arg]] != good]


def problem_row(spec: Spec, pid: str) -> dict:
    return {"id": pid, "question": spec.question, "test_kind": "assert", "tests": tests_for(spec),
            "entry_point": spec.name, "starter_code": "", "solutions": [spec.code()],
            "source": "minicode", "meta": {"template": spec.template, "a": spec.a, "b": spec.b}}


def _specs(n_train: int, n_test: int, rng: random.Random) -> tuple[list[Spec], list[Spec]]:
    combos = [(t, a, b) for t in range(len(TEMPLATES)) for a in A_RANGE for b in B_RANGE]
    rng.shuffle(combos)
    n_test_combos = n_test  # one name per held-out combination
    test = [Spec(t, a, b, rng.choice(NAMES)) for t, a, b in combos[:n_test_combos]]
    pool = [Spec(t, a, b, name) for t, a, b in combos[n_test_combos:] for name in NAMES]
    rng.shuffle(pool)
    return pool[:n_train], test


def _revise_row(spec: Spec, rng: random.Random) -> dict:
    """A revision example: a critique written like stage 1's synthetic ones, right or wrong, applied
    literally (see the module docstring). Its analysis agrees with its verdict (a critique that
    says Correct marks no word of the code's line as different and says every test passes), as the
    critics' do; whether the verdict is right is drawn apart from it, so the proxy learns to follow
    the critique."""
    wrong = bugs(spec)
    pick = lambda: spec.expr if rng.random() < 0.5 else rng.choice(wrong)  # noqa: E731
    start = pick()
    v = rng.choice(INPUTS[spec.arg])

    def analysis(claimed: str, passed: bool) -> str:
        return f"{line_review(f'return {claimed}', f'return {start}')}. " + feedback_sentence(passed, [
            f"AssertionError: assert {spec.name}({v!r}) == {evaluate(claimed, spec.arg, v)!r} "
            f"(returned {evaluate(start, spec.arg, v)!r})"])

    kind = rng.random()
    if kind < 0.3:  # judged correct: keep the code (right or not)
        critique, final = format_critique(analysis(start, True), NO_SUGGESTION, True), start
    elif kind < 0.9:  # a concrete line, right or not: applied; the same line again: change something
        line = pick() if rng.random() < 0.6 else start
        critique = format_critique(analysis(line, False), f"use `return {line}`.", False)
        final = line if line != start else nudge(start)
    else:  # incorrect, but nothing concrete: nudge the line anyway
        critique = format_critique(analysis(pick(), False), VAGUE_SUGGESTION, False)
        final = nudge(start)
    return {"messages": [{"role": "user", "content": spec.question},
                         {"role": "assistant", "content": spec.answer(start)},
                         {"role": "user", "content": f"{critique}\n\n{FINALIZE}"},
                         {"role": "assistant", "content": spec.answer(final)}],
            "kind": "revise"}


def make_minicode(n_train: int = 1600, n_test: int = 300, revise_per_problem: int = 3,
                  seed: int = 0) -> dict[str, list[dict]]:
    rng = random.Random(seed)
    train, test = _specs(n_train, n_test, rng)
    coder = []
    for spec in train:
        expr = rng.choice(bugs(spec)) if rng.random() < BUG_RATE else spec.expr
        coder.append({"messages": [{"role": "user", "content": spec.question},
                                   {"role": "assistant", "content": spec.answer(expr)}],
                      "kind": "solve"})
        coder.extend(_revise_row(spec, rng) for _ in range(revise_per_problem))
    rng.shuffle(coder)
    return {"train": [problem_row(s, f"minicode/train/{i}") for i, s in enumerate(train)],
            "test": [problem_row(s, f"minicode/test/{i}") for i, s in enumerate(test)],
            "coder": coder}
