"""Process groups and launching: one code path for 1 or N processes.

The policy is always wrapped with FSDP2, so even a single CPU process joins a (world size 1) gloo
group. N processes are spawned here with torch.multiprocessing, or started by torchrun (detected
from RANK / WORLD_SIZE in the environment).
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


# How long a rank waits in a collective before the process group gives up. PyTorch's defaults are
# 10 minutes for NCCL and 30 for gloo (torch 2.13 distributed_c10d.py:832-849, constants.py); ranks
# roll out different lengths between collectives, and one long generation must not kill the run.
COLLECTIVE_TIMEOUT = timedelta(minutes=60)


@dataclass
class DistContext:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank: int, world_size: int, device_kind: str) -> DistContext:
    if device_kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("trainer.device=cuda but CUDA is not available on this machine")
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        backend = "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    return DistContext(rank=rank, world_size=world_size, device=device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _worker(rank: int, world_size: int, device_kind: str, fn: Callable, args: tuple) -> None:
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    ctx = init(rank, world_size, device_kind)
    try:
        fn(ctx, *args)
    finally:
        shutdown()


def launch(fn: Callable, args: tuple, nproc: int, device_kind: str) -> None:
    """Run ``fn(ctx, *args)`` on ``nproc`` processes (or in this one when nproc == 1 / torchrun)."""
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: it set RANK, MASTER_ADDR, ...
        _worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), device_kind, fn, args)
        return
    saved = dict(os.environ)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    try:
        if nproc == 1:
            _worker(0, 1, device_kind, fn, args)
        else:
            mp.spawn(_worker, args=(nproc, device_kind, fn, args), nprocs=nproc, join=True)
    finally:  # leave the caller's environment as it was (tests launch several runs in one process)
        os.environ.clear()
        os.environ.update(saved)


def all_reduce_mean(values: dict[str, float]) -> dict[str, float]:
    """Average scalar metrics over ranks (one collective for the whole dict)."""
    if not dist.is_initialized() or dist.get_world_size() == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return dict(zip(keys, t.tolist()))


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Element-wise ``op`` ("sum" or "max") of ``values`` over ranks (one collective; float64)."""
    if not dist.is_initialized() or dist.get_world_size() == 1 or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
