"""`minicode`: small programming problems where tiny models can show CTRL's mechanism on a CPU.

Each problem asks, in words, for a one-line Python function ("Write a Python function calc(xs) that
returns the largest item of xs times 3 plus 2.") and is checked by five real assert tests in the
sandbox. Problems come from twelve templates with two constants each. Three splits of problems use
disjoint (template, constants) combinations: ``test`` (300 held-out problems), ``dev`` (200, to tune
on) and ``train``; no dev or test problem is a renamed training problem.

Each problem's five test inputs are chosen for it (``inputs_for``) so that every one-part change of
its answer fails at least one test: any other constant, any other operator, any other function of
its kind, the parentheses dropped (``variants``); a change that no input tells from the answer is the
answer. So a test run tells every bug the coder can write from the right answer.

The fourth file, ``minicode_coder.jsonl``, is chat SFT data for the tiny *coder* that plays CTRL's
generator and proxy:
- solve rows (problem -> solution, three per problem). The coder has misconceptions: for each
  template, when one of its constants is 6 or more (``TRAP_FROM``), its answer is wrong in one fixed
  way (``Spec.trap``: "minus" written as ``+``, parentheses dropped, ``min`` for "the larger", a
  constant off by one, ...) in 80% of those rows; the others are right or another bug. Elsewhere
  70% of its answers are right and 30% carry a random one-part bug. Its greedy answer is then
  wrong on the trap problems (about half of all) and right elsewhere; a critic that compares the
  statement with the code finds the bug, and a sampled answer is wrong more often still.
- revise rows [problem, solution, critique + "Please finalize..."] -> the solution with the
  critique's edit applied, the solution drawn as a solve row's (the proxy revises its own code): a
  critique that judges the code correct leaves it unchanged; an
  "Incorrect" one whose suggestion is an edit ("Improvement suggestions: change `* 5` to `* 6`", as
  ``fastcrit.data.critique.line_edit`` writes it) gets exactly that edit applied to the code, and
  nothing else; an "Incorrect" one with no edit that applies (none, or an edit of a part the code
  does not have) leaves the code as it is. The edit is the right one (the revision passes) only
  about half the time, so the proxy learns to follow the critique, not to fix code by itself: a good
  critique helps, a bad one does not, and calling correct code incorrect with a wrong edit breaks it.
  Keeping the code when the critique names no usable change makes a vague critique worth nothing,
  neither a fix nor a random change: what a critic adds is exactly the edits it names.
- no-critique rows [problem, solution, "Please finalize..."] -> the solution unchanged: asked to
  finalise without a critique, the coder keeps its answer, as a model with nothing new to go on
  does; this round is the no-critique baseline (``ctrl_prompts.no_critique_messages``).

`python -m fastcrit.data.tasks` writes the files (deterministic, seed 0).
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

from fastcrit.data.critique import (
    FINALIZE,
    NO_SUGGESTION,
    VAGUE_SUGGESTION,
    apply_edit,
    edit_suggestion,
    feedback_sentence,
    format_critique,
    line_edit,
    line_review,
)

# (arg, phrase, expression, (constant, misconception)): the expression is what the function
# returns; the misconception is what the coder writes instead when that constant is TRAP_FROM or
# more ({a1} = a + 1, {am} = a - 1, likewise for b).
TEMPLATES = (
    ("x", "x times {a} plus {b}", "x * {a} + {b}", ("b", "x * {a} + {b1}")),
    ("x", "x times {a} minus {b}", "x * {a} - {b}", ("a", "x * {a} + {b}")),
    ("x", "x plus {a}, all times {b}", "(x + {a}) * {b}", ("a", "x + {a} * {b}")),
    ("x", "x minus {a}, all times {b}", "(x - {a}) * {b}", ("b", "x - {a} * {b}")),
    ("x", "x modulo {a} plus {b}", "x % {a} + {b}", ("a", "x // {a} + {b}")),
    ("x", "x divided by {a}, rounded down, plus {b}", "x // {a} + {b}", ("a", "x % {a} + {b}")),
    ("x", "the larger of x and {a}, plus {b}", "max(x, {a}) + {b}", ("a", "min(x, {a}) + {b}")),
    ("x", "the smaller of x and {a}, times {b}", "min(x, {a}) * {b}", ("a", "min(x, {am}) * {b}")),
    ("xs", "the sum of xs times {a} plus {b}", "sum(xs) * {a} + {b}", ("a", "len(xs) * {a} + {b}")),
    ("xs", "the largest item of xs times {a} plus {b}", "max(xs) * {a} + {b}", ("b", "max(xs) * {a} + {bm}")),
    ("xs", "the smallest item of xs times {a} minus {b}", "min(xs) * {a} - {b}", ("a", "max(xs) * {a} - {b}")),
    ("xs", "the length of xs times {a} plus {b}", "len(xs) * {a} + {b}", ("a", "len(xs) * {a1} + {b}")),
)
NAMES = ("f", "g", "calc", "solve", "compute", "value")
A_RANGE, B_RANGE = range(2, 10), range(1, 10)
TRAP_FROM = 6
N_TESTS = 5


def _input_pool() -> dict[str, list]:
    """The inputs a problem's tests are chosen from: small integers, and short lists of them."""
    rng = random.Random(0)
    lists = [[1, 2, 3], [5], [4, -2, 7], [0, 0], [9, 1]]
    while len(lists) < 80:
        xs = [rng.randint(-4, 12) for _ in range(rng.randint(1, 4))]
        if xs not in lists:
            lists.append(xs)
    return {"x": list(range(-9, 21)), "xs": lists}


