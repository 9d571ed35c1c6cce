"""Rule-based rewards: exact, checkable answers, no model and no sandbox."""

from __future__ import annotations

from fastcrit.data.tasks import reverse_reward as reverse_reward  # the `reverse` task's own score, re-exported
from fastcrit.reward.base import RewardItem, RewardResult, register

NO_REFERENCE = "no reference answer: the row's answer is empty"


def exact_match(response: str, answer: str) -> RewardResult:
    """1.0 when the stripped response equals the stripped answer. A row without an answer (a
    missing or empty answer column loads as "") scores 0.0 with a reason: matching it would pay
    an empty or all-whitespace output in full, the cheapest output a policy can learn."""
    if not answer.strip():
        return RewardResult(0.0, {"reason": NO_REFERENCE})
    return RewardResult(float(response.strip() == answer.strip()))


def _same_words(it: RewardItem) -> bool:
    """The response has the answer's words in order (no answer: never, as reverse_reward's 0.0)."""
    return bool(it.answer.split()) and it.response.split() == it.answer.split()


@register("reverse")
class ReverseReward:
    name = "reverse"

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        return [RewardResult(reverse_reward(it.response, it.answer), {"exact": _same_words(it)}) for it in items]


@register("exact_match")
class ExactMatchReward:
    """1.0 when the stripped response equals the stripped answer, else 0.0 (``exact_match``)."""

    name = "exact_match"

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        return [exact_match(it.response, it.answer) for it in items]


@register("rule")
class TaskRule:
    """Each row's own rule: the `reverse` task's partial credit for its rows (meta task "reverse"),
    exact match of the stripped answer for every other row (``exact_match``: a row without an
    answer scores 0.0)."""

    name = "rule"

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        out = []
        for it in items:
            if it.meta.get("task") == "reverse":
                out.append(RewardResult(reverse_reward(it.response, it.answer), {"exact": _same_words(it)}))
            else:
                r = exact_match(it.response, it.answer)
                out.append(RewardResult(r.score, {"exact": r.score == 1.0, **r.info}))
        return out
