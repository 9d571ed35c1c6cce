"""The `raro` reward: a RARO critic's verdict scored by the reward matrix. Each item's response is
the critic's text and ``meta["expert_pos"]`` (1 or 2) says where the expert's answer was shown.
Score: the critic's reward (names the expert 1, fooled 0, tie ``tau_crit``); the info carries the
policy's side (``policy_reward``), the parsed ``label``, and ``unparseable`` (score 0) for a text
without one verdict [Answer 1], [Answer 2] or [Tie] at its end (``algos.raro.parse_label``)."""

from __future__ import annotations

from fastcrit.algos.raro import TIE, judge_rewards, parse_label
from fastcrit.config import RAROConfig
from fastcrit.reward.base import RewardItem, RewardResult, register


@register("raro")
class RaroJudgeReward:
    name = "raro"

    def __init__(self, tau_crit: float = RAROConfig.tau_crit, tau_pol: float = RAROConfig.tau_pol):
        self.tau_crit, self.tau_pol = tau_crit, tau_pol

    def one(self, it: RewardItem) -> RewardResult:
        pos = it.meta.get("expert_pos")
        if pos not in (1, 2):
            return RewardResult(0.0, {"unparseable": True, "reason": "meta['expert_pos'] must be 1 or 2"})
        label = parse_label(it.response)
        if label is None:
            return RewardResult(
                0.0, {"unparseable": True, "reason": "no single final [Answer 1] / [Answer 2] / [Tie] outside quotes"}
            )
        rc, rp = judge_rewards(label, pos, tau_crit=self.tau_crit, tau_pol=self.tau_pol)
        return RewardResult(
            rc,
            {
                "unparseable": False,
                "label": label,
                "tie": label == TIE,
                "named_expert": label == pos,
                "policy_reward": rp,
            },
        )

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        return [self.one(it) for it in items]
