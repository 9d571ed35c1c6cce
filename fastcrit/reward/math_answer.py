"""The `math` reward: the response's final answer checked against the reference by `math-verify`
(symbolic equivalence through sympy: `\\frac{1}{2}`, `0.5` and `1/2` agree), not by string equality.

The response's answer is its last `\\boxed{...}`, else the last LaTeX or plain expression it
states (math-verify's extraction, boxed first). The reference may be a bare expression (`1/2`), a
LaTeX one, or already boxed. Score 1.0 when they agree, else 0.0. A response without any answer
scores 0.0 with `no_answer` and a `reason`; an answer that is not valid math (`\\frac{1}{`) is
compared as text and its `reason` says so; a reference that does not parse scores 0.0 with a
`reason`. Nothing raises. math-verify bounds each parse and comparison by a timeout (it uses
signals: main thread only; in other threads the timeouts are off).
"""

from __future__ import annotations

import threading

from fastcrit.data.math_words import last_boxed
from fastcrit.reward.base import RewardItem, RewardResult, register

TIMEOUT_S = 5


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse(text: str, *, gold: bool):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    if gold and "\\boxed" not in text and "$" not in text:
        text = f"\\boxed{{{text}}}"
    text = last_boxed(text) or text
    return parse(text, extraction_config=configs, parsing_timeout=_timeout())


def math_score(response: str, answer: str) -> RewardResult:
    from math_verify import verify

    gold = _parse(answer, gold=True)
    if not gold:
        return RewardResult(
            0.0, {"correct": False, "no_answer": False, "reason": f"reference answer {answer!r} does not parse"}
        )
    pred = _parse(response, gold=False)
    if not pred:
        return RewardResult(0.0, {"correct": False, "no_answer": True, "reason": "no answer found"})
    ok = bool(verify(gold, pred, timeout_seconds=_timeout()))
    info = {"correct": ok, "no_answer": False, "answer": str(pred[-1])}
    if all(isinstance(p, str) for p in pred):  # only math-verify's string fallback: compared as text
        info["reason"] = f"answer {str(pred[-1])!r} does not parse as math; compared as text"
    return RewardResult(float(ok), info)


@register("math")
class MathReward:
    name = "math"

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        return [math_score(it.response, it.answer) for it in items]
