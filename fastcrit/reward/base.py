"""Reward managers map (prompt, response, answer, meta) -> score + info, chosen by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from fastcrit.data.problems import Problem


@dataclass
class RewardItem:
    prompt: str
    response: str  # decoded response text, special tokens removed
    answer: str  # the reference answer ("" when the task has none)
    meta: dict = field(default_factory=dict)
    problem: Problem | None = None  # code tasks: the tests the response's program must pass


@dataclass
class RewardResult:
    score: float
    info: dict = field(default_factory=dict)  # small, JSON-able details (e.g. parsed answer)


class RewardManager(Protocol):
    name: str

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]: ...


_REGISTRY: dict[str, Callable[..., RewardManager]] = {}


def register(name: str):
    def deco(factory):
        _REGISTRY[name] = factory
        return factory

    return deco


def known_reward_managers() -> list[str]:
    return sorted(_REGISTRY)
