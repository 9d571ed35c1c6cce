"""The Engine protocol that every rollout engine implements (native torch, SGLang)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import torch

from fastcrit.types import Rollout, SamplingParams


@runtime_checkable
class Engine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        """Sample ``params.n`` completions for each prompt (token ids, no padding).

        Returns ``len(prompts) * n`` rollouts ordered prompt-major: the n samples of prompt i are at
        positions ``i*n .. i*n + n - 1`` and carry ``prompt_index == i``.
        """
        ...

    def sleep(self) -> None:
        """Release memory held for generation (KV cache, weights on GPU) before training."""
        ...

    def wake(self) -> None:
        """Re-acquire what sleep() released. SGLang's and the native engine's wake give the
        weights' memory back without their values: load every weight again before the next
        generate (they refuse otherwise)."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights by Hugging Face parameter name, full (not sharded) tensors.

        One call is one update (for SGLang one weight-update session, bucketed inside); the
        iterable is consumed lazily, so it may gather tensors as it goes. The native engine accepts
        any subset; after a wake, pass the full set.
        """
        ...

    def close(self) -> None: ...
