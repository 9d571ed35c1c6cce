"""Small pieces the recipes share: run directory, model resolution, data order, hardware checks."""

from __future__ import annotations

import functools
import os

import torch

from fastcrit.config import Config, ConfigError, dump_yaml
from fastcrit.models.hf import flash_attn_2_problem, model_spec, resolve_model_path
from fastcrit.train.dist import DistContext, barrier
from fastcrit.train.trackers import check_installed


def check_hardware(cfg: Config, config_path: str | None) -> None:
    """Fail at once, with the way out, when the config asks for hardware (or a tracker's package,
    ``trainer.loggers``) this machine lacks."""
    where = config_path or "the config"
    if cfg.trainer.device == "cuda" and not torch.cuda.is_available():
        twin = cpu_twin(config_path)
        raise ConfigError(
            f"{where} is a GPU setup (trainer.device: cuda, rollout.engine: {cfg.rollout.engine}) "
            "and this machine has no CUDA device. For the embedded CPU default run: "
            f"fastcrit train {twin}"
        )
    if cfg.rollout.engine == "sglang" and cfg.trainer.device != "cuda":
        raise ConfigError(f"{where}: rollout.engine=sglang needs trainer.device=cuda; use rollout.engine=native on CPU")
    if cfg.trainer.pack_sequences and cfg.trainer.device == "cuda":
        # before any process starts or weight loads (build_actor checks again, for other callers)
        problem = flash_attn_2_problem()
        if problem is not None:
            raise ConfigError(f"{where}: trainer.pack_sequences on CUDA runs on flash-attn 2's varlen path: {problem}")
    try:  # a tracker whose package is missing stops the run here, not after the SFT warm start
        check_installed(cfg.trainer.loggers)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def cpu_twin(config_path: str | None) -> str:
    """configs/<algo>.yaml, or a variant configs/<algo>_<variant>.yaml, -> configs/cpu/<algo>.yaml
    (the GRPO one when there is no twin)."""
    if config_path:
        name = os.path.basename(config_path)
        for candidate in (name, name.split("_")[0] + ".yaml"):
            twin = os.path.join(os.path.dirname(config_path), "cpu", candidate)
            if os.path.isfile(twin):
                return os.path.relpath(twin) if not os.path.isabs(config_path) else twin
    return "configs/cpu/grpo.yaml"


def resolve_model(cfg: Config, ctx: DistContext) -> str:
    """Rank 0 builds the tiny model first (if asked for); the others then find it cached."""
    spec = model_spec(cfg.model)
    path = resolve_model_path(spec) if ctx.is_main else None
    barrier()
    return path if path is not None else resolve_model_path(spec)


def prepare_output_dir(cfg: Config, ctx: DistContext, output_dir: str) -> None:
    if ctx.is_main:
        os.makedirs(output_dir, exist_ok=True)
        dump_yaml(cfg, os.path.join(output_dir, "config.yaml"))
    barrier()


@functools.lru_cache(maxsize=4)
def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


def step_indices(n: int, per_step: int, step: int, seed: int, rank: int, world: int) -> list[int]:
    """Dataset indices for 1-based ``step`` on ``rank``: a seeded permutation per epoch, read in
    order, so a resumed run sees exactly the data it would have seen."""
    start = (step - 1) * per_step
    idx = []
    for pos in range(start, start + per_step):
        epoch, off = divmod(pos, n)
        idx.append(int(epoch_order(n, seed, epoch)[off]))
    share = per_step // world
    return idx[rank * share : (rank + 1) * share]
