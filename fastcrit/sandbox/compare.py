"""Trusted comparisons of an execution's output with the expected one: they run in the pool
process (or the remote client), never in a worker or an execution, so expected values never reach
untrusted code."""
from __future__ import annotations

import math

REL_TOL = 1e-5


def _tokens_equal(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) or math.isnan(y):
        return False
    return math.isclose(x, y, rel_tol=REL_TOL, abs_tol=0.0)


def stdout_matches(actual: str, expected: str) -> bool:
    """Line by line after stripping trailing whitespace (trailing blank lines ignored); a line
    that differs passes when its whitespace-separated tokens are equal or are floats within a
    relative tolerance of 1e-5 (CodeContests / TACO / SandboxFusion OJ style)."""
    a = [ln.rstrip() for ln in actual.rstrip().split("\n")]
    e = [ln.rstrip() for ln in expected.rstrip().split("\n")]
    if len(a) != len(e):
        return False
    for la, le in zip(a, e):
        if la == le:
            continue
        ta, te = la.split(), le.split()
        if len(ta) != len(te) or not all(_tokens_equal(x, y) for x, y in zip(ta, te)):
            return False
    return True


def stdout_difference(actual: str, expected: str, width: int = 80) -> str:
    """Where a wrong stdout first departs from the expected one, for feedback messages."""
    a = [ln.rstrip() for ln in actual.rstrip().split("\n")]
    e = [ln.rstrip() for ln in expected.rstrip().split("\n")]
    for i, (la, le) in enumerate(zip(a, e), start=1):
        if la != le and not stdout_matches(la, le):
            return f"line {i}: expected {le[:width]!r}, got {la[:width]!r}"
    return f"expected {len(e)} lines, got {len(a)}"


def values_equal(actual, expected) -> bool:
    """Typed comparison of JSON values: bool is not int, tuples arrive as lists, floats within a
    relative tolerance of 1e-5, ints exactly."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        if isinstance(expected, int) and isinstance(actual, int):
            return actual == expected
        if math.isnan(expected) or math.isnan(actual):
            return math.isnan(expected) and math.isnan(actual)
        return math.isclose(actual, expected, rel_tol=REL_TOL, abs_tol=0.0)
    if isinstance(expected, (list, tuple)):
        return isinstance(actual, list) and len(actual) == len(expected) and all(
            values_equal(a, e) for a, e in zip(actual, expected))
    if isinstance(expected, dict):
        return isinstance(actual, dict) and actual.keys() == expected.keys() and all(
            values_equal(actual[k], expected[k]) for k in expected)
    return type(actual) is type(expected) and actual == expected
