"""Time slicing between the rollout engine and the trainer on the same devices."""
from __future__ import annotations

import time

from fastcrit.rollout.base import Engine
from fastcrit.train.actor import Actor
from fastcrit.train.policy import full_named_tensors


def sync_weights(actor: Actor, engine: Engine) -> float:
    """Gather the policy's full weights tensor by tensor and load them into the engine in one
    ``load_weights`` call (for SGLang one weight-update session, bucketed by
    ``rollout.weight_bucket_mb`` inside the engine; the native engine copies each tensor as it comes).

    A collective: every rank gathers; each rank's engine loads. Gathering is lazy, so at most one
    bucket of gathered tensors is alive at a time. Returns seconds spent.
    """
    t0 = time.perf_counter()
    engine.load_weights(full_named_tensors(actor.module))
    return time.perf_counter() - t0
