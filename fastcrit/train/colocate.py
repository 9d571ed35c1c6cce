"""Time slicing between the rollout engine and the trainer on the same devices."""

from __future__ import annotations

from fastcrit.models.hf import parse_dtype
from fastcrit.rollout.base import Engine
from fastcrit.train.actor import Actor
from fastcrit.train.policy import gathered_tensors

_GIB = float(1 << 30)


def sync_weights(actor: Actor, engine: Engine, rollout, dtype: str) -> float:
    """Load the policy's full weights into ``engine`` in one ``load_weights`` call (for SGLang one
    weight-update session), gathered in the engine's ``dtype`` in buckets of
    ``rollout.weight_bucket_mb`` (one all-gather per bucket: ``gathered_buckets``). A collective:
    every rank gathers, each rank's engine loads. Gathering is lazy, so about one bucket of
    gathered tensors is alive at a time (SGLang holds one more while it copies). Returns the GiB
    handed to the engine."""
    moved = 0

    def counted():
        nonlocal moved
        for name, t in gathered_tensors(actor.module, parse_dtype(dtype), rollout.weight_bucket_mb << 20):
            moved += t.numel() * t.element_size()
            yield name, t

    engine.load_weights(counted())
    return moved / _GIB
