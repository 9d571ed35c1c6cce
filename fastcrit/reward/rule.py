"""Rule-based rewards: exact, checkable answers, no model and no sandbox."""

from __future__ import annotations

from fastcrit.data.tasks import reverse_reward as reverse_reward  # the `reverse` task's own score, re-exported
from fastcrit.reward.base import RewardItem, RewardResult, register


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
