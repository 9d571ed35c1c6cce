"""Rollout engines behind one protocol (base.Engine): native torch, and SGLang on GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package stays light to import (the CLI registers `fastcrit serve` from it)
    import torch

    from fastcrit.rollout.base import Engine


def make_engine(rollout_cfg, model_path: str, *, dtype: str, device: torch.device, seed: int = 0) -> Engine:
    """Build the engine named by ``rollout.engine`` for ``model_path``; ``rollout.engine_args`` go to
    its constructor as keyword arguments."""
    if rollout_cfg.engine == "native":
        import inspect

        from fastcrit.rollout.native import NativeEngine

        known = set(inspect.signature(NativeEngine).parameters) - {"model", "tokenizer", "dtype", "device"}
        unknown = sorted(set(rollout_cfg.engine_args) - known)
        if unknown:
            raise ValueError(
                f"rollout.engine_args: {unknown} are not NativeEngine arguments (it takes {sorted(known)})"
            )
        return NativeEngine(model_path, dtype=dtype, device=device, **rollout_cfg.engine_args)
    if rollout_cfg.engine == "sglang":
        from fastcrit.rollout.sglang import SGLangEngine  # GPU only; imports sglang lazily

        return SGLangEngine(model_path, rollout_cfg, dtype=dtype, device=device, seed=seed)
    raise ValueError(f"rollout.engine: unknown engine {rollout_cfg.engine!r} (native, sglang)")
