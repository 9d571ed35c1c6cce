"""Reward managers by name. Importing this package registers the built-in ones."""

from __future__ import annotations

import os

from fastcrit.config import ConfigError
from fastcrit.config_values import reward_model_path
from fastcrit.reward import (
    code,  # noqa: F401  (registers "code")
    math_answer,  # noqa: F401  (registers "math")
    raro,  # noqa: F401  (registers "raro")
    rule,  # noqa: F401  (registers "rule", "reverse", "exact_match")
)
from fastcrit.reward.base import (
    _REGISTRY,
    RewardItem,
    RewardManager,
    RewardResult,
    known_reward_managers,
    register,
)
from fastcrit.reward.function import FunctionReward
from fastcrit.reward.model import CombinedReward  # registers "model"

__all__ = [
    "RewardItem",
    "RewardManager",
    "RewardResult",
    "get_reward_manager",
    "known_reward_managers",
    "make_reward",
    "register",
]


def get_reward_manager(name: str, **kwargs) -> RewardManager:
    """The manager registered as ``name``, or a user function named ``module:function``."""
    if ":" in name:
        return FunctionReward(name)
    if name not in _REGISTRY:
        raise ConfigError(
            f"reward.name: unknown reward manager {name!r} (known: {sorted(_REGISTRY)}, or a "
            f"user function as 'module:function')"
        )
    return _REGISTRY[name](**kwargs)


def make_reward(cfg, workdir: str, rank: int = 0, device="cpu") -> RewardManager:
    """The manager ``reward.name`` names, built from the config tree (``cfg``: fastcrit.config.Config);
    several joined by "+" add up with ``reward.weights``.

    The code manager gets the sandbox settings, ``reward.score`` and a result cache in ``workdir``
    (one file per rank) unless ``sandbox.cache_path`` names one; the model manager loads
    ``reward_model_path(cfg)`` in ``model.dtype`` on ``device``.
    """
    names = cfg.reward.name.split("+")
    parts = [(n, _one(n, cfg, workdir, rank, device)) for n in names]
    if len(parts) == 1 and not cfg.reward.weights:
        return parts[0][1]
    return CombinedReward(parts, list(cfg.reward.weights) or [1.0] * len(parts))


def _one(name: str, cfg, workdir: str, rank: int, device) -> RewardManager:
    if name == "code":
        cache = os.path.join(workdir, f"sandbox_cache_rank{rank}.sqlite")
        return get_reward_manager(name, sandbox=cfg.sandbox, score=cfg.reward.score, cache_path=cache)
    if name == "model":
        return get_reward_manager(
            name,
            path=reward_model_path(cfg),
            dtype=cfg.model.dtype,
            device=device,
            batch_size=cfg.reward.model_batch_size,
        )
    return get_reward_manager(name)
