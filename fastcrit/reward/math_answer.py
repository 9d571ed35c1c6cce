"""The `math` reward: the response's final answer checked against the reference by `math-verify`
(symbolic equivalence through sympy: `\\frac{1}{2}`, `0.5` and `1/2` agree), not by string equality.

The response's answer is its last `\\boxed{...}`, else the last LaTeX or plain expression it
states (math-verify's extraction, boxed first) in its last ``TAIL_CHARS`` characters. The reference
may be a bare expression (`1/2`), a LaTeX one, or already boxed. Score 1.0 when they agree, else
0.0. A response without any answer scores 0.0 with `no_answer` and a `reason`; an answer that is
not valid math (`\\frac{1}{`) is compared as text and its `reason` says so; a reference that does
not parse scores 0.0 with a `reason`. Nothing raises.

Bounds (model outputs are adversarial during RL): a boxed answer longer than
``MAX_ANSWER_CHARS`` is not parsed (0.0, with a reason), and each item's whole check (the
reference's parse, the answer's, the comparison) gets ``TIMEOUT_S`` seconds, after which it scores
0.0 with ``timeout`` true and a reason (``10^{10^{10}}``, ``(10^{10})!``, a long run of numbers
without a box). The deadline is a SIGALRM timer: main thread only; in other threads there is none.
"""

from __future__ import annotations

import contextlib
import signal
import threading

from fastcrit.data.math_words import last_boxed
from fastcrit.reward.base import RewardItem, RewardResult, register

TIMEOUT_S = 5.0  # one item's whole check, in seconds
# A boxed answer longer than this is refused unparsed: real final answers are short, and sympy
# spends its whole time budget on a megabyte of digits before giving up.
MAX_ANSWER_CHARS = 1000
# Without a box, only the text's end is searched: math-verify's expression pattern backtracks
# quadratically on long runs of numbers ("1 1 1 ..." of 40 kB took the whole time budget; 10 kB
# takes under a second), and the final answer is stated at the end.
TAIL_CHARS = 10_000


class _OutOfTime(BaseException):
    """The deadline's alarm. A BaseException, so that no ``except Exception`` inside math-verify,
    latex2sympy or sympy can swallow it."""


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise _OutOfTime in the block after ``seconds``; no deadline off the main thread.

    One timer for the whole item instead of math-verify's own (one alarm per parse and per
    comparison, each of which silently becomes "no answer" or "not equal", and which together
    allowed three times the time): math-verify is called without its timeouts, since its
    ``signal.alarm`` calls would replace this timer."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    armed = [True]

    def on_alarm(signum, frame):
        if armed[0]:  # an alarm landing after the block (the restore below cut short) is ignored
            raise _OutOfTime

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _tail(text: str) -> str:
    """The last TAIL_CHARS characters of ``text``, from a line start when there is one (a cut in
    the middle of a line could pair a "$" of one formula with the next one's)."""
    if len(text) <= TAIL_CHARS:
        return text
    tail = text[-TAIL_CHARS:]
    nl = tail.find("\n")
    return tail[nl + 1 :] if 0 <= nl < len(tail) - 1 else tail


def _parse(text: str, *, gold: bool):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    if gold and "\\boxed" not in text and "$" not in text:
        text = f"\\boxed{{{text}}}"
    text = last_boxed(text) or (text if gold else _tail(text))
    return parse(text, extraction_config=configs, parsing_timeout=None)


def _check(response: str, answer: str) -> RewardResult:
    from math_verify import verify

    gold = _parse(answer, gold=True)
    if not gold:
        return RewardResult(0.0, {"reason": f"reference answer {answer[:200]!r} does not parse"})
    boxed = last_boxed(response)
    if boxed is not None and len(boxed) - len("\\boxed{}") > MAX_ANSWER_CHARS:
        return RewardResult(
            0.0, {"reason": f"boxed answer of {len(boxed) - 8} characters > {MAX_ANSWER_CHARS}: not parsed"}
        )
    pred = _parse(response, gold=False)
    if not pred:
        return RewardResult(0.0, {"no_answer": True, "reason": "no answer found"})
    ok = bool(verify(gold, pred, timeout_seconds=None))
    info = {"correct": ok, "answer": str(pred[-1])}
    if all(isinstance(p, str) for p in pred):  # only math-verify's string fallback: compared as text
        info["reason"] = f"answer {str(pred[-1])!r} does not parse as math; compared as text"
    return RewardResult(float(ok), info)


def math_score(response: str, answer: str) -> RewardResult:
    """Score and info (``correct``, ``no_answer``, ``timeout``; ``answer`` and ``reason`` where
    they apply) of one response against its reference answer."""
    base = {"correct": False, "no_answer": False, "timeout": False}
    try:
        with _deadline(TIMEOUT_S):
            r = _check(response, answer)
    except _OutOfTime:
        reason = f"checking the answer took more than {TIMEOUT_S:g} s: scored wrong"
        return RewardResult(0.0, {**base, "timeout": True, "reason": reason})
    return RewardResult(r.score, {**base, **r.info})


@register("math")
class MathReward:
    name = "math"

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        return [math_score(it.response, it.answer) for it in items]
