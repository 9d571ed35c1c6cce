"""Reward managers by name. Importing this package registers the built-in ones."""
from __future__ import annotations

import os

from fastcrit.reward import code  # noqa: F401  (registers "code")
from fastcrit.reward import rule  # noqa: F401  (registers "reverse", "exact_match")
from fastcrit.reward.base import (RewardItem, RewardManager, RewardResult, get_reward_manager,
                                  known_reward_managers, register)

__all__ = ["RewardItem", "RewardManager", "RewardResult", "get_reward_manager",
           "known_reward_managers", "make_reward", "register"]


def make_reward(cfg, workdir: str, rank: int = 0) -> RewardManager:
    """The manager ``reward.name`` names, built from the config tree (``cfg``: fastcrit.config.Config).

    The code manager gets the sandbox settings, ``reward.score`` and a result cache in ``workdir``
    (one file per rank) unless ``sandbox.cache_path`` names one.
    """
    name = cfg.reward.name
    if name == "code":
        cache = os.path.join(workdir, f"sandbox_cache_rank{rank}.sqlite")
        return get_reward_manager(name, sandbox=cfg.sandbox, score=cfg.reward.score, cache_path=cache)
    return get_reward_manager(name)