POOL = _input_pool()
# Every operator, and every function of a kind, a one-part change may put in another's place.
BINARY = ("+", "-", "*", "//", "%")
FUNCTIONS = {"x": ("max", "min"), "xs": ("sum", "len", "max", "min")}
CONSTANTS = range(0, 13)
# The one-part changes the coder itself makes (solve rows, wrong edits): a constant off by one, one
# operator or function swapped, parentheses dropped.
_SWAPS = {"+": "-", "-": "+", "*": "+", "%": "//", "//": "%", "max": "min", "min": "max", "sum": "len", "len": "sum"}
_OPERATOR = re.compile(r"(?<= )(//|[-+*%])(?= )|\b(max|min|sum|len)(?=\()")
_INT = re.compile(r"\b\d+\b")


@dataclass(frozen=True)
class Spec:
    template: int
    a: int
    b: int
    name: str

    @property
    def arg(self) -> str:
        return TEMPLATES[self.template][0]

    def _fill(self, text: str) -> str:
        return text.format(a=self.a, b=self.b, a1=self.a + 1, am=self.a - 1, b1=self.b + 1, bm=self.b - 1)

    @property
    def expr(self) -> str:
        return self._fill(TEMPLATES[self.template][2])

    @property
    def trap(self) -> str | None:
        """The wrong expression the coder's misconception writes for this problem, if it has one (a
        misconception that comes out right, as dropped parentheses around ``x + a`` times 1, is none)."""
        const, bug = TEMPLATES[self.template][3]
        if getattr(self, const) < TRAP_FROM:
            return None
        bug = self._fill(bug)
        return bug if _differs(bug, self.expr, self.arg, POOL[self.arg]) else None

    @property
    def question(self) -> str:
        phrase = self._fill(TEMPLATES[self.template][1])
        return f"Write a Python function {self.name}({self.arg}) that returns {phrase}."

    def code(self, expr: str | None = None) -> str:
        return f"def {self.name}({self.arg}):\n    return {expr or self.expr}\n"

    def answer(self, expr: str | None = None) -> str:
        """The solution as the coder writes it: one fenced Python block."""
        return f"```python\n{self.code(expr)}```"


_BUILTINS = {"__builtins__": {}, "max": max, "min": min, "sum": sum, "len": len}


@functools.cache
def _compiled(expr: str):
    return compile(expr, "<minicode>", "eval")


def evaluate(expr: str, arg: str, value):
    """The expression's value for one input (trusted: expressions are ours, not a model's)."""
    try:
        return eval(_compiled(expr), _BUILTINS, {arg: value})  # our own expressions (above), only _BUILTINS in reach
    except (ZeroDivisionError, TypeError, ValueError):
        return None


def _unique(expr: str, cands: list[str]) -> list[str]:
    out = []
    for e in cands:
        if e != expr and e not in out:
            out.append(e)
    return out


def variants(expr: str, arg: str) -> list[str]:
    """Every one-part change of an expression: any constant replaced by another of 0-12, any
    operator by another, any function by another of its kind, the parentheses dropped. What the
    tests must tell from the answer (those that equal it on every pool input are the answer)."""
    cands = []
    for m in _INT.finditer(expr):
        cands += [expr[: m.start()] + str(c) + expr[m.end() :] for c in CONSTANTS]
    for m in _OPERATOR.finditer(expr):
        kind = FUNCTIONS[arg] if m.group(2) else BINARY
        cands += [expr[: m.start()] + op + expr[m.end() :] for op in kind]
    if expr.startswith("("):
        cands.append(expr.replace("(", "").replace(")", ""))
    return _unique(expr, cands)


