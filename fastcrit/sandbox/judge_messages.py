"""The messages the judge (judge.py) gives a test that did not pass: an assertion's, with the
values the failing statement's calls returned, and any other exception's, named."""

from __future__ import annotations


def _short(value, width=80) -> str:
    try:
        text = repr(value)
    except Exception:  # an int too long to print, a value nested too deep
        return f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


def _assert_message(exc, source: str, chan) -> str:
    """``chan``: the execution's judge.Channel (its records of the calls made), passed in so that
    this module needs nothing from judge.py, which imports it."""
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<test "):
            line = tb.tb_lineno
        tb = tb.tb_next
    try:
        text = str(exc)
    except Exception:
        # ``assert x, value`` with a value str() refuses (an int past the digit limit a program
        # returned): the message must not take the judge down, and every later test with it.
        text = "(a message that cannot be shown)"
    if not text and line is not None:
        lines = source.splitlines()
        text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    # The values of the calls made by the failing statement, its last pass only (a loop repeats it).
    got, last = [], None
    for ln, off, v in reversed(chan.calls):
        if ln != line or (last is not None and off >= last):
            break
        got.append(_short(v))
        last = off
    msg = f"AssertionError: {text}" + (f" (returned {', '.join(reversed(got))})" if got else "")
    return msg[:500]


def _describe(exc) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:500]
    except Exception:  # str(exc) ran the program's own __str__, which may raise anything
        return type(exc).__name__
