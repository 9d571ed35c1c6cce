"""Trusted comparisons of an execution's output with the expected one: they run in the pool
process (or the remote client), never in a worker or an execution, so expected values never reach
untrusted code.

The rule follows the expected value, so a wrong answer cannot pass as a rounding error:

- integers and strings compare exactly: an expected ``123456`` needs ``123456``, not ``123457``
  (which is within 1e-5) and not ``123456.0``;
- a float is compared with a relative tolerance of ``REL_TOL`` (``|a - e| <= 1e-5 * max(|a|, |e|)``,
  no absolute floor, so an expected 0 needs 0 or -0), and only where the expected value is a float:
  in stdout, an expected token written with a decimal point or an exponent (``0.5``, ``2.``,
  ``1e-3``); in a ``call`` test, an expected JSON float;
- inf and nan never equal a finite expectation; an expected inf or nan is met only by the same
  (in stdout: the same text);
- ``call`` values keep their JSON types: ``True`` is not ``1``, a float is not an int, an int where a
  float is expected is compared as a number, lists compare element by element (an expected tuple is
  a list: JSON has no tuples), dicts by their keys and values.

Nothing here raises on what a program printed or returned: every input is a verdict. ``judge``
turns a worker's answer into the final per-test verdicts.
"""

from __future__ import annotations

import json
import math
import re

from .types import ERROR, FAILED, PASSED, SKIPPED, STATUSES, Job, TestResult

REL_TOL = 1e-5

# A plain decimal number in ASCII digits. float() alone also reads "1_000", "infinity" and Unicode
# digits, which no judge takes for a number.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def _is_float_token(tok: str) -> bool:
    return _NUMBER.match(tok) is not None and ("." in tok or "e" in tok or "E" in tok)


def _close(actual, expected: float) -> bool:
    """``actual`` (an int or a float) within the tolerance of the float ``expected``."""
    if math.isnan(expected):
        return type(actual) is float and math.isnan(actual)
    if math.isinf(expected):
        return actual == expected  # int == float is exact in Python and never overflows
    if type(actual) is int:
        try:
            actual = float(actual)
        except OverflowError:  # beyond the float range: judged exactly
            from fractions import Fraction

            a, e = Fraction(actual), Fraction(expected)
            return abs(a - e) <= Fraction(REL_TOL) * max(abs(a), abs(e))
    if not math.isfinite(actual):
        return False
    return math.isclose(actual, expected, rel_tol=REL_TOL, abs_tol=0.0)


def _tokens_equal(actual: str, expected: str) -> bool:
    if actual == expected:
        return True
    if not _is_float_token(expected) or _NUMBER.match(actual) is None:
        return False
    e = float(expected)
    if not math.isfinite(e):  # e.g. "1e400": out of the float range, only the same text
        return False
    return _close(float(actual), e)


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.rstrip().split("\n")]


def _line_matches(actual: str, expected: str) -> bool:
    if actual == expected:
        return True
    ta, te = actual.split(), expected.split()
    return len(ta) == len(te) and all(_tokens_equal(x, y) for x, y in zip(ta, te))


def stdout_matches(actual: str, expected: str) -> bool:
    """Line by line after stripping trailing whitespace (trailing blank lines ignored); a line that
    differs passes when its whitespace-separated tokens are equal, or where the expected token is a
    float, within the relative tolerance (see the module docstring)."""
    a, e = _lines(actual), _lines(expected)
    return len(a) == len(e) and all(_line_matches(la, le) for la, le in zip(a, e))


def stdout_difference(actual: str, expected: str, width: int = 80) -> str:
    """Where a wrong stdout first departs from the expected one, for feedback messages."""
    a, e = _lines(actual), _lines(expected)
    for i, (la, le) in enumerate(zip(a, e), start=1):
        if not _line_matches(la, le):
            return f"line {i}: expected {le[:width]!r}, got {la[:width]!r}"
    return f"expected {len(e)} lines, got {len(a)}"


def values_equal(actual, expected) -> bool:
    """Typed comparison of a JSON value a program returned with the expected one (see the module
    docstring). Iterative: no nesting depth makes it raise."""
    stack = [(actual, expected)]
    while stack:
        a, e = stack.pop()
        ta, te = type(a), type(e)
        if te is float:
            if not ((ta is float or ta is int) and _close(a, e)):
                return False
        elif te is list or te is tuple:
            if ta is not list or len(a) != len(e):
                return False
            stack.extend(zip(a, e))
        elif te is dict:
            if ta is not dict or a.keys() != e.keys():
                return False
            stack.extend((a[k], e[k]) for k in e)
        elif not (ta is te and (te is int or te is bool or te is str or e is None) and a == e):
            return False  # int, bool, str, None: the same type and value; anything else never
    return True


def _shown(value, width: int = 200) -> str:
    """A returned or expected value for a message; never raises (a value too deep or with too
    many digits for JSON is named by its type)."""
    try:
        text = json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        return f"<{type(value).__name__} that cannot be shown>"
    return text if len(text) <= width else text[: width - 3] + "..."


def _judge_one(kind: str, test: dict, st, msg: str, raw_t: dict) -> tuple[str, str]:
    if st == "returned" and kind == "call":
        v = raw_t.get("value")
        if values_equal(v, test["expected"]):
            return PASSED, ""
        return FAILED, f"returned {_shown(v)}, expected {_shown(test['expected'])}"
    if st == "returned" and kind == "stdio":
        got = raw_t.get("value", "")
        if stdout_matches(got, test["output"]):
            return PASSED, ""
        return FAILED, f"wrong answer: {stdout_difference(got, test['output'])}"
    if st == PASSED and kind != "assert":
        return ERROR, "sandbox worker sent an unjudged pass"
    if st not in STATUSES:
        return ERROR, f"sandbox worker sent status {st!r}"
    return st, msg


def judge(job: Job, raw: list) -> list[TestResult]:
    """Final per-test verdicts from a worker's answer. ``stdio``/``call`` tests come back as
    "returned" with the program's stdout / JSON value and are compared here; with
    ``run_all_cases`` false everything after the first non-pass becomes "skipped" (the worker
    only stops early on failures it can see itself: errors, timeouts, limits). Whatever a program
    printed or returned gives a verdict here, never an exception."""
    out = []
    for t, raw_t in zip(job.tests, raw):
        st, msg = raw_t.get("status"), str(raw_t.get("message", ""))
        try:
            st, msg = _judge_one(job.kind, t, st, msg, raw_t)
        except Exception as exc:  # a comparison this module did not foresee: an error, never a pass
            st, msg = ERROR, f"sandbox could not judge the output: {type(exc).__name__}: {exc}"[:500]
        out.append(TestResult(st, msg))
    if not job.run_all_cases:
        for i, t in enumerate(out):
            if t.status != PASSED:
                out[i + 1 :] = [TestResult(SKIPPED) for _ in out[i + 1 :]]
                break
    return out
