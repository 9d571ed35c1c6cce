"""A reward written by the user, named by import path: ``reward.name: mypkg.rewards:score``.

The function is called once per response, verl's way::

    def score(prompt: str, response: str, answer: str, meta: dict) -> float | dict

returning a float, or a dict with a float ``"score"`` and any other small JSON-able fields (kept in
the result's info). An import that fails stops the run at once, naming the path; a function that
raises on one response, or returns something that is not a finite number, gives that response
0.0 with the reason in its info (``error``), and the run goes on.
"""

from __future__ import annotations

import importlib
import math
import os
import sys

from fastcrit.config import ConfigError
from fastcrit.reward.base import RewardItem, RewardResult


def load_function(path: str):
    """``module:function`` -> the callable (the current directory is importable, as for scripts)."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ConfigError(f"reward.name {path!r}: a user function is named 'module:function'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # (any import failure is the user's to see, named)
        raise ConfigError(f"reward.name {path!r}: cannot import {module!r}: {type(e).__name__}: {e}") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ConfigError(f"reward.name {path!r}: {module!r} has no function {attr!r}")
    return fn


class FunctionReward:
    def __init__(self, path: str):
        self.name = path
        self.fn = load_function(path)

    def one(self, it: RewardItem) -> RewardResult:
        try:
            out = self.fn(it.prompt, it.response, it.answer, it.meta)
        except Exception as e:  # (one bad response must not stop the run)
            return RewardResult(0.0, {"error": True, "reason": f"{self.name} raised {type(e).__name__}: {e}"})
        info = {}
        if isinstance(out, dict):
            info = {k: v for k, v in out.items() if k != "score"}
            out = out.get("score")
        if isinstance(out, bool) or not isinstance(out, (int, float)) or not math.isfinite(out):
            return RewardResult(
                0.0, {**info, "error": True, "reason": f"{self.name} returned {out!r}, not a finite number"}
            )
        return RewardResult(float(out), {**info, "error": False})

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        return [self.one(it) for it in items]
