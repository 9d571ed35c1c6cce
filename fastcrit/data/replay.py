"""A replay buffer of past items (RARO keeps (question, expert answer, policy answer) triples), FIFO
or reservoir, with a state that checkpoints save and a resumed run restores exactly."""

from __future__ import annotations

import random
from typing import Any

MODES = ("fifo", "reservoir")


class ReplayBuffer:
    """``fifo``: the newest ``capacity`` items. ``reservoir``: a uniform sample of every item ever
    pushed (Vitter's algorithm R), so old behaviour stays represented however long the run."""

    def __init__(self, capacity: int, mode: str = "fifo", seed: int = 0):
        if capacity < 1:
            raise ValueError(f"replay buffer capacity must be >= 1, got {capacity}")
        if mode not in MODES:
            raise ValueError(f"replay buffer mode must be one of {MODES}, got {mode!r}")
        self.capacity, self.mode = capacity, mode
        self.items: list[Any] = []
        self.seen = 0  # items ever pushed
        self._next = 0  # fifo: the slot the next item overwrites once full
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.items)

    def push(self, item: Any) -> None:
        self.seen += 1
        if len(self.items) < self.capacity:
            self.items.append(item)
        elif self.mode == "fifo":
            self.items[self._next] = item
            self._next = (self._next + 1) % self.capacity
        else:
            j = self.rng.randrange(self.seen)
            if j < self.capacity:
                self.items[j] = item

    def sample(self, k: int) -> list[Any]:
        """``k`` items drawn uniformly without replacement (fewer when the buffer holds fewer)."""
        return self.rng.sample(self.items, min(k, len(self.items)))

    def state_dict(self) -> dict:
        return {
            "capacity": self.capacity,
            "mode": self.mode,
            "items": list(self.items),
            "seen": self.seen,
            "next": self._next,
            "rng": self.rng.getstate(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["capacity"] != self.capacity or state["mode"] != self.mode:
            raise ValueError(
                f"replay buffer: the checkpoint's is {state['mode']} x {state['capacity']}, "
                f"this run's {self.mode} x {self.capacity}; resume with the same settings"
            )
        self.items, self.seen, self._next = list(state["items"]), state["seen"], state["next"]
        self.rng.setstate(state["rng"])
