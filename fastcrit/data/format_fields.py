"""Field helpers of the converters in formats.py: each reads one field of a row (or checks a
caller's option) and names the field it rejects; ``_unwrap_outputs`` shapes the expected values of
call-based tests."""

from __future__ import annotations

import json

from fastcrit.data.problems import ProblemError

# What ast.parse raises on a dataset's source besides SyntaxError: ValueError (a NUL byte, before
# Python 3.12), MemoryError ("parser stack overflow" on deep nesting: 200 kB of "-" in one test)
# and RecursionError. load_problems catches none of them, so they crashed `fastcrit data convert`.
_UNPARSABLE = (SyntaxError, ValueError, MemoryError, RecursionError)


def _check_row(row) -> dict:
    if not isinstance(row, dict):
        raise ProblemError(f"a row must be an object, got {type(row).__name__}")
    return row


def _str(row: dict, key: str, *, empty_ok: bool = False) -> str:
    if key not in row or row[key] is None:
        raise ProblemError(f"missing field {key!r}")
    v = row[key]
    if not isinstance(v, str):
        raise ProblemError(f"{key!r} must be a string, got {type(v).__name__}")
    if not empty_ok and not v.strip():
        raise ProblemError(f"{key!r} is empty")
    return v


def _opt_str(row: dict, key: str) -> str:
    v = row.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise ProblemError(f"{key!r} must be a string, got {type(v).__name__}")
    return v


def _str_list(value, where: str) -> list[str]:
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise ProblemError(f"{where} must be a list of strings, got {type(value).__name__}")
    for i, s in enumerate(value):
        if not isinstance(s, str):
            raise ProblemError(f"{where}[{i}] must be a string, got {type(s).__name__}")
    return value


def _identifier(value, where: str) -> str:
    if not isinstance(value, str) or not value.isidentifier():
        raise ProblemError(f"{where} must be a Python identifier, got {value!r}")
    return value


def _json(value, where: str):
    """A field the dataset stores as a JSON string (an already decoded value is taken as is)."""
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as e:
        raise ProblemError(f"{where} is not valid JSON ({e})") from None


def _row_id(row: dict, keys: tuple, source: str, index) -> str:
    for k in keys:
        v = row.get(k)
        if isinstance(v, bool):
            break
        if isinstance(v, str) and v.strip():
            return v if "/" in v else f"{source}/{v}"
        if isinstance(v, int):
            return f"{source}/{v}"
    if index is None:
        raise ProblemError(f"no id: the row has none of {list(keys)} and no row index was given")
    return f"{source}/{index}"


def _plain(v):
    """A meta value that survives JSON (parquet may hand over dates and numpy-ish scalars)."""
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def _meta(row: dict, keys) -> dict:
    return {k: _plain(row[k]) for k in keys if k in row and row[k] not in (None, "", [])}


def _check_sets(test_sets, allowed: tuple) -> tuple:
    """Validates a caller's option (a ValueError, not a row's ProblemError)."""
    if isinstance(test_sets, str):
        test_sets = tuple(s.strip() for s in test_sets.split(",") if s.strip())
    test_sets = tuple(test_sets)
    bad = [s for s in test_sets if s not in allowed]
    if bad or not test_sets:
        raise ValueError(f"test_sets must name some of {', '.join(allowed)}; got {list(test_sets)!r}")
    return test_sets


def _text(v, where: str) -> str:
    """A stdin/stdout value: a string, or a list of lines joined with newlines."""
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return "\n".join(v)
    raise ProblemError(f"{where} must be a string or a list of strings, got {type(v).__name__}")


def _unwrap_outputs(outputs: list) -> list:
    """One expected value per call-based test (see formats.py's module docstring)."""
    if any(isinstance(o, list) and len(o) != 1 for o in outputs):
        return list(outputs)
    return [o[0] if isinstance(o, list) else o for o in outputs]
