"""Time slicing between the rollout engine and the trainer on the same devices."""
from __future__ import annotations

import time

from fastcrit.rollout.base import Engine
from fastcrit.train.actor import Actor
from fastcrit.train.policy import buckets, full_named_tensors


def sync_weights(actor: Actor, engine: Engine, bucket_mb: int) -> float:
    """Gather the policy's full weights bucket by bucket and load each into the engine.

    A collective: every rank gathers; each rank's engine loads. Returns seconds spent. A bucket is
    kept alive until ``load_weights`` returns (SGLang consumes tensors asynchronously otherwise).
    """
    t0 = time.perf_counter()
    for bucket in buckets(full_named_tensors(actor.module), max(1, bucket_mb) << 20):
        engine.load_weights(bucket)
    return time.perf_counter() - t0
