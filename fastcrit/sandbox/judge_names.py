"""Which module the judge gives a test for a name it reads from the program (judge.py).

A test may use a module it did not import: the program imported ``math`` or ``numpy as np`` and
the test calls ``math.isclose`` / ``np.allclose``, as it would in one shared namespace. The
program's object under that name is then the checker of its own answer: a fake ``math`` whose
``isclose`` says yes to everything, or the real numpy with ``allclose`` patched. So:

- a module the program sends under a name the test reads is the judge's own import of that
  module's name (the judge sees the program's filesystem: the standard library and the allowed
  packages), never the program's copy; one the judge cannot import (a module the program made)
  is ``Withheld``: any use of it makes the test an ``error``;
- a standard-library module name that the test only reads attributes of (``math.isclose``, never
  ``math(...)`` or ``math``) is the judge's own import of that module, whatever the program bound
  to it (an object of its own is not a module, so the rule above does not catch it).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

# Modules the judge would rather not import on a program's word (side effects, or its own code).
NO_IMPORT = frozenset(
    {"antigravity", "this", "tkinter", "turtle", "turtledemo", "idlelib", "webbrowser", "fastcrit", "__main__"}
)


class Withheld:
    """What the test finds under a module name the judge will not take the program's word for:
    reading an attribute of it or calling it refuses the test (``chan.refuse``)."""

    __slots__ = ("_c", "_why")

    def __init__(self, chan, why: str):
        self._c, self._why = chan, why

    def __getattr__(self, name):
        self._c.refuse(self._why)

    def __call__(self, *args, **kwargs):
        self._c.refuse(self._why)


def import_or_withhold(chan, name: str):
    """The judge's own import of the module ``name`` the program sent, or ``Withheld``."""
    parts = name.split(".")
    if parts[0] not in NO_IMPORT and "__main__" not in parts:  # a __main__ module runs on import
        try:
            return importlib.import_module(name)
        except Exception:  # not importable here (a module the program made): withheld below
            pass
    return Withheld(chan, f"the test used {name!r}, a module of the program that the judge does not import")


def module_names(tree, ast) -> set:
    """Names of standard-library modules the test only reads attributes of (``math.isclose``)."""
    bases = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    as_module, other = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id in sys.stdlib_module_names and n.id not in NO_IMPORT:
            (as_module if id(n) in bases else other).add(n.id)
    return as_module - other


def own_modules(chan, found: list, modules: set, handle_types: tuple) -> list:
    """``found`` ([name, value] the program sent) with each name in ``modules`` that the program
    bound to a module or an object (not data) replaced by the judge's own import of that name."""
    return [
        [
            n,
            import_or_withhold(chan, n)
            if n in modules and (type(v) in handle_types or isinstance(v, ModuleType))
            else v,
        ]
        for n, v in found
    ]