def edits(expr: str) -> list[str]:
    """The one-part changes the coder makes: a constant off by one, one operator or function
    swapped, or parentheses dropped ((x + a) * b -> x + a * b)."""
    cands = []
    for m in _INT.finditer(expr):
        for d in (-1, 1):
            if int(m.group()) + d >= 1:
                cands.append(expr[: m.start()] + str(int(m.group()) + d) + expr[m.end() :])
    for m in _OPERATOR.finditer(expr):
        cands.append(expr[: m.start()] + _SWAPS[m.group()] + expr[m.end() :])
    if expr.startswith("("):
        cands.append(expr.replace("(", "").replace(")", ""))
    return _unique(expr, cands)


def _values(expr: str, arg: str, inputs: list) -> list:
    return [evaluate(expr, arg, v) for v in inputs]


def _differs(expr: str, other: str, arg: str, inputs: list) -> bool:
    return _values(expr, arg, inputs) != _values(other, arg, inputs)


def inputs_for(spec: Spec) -> list:
    """The problem's test inputs: chosen from ``POOL`` (the same for the same template and
    constants) so that every variant the pool tells from the answer fails at least one of them: at
    each step the input that most of the variants still standing get wrong; then others at random up
    to ``N_TESTS``."""
    return [POOL[spec.arg][i] for i in _inputs(spec.template, spec.a, spec.b)]


@functools.cache
def _inputs(template: int, a: int, b: int) -> tuple[int, ...]:
    spec = Spec(template, a, b, "f")
    pool = POOL[spec.arg]
    order = list(range(len(pool)))
    random.Random(f"minicode/{template}/{a}/{b}").shuffle(order)
    good = [evaluate(spec.expr, spec.arg, v) for v in pool]
    standing = [
        {i for i, v in enumerate(pool) if evaluate(e, spec.arg, v) != good[i]} for e in variants(spec.expr, spec.arg)
    ]
    standing = [s for s in standing if s]
    chosen: list[int] = []
    while standing:
        best = max(order, key=lambda i: sum(i in s for s in standing))
        chosen.append(best)
        standing = [s for s in standing if best not in s]
    chosen += [i for i in order if i not in chosen][: max(N_TESTS - len(chosen), 0)]
    return tuple(chosen)


def tests_for(spec: Spec) -> list[str]:
    return [f"assert {spec.name}({v!r}) == {evaluate(spec.expr, spec.arg, v)!r}" for v in inputs_for(spec)]


def bugs(spec: Spec) -> list[str]:
    """Wrong expressions the coder writes: its one-part changes of the right one that are not the
    right one on the pool's inputs (its tests then fail them: ``inputs_for``)."""
    return list(_bugs(spec.template, spec.a, spec.b))


@functools.cache
def _bugs(template: int, a: int, b: int) -> tuple[str, ...]:
    spec = Spec(template, a, b, "f")
    return tuple(e for e in edits(spec.expr) if _differs(e, spec.expr, spec.arg, POOL[spec.arg]))


def problem_row(spec: Spec, pid: str) -> dict:
    return {
        "id": pid,
        "question": spec.question,
        "test_kind": "assert",
        "tests": tests_for(spec),
        "entry_point": spec.name,
        "starter_code": "",
        "solutions": [spec.code()],
        "source": "minicode",
        "meta": {"template": spec.template, "a": spec.a, "b": spec.b, "trap": spec.trap is not None},
    }


def _specs(n_train: int, n_dev: int, n_test: int, rng: random.Random) -> tuple[list[Spec], list[Spec], list[Spec]]:
    combos = [(t, a, b) for t in range(len(TEMPLATES)) for a in A_RANGE for b in B_RANGE]
    rng.shuffle(combos)
    held = [Spec(t, a, b, rng.choice(NAMES)) for t, a, b in combos[: n_test + n_dev]]  # one name each
    pool = [Spec(t, a, b, name) for t, a, b in combos[n_test + n_dev :] for name in NAMES]
    rng.shuffle(pool)
    return pool[:n_train], held[n_test:], held[:n_test]


def solve_answer(spec: Spec, rng: random.Random) -> str:
    """A solve row's expression: the misconception's (80%) where the problem has one, else right
    (70%) or a random bug of the coder's."""
    wrong = bugs(spec)
    if spec.trap is not None:
        u = rng.random()
        return spec.trap if u < 0.8 else spec.expr if u < 0.9 else rng.choice([e for e in wrong if e != spec.trap])
    return spec.expr if rng.random() < 0.7 else rng.choice(wrong)


