"""Reward managers by name. Importing this package registers the built-in ones."""
from fastcrit.reward import code  # noqa: F401  (registers "code")
from fastcrit.reward import rule  # noqa: F401  (registers "reverse", "exact_match")
from fastcrit.reward.base import (RewardItem, RewardManager, RewardResult, get_reward_manager,
                                  known_reward_managers, register)

__all__ = ["RewardItem", "RewardManager", "RewardResult", "get_reward_manager",
           "known_reward_managers", "register"]
