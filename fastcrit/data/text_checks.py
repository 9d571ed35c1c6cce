"""Checks on text read from users' files that the data loaders share."""

from __future__ import annotations


def lone_surrogate(*values) -> bool:
    """Whether a text, or any string in nested lists and dicts, holds a lone UTF-16 surrogate
    (JSON's "\\ud800" escape decodes to one): not Unicode text, so the tokenizer raises a
    TypeError on it, far from the row, and it cannot be written back as UTF-8. A loop, not
    recursion: a problem's tests may nest deep."""
    todo = list(values)
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            todo += [*v.keys(), *v.values()]
        elif isinstance(v, list):
            todo += v
    return False


SURROGATE_WHY = "holds a lone surrogate (a \\udXXX escape that is no character)"