def critique_analysis(spec: Spec, start: str, claimed: str | None, passed: bool, rng: random.Random) -> str:
    """A critique's analysis as stage 1 writes it: the review of the code's line against the line it
    claims is needed (none when ``claimed`` is None), then a test result that fits the claim."""
    head = f"{line_review(f'return {claimed}', f'return {start}')}. " if claimed is not None else ""
    if passed:
        return head + feedback_sentence(True, [])
    inputs = inputs_for(spec)
    # the value the claim expects: the claimed line's, else (no claim) the right one's, or where the
    # code is right a bug's (a critique that calls right code wrong quotes a test it fails)
    other = claimed if claimed is not None else spec.expr if start != spec.expr else rng.choice(bugs(spec))
    v = next((v for v in inputs if _differs(other, start, spec.arg, [v])), rng.choice(inputs))
    return head + feedback_sentence(
        False,
        [
            f"AssertionError: assert {spec.name}({v!r}) == "
            f"{evaluate(other, spec.arg, v)!r} (returned {evaluate(start, spec.arg, v)!r})"
        ],
    )


def _foreign_edit(spec: Spec, start: str, rng: random.Random) -> tuple[str, str] | None:
    """An edit of a part the code does not have (a critique that misquotes the code)."""
    code = spec.code(start)
    for _ in range(20):
        x, y = rng.sample([spec.expr, *bugs(spec)], 2)
        edit = line_edit(f"return {y}", f"return {x}")
        if edit and apply_edit(code, edit) is None:
            return edit
    return None


def revise_row(spec: Spec, rng: random.Random) -> dict:
    """A revision example (module docstring). Its critique reads like stage 1's: the review and the
    edit agree with the verdict; whether the verdict and the edit are right is drawn apart from it."""
    start = solve_answer(spec, rng)  # the coder's own answer, as the proxy revises its own
    kind, final = rng.random(), start
    if kind < 0.2:  # no critique: the no-critique baseline keeps its answer
        turn = FINALIZE
    else:
        if kind < 0.4:  # judged correct (rightly or not): kept
            critique = format_critique(critique_analysis(spec, start, start, True, rng), NO_SUGGESTION, True)
        elif kind < 0.85:  # an edit that applies: applied, right or not
            if start != spec.expr and rng.random() < 0.8:
                target = spec.expr
            else:
                target = rng.choice([e for e in edits(start) if e != spec.expr])
            edit = line_edit(f"return {target}", f"return {start}")
            critique = format_critique(
                critique_analysis(spec, start, target, False, rng), edit_suggestion(*edit), False
            )
            final = target
            assert apply_edit(spec.code(start), edit) == spec.code(target)
        else:  # incorrect with no usable edit: kept
            edit = _foreign_edit(spec, start, rng) if kind < 0.92 else None
            critique = format_critique(
                critique_analysis(spec, start, None, False, rng),
                edit_suggestion(*edit) if edit else VAGUE_SUGGESTION,
                False,
            )
        turn = f"{critique}\n\n{FINALIZE}"
    return {
        "messages": [
            {"role": "user", "content": spec.question},
            {"role": "assistant", "content": spec.answer(start)},
            {"role": "user", "content": turn},
            {"role": "assistant", "content": spec.answer(final)},
        ],
        "kind": "revise" if turn != FINALIZE else "finalize",
    }


def make_minicode(
    n_train: int = 1600,
    n_dev: int = 200,
    n_test: int = 300,
    solve_per_problem: int = 3,
    revise_per_problem: int = 3,
    seed: int = 0,
) -> dict[str, list[dict]]:
    """The splits and the coder's rows. As many solve rows as revise rows: a revise row whose edit
    is right ends in the right answer to its question, and the solve rows must outweigh those for
    the coder's first answer to keep its misconceptions."""
    rng = random.Random(seed)
    train, dev, test = _specs(n_train, n_dev, n_test, rng)
    coder = []
    for spec in train:
        coder.extend(
            {
                "messages": [
                    {"role": "user", "content": spec.question},
                    {"role": "assistant", "content": spec.answer(solve_answer(spec, rng))},
                ],
                "kind": "solve",
            }
            for _ in range(solve_per_problem)
        )
        coder.extend(revise_row(spec, rng) for _ in range(revise_per_problem))
    rng.shuffle(coder)
    return {
        "train": [problem_row(s, f"minicode/train/{i}") for i, s in enumerate(train)],
        "dev": [problem_row(s, f"minicode/dev/{i}") for i, s in enumerate(dev)],
        "test": [problem_row(s, f"minicode/test/{i}") for i, s in enumerate(test)],
        "coder": coder,
    }
