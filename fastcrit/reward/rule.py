"""Rule-based rewards: exact, checkable answers, no model and no sandbox."""

from __future__ import annotations

from fastcrit.reward.base import RewardItem, RewardResult, register


def reverse_reward(response: str, answer: str) -> float:
    """Partial credit for the `reverse` task: matching positions / max(len(answer), len(response)).

    Both sides are split on whitespace, so "e d c b a" vs answer "e d c b a" scores 1.0, a response
    with the right letters in the wrong order scores by position, and extra tokens cost credit.
    """
    pred, gold = response.split(), answer.split()
    if not gold:
        return 0.0
    hits = sum(p == g for p, g in zip(pred, gold))
    return hits / max(len(gold), len(pred))


@register("reverse")
class ReverseReward:
    name = "reverse"

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        return [
            RewardResult(reverse_reward(it.response, it.answer), {"exact": it.response.split() == it.answer.split()})
            for it in items
        ]


@register("exact_match")
class ExactMatchReward:
    """1.0 when the stripped response equals the stripped answer, else 0.0."""

    name = "exact_match"

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        return [RewardResult(float(it.response.strip() == it.answer.strip())) for it in items]


@register("rule")
class TaskRule:
    """Each row's own rule: the `reverse` task's partial credit for its rows (meta task "reverse"),
    exact match of the stripped answer for every other row."""

    name = "rule"

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        out = []
        for it in items:
            exact = it.response.split() == it.answer.split()
            if it.meta.get("task") == "reverse":
                out.append(RewardResult(reverse_reward(it.response, it.answer), {"exact": exact}))
            else:
                out.append(
                    RewardResult(
                        float(it.response.strip() == it.answer.strip()),
                        {"exact": it.response.strip() == it.answer.strip()},
                    )
                )
        return out
