"""Process groups and launching: one code path for 1 or N processes.

The policy is always wrapped with FSDP2, so even a single CPU process joins a (world size 1) gloo
group. N processes are spawned here with torch.multiprocessing, or started by torchrun (detected
from RANK / WORLD_SIZE in the environment).
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastcrit.config import TrainerConfig
from fastcrit.train import preempt
from fastcrit.train.preempt import Stopped

# How long a rank waits for the others (joining the group, and in every collective) before the
# process group gives up, unless trainer.dist_timeout_s says otherwise. PyTorch's defaults are 10
# minutes for NCCL and 30 for gloo (torch 2.13 distributed_c10d.py:832-849, constants.py); ranks
# roll out different lengths between collectives, and one long generation must not kill the run.
DEFAULT_TIMEOUT_S = TrainerConfig.dist_timeout_s


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


def torchrun_world() -> int | None:
    """The world size torchrun (torch.distributed.elastic) set for this process, or None."""
    if "TORCHELASTIC_RUN_ID" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return None


def local_world_size(world_size: int) -> int:
    """How many ranks run on this host: torchrun's LOCAL_WORLD_SIZE, else all of them (spawned here)."""
    if torchrun_world() is not None and os.environ.get("LOCAL_WORLD_SIZE"):
        return int(os.environ["LOCAL_WORLD_SIZE"])
    return world_size


def where(rank: int, world_size: int) -> str:
    """'rank R of W (host H, local rank L)', for messages that must say which process failed."""
    local = os.environ.get("LOCAL_RANK", str(rank))
    return f"rank {rank} of {world_size} (host {socket.gethostname()}, local rank {local})"


def init(rank: int, world_size: int, device_kind: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
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
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    return DistContext(rank=rank, world_size=world_size, device=device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _worker(rank: int, world_size: int, device_kind: str, fn: Callable, args: tuple, timeout_s: float) -> None:
    os.environ["RANK"] = str(rank)
    os.environ.setdefault("LOCAL_RANK", str(rank))
    os.environ["WORLD_SIZE"] = str(world_size)
    try:
        ctx = init(rank, world_size, device_kind, timeout_s)
    except Exception as e:  # a peer that never joins: the store wait times out
        raise DistError(
            f"{where(rank, world_size)}: joining the process group failed within "
            f"{timeout_s:g} s (trainer.dist_timeout_s): {type(e).__name__}: {_first_line(e)}. "
            "Every node must start with the same --nnodes and rendezvous endpoint"
        ) from e
    try:
        try:
            fn(ctx, *args)
        except Stopped:  # every rank stops at the same point (agree_to_stop): leave together too
            if world_size > 1:
                dist.barrier()
            raise
        if world_size > 1:  # tear down together: no rank destroys the group while a peer still talks
            dist.barrier()
    except Exception as e:
        if world_size > 1 and _is_dist_failure(e):
            raise DistError(
                f"{where(rank, world_size)}: a collective failed: {type(e).__name__}: "
                f"{_first_line(e)}. Another rank most likely stopped first (its own "
                "message says why) or did not answer within trainer.dist_timeout_s "
                f"({timeout_s:g} s)"
            ) from e
        if world_size > 1:
            print(
                f"fastcrit: {where(rank, world_size)} failed: {type(e).__name__}: {_first_line(e)}",
                file=sys.stderr,
                flush=True,
            )
        raise
    finally:
        # The rank's models are garbage by now, held only in reference cycles (FSDP2's hooks): free
        # them, and any collective handles they keep, while the interpreter is whole. A gloo work
        # object first freed at interpreter exit needs the GIL it cannot have and aborts the
        # process (pytorch PR 179291); one 2-rank test rank ended so (SIGABRT) in ~20 runs.
        gc.collect()
        shutdown()


def _spawned(
    index: int, nproc: int, parent_pid: int, shared, device_kind: str, fn: Callable, args: tuple, timeout_s: float
) -> None:
    """A rank started by ``launch``: out of the launcher's session, its stop signals coming from the
    launcher alone (fastcrit.train.preempt); how it stopped goes back through ``shared``."""
    preempt.leave_launcher(parent_pid)
    with preempt.handling_signals(announce=False):
        preempt.ready(shared, index)
        try:
            _worker(index, nproc, device_kind, fn, args, timeout_s)
        except Stopped as s:  # not an error: the launcher raises it again
            if index == 0:
                preempt.report_stop(shared, nproc, s)


def _run_spawned(nproc: int, device_kind: str, fn: Callable, args: tuple, timeout_s: float) -> None:
    """``nproc`` spawned ranks; this process forwards SIGINT / SIGTERM to them and waits."""
    ctx = mp.get_context("spawn")
    with preempt.Forwarder(nproc, ctx) as fwd:
        try:
            procs = mp.start_processes(
                _spawned,
                args=(nproc, os.getpid(), fwd.shared, device_kind, fn, args, timeout_s),
                nprocs=nproc,
                join=False,
            )
        finally:
            fwd.started()
        deadline = None
        try:
            while not procs.join(timeout=0.1):
                fwd.forward(procs.pids())
                if fwd.at_once and deadline is None:
                    deadline = time.monotonic() + preempt.AT_ONCE_GRACE_S
                if deadline is not None and time.monotonic() > deadline:  # stuck in a collective, say
                    for p in procs.processes:
                        if p.is_alive():
                            p.kill()
        except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:
            if fwd.at_once:  # a rank interrupted mid-collective fails its peers: part of stopping
                raise Stopped(signal.SIGINT, None, at_once=True) from None
            if isinstance(e, mp.ProcessExitedException):  # killed, or exited without a Python error
                how = f"signal {e.signal_name}" if e.signal_name else f"exit code {e.exit_code}"
                raise DistError(
                    f"rank {e.error_index} of {nproc} (host {socket.gethostname()}) ended with {how}; "
                    "the other ranks were stopped"
                ) from None
            raise DistError(
                f"rank {e.error_index} of {nproc} failed; the other ranks were stopped. Its error:\n{e}"
            ) from None
        if fwd.at_once:  # the ranks' KeyboardInterrupt ends them quietly (torch's spawn wrapper)
            raise Stopped(signal.SIGINT, None, at_once=True)
        stopped = fwd.outcome()
    if stopped is not None:
        raise stopped


class DistError(RuntimeError):
    """A process-group failure, with the rank it happened on."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


def _is_dist_failure(e: BaseException) -> bool:
    """Whether ``e`` came out of the process group (a peer gone, a timeout) rather than our code:
    torch's distributed error types, or a RuntimeError raised by the gloo / NCCL backends (their
    messages name them; a generic "connection refused" from, say, a proxy endpoint does not count)."""
    dist_errors = tuple(
        t
        for t in (
            getattr(dist, "DistError", None),
            getattr(dist, "DistNetworkError", None),
            getattr(dist, "DistStoreError", None),
        )
        if t is not None
    )
    if dist_errors and isinstance(e, dist_errors):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in ("gloo", "NCCL", "c10d", "ProcessGroup"))


def launch(
    fn: Callable,
    args: tuple,
    nproc: int,
    device_kind: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: dict[str, str] | None = None,
    separate: bool = False,
) -> None:
    """Run ``fn(ctx, *args)`` on ``nproc`` processes (or in this one when nproc == 1 / torchrun).

    ``env``: environment variables every rank has before it joins the process group (e.g. NCCL
    settings, which NCCL reads once, at its first communicator); one the environment already holds
    keeps its value. ``separate``: spawn even a single rank, in a session of its own, so that the
    processes it starts (an SGLang engine's) are out of reach of a terminal's Ctrl-C.

    SIGINT / SIGTERM stop the run after the step in progress (fastcrit.train.preempt): ``fn`` raises
    ``Stopped`` on every rank, and so does this function (spawned ranks: in this process, which
    forwards the signals to them). A SIGINT after that stops at once: KeyboardInterrupt in this
    process, or, with spawned ranks, ``Stopped(at_once=True)`` once they have exited (SIGKILLed after
    ``preempt.AT_ONCE_GRACE_S``).

    Started by torchrun, this process is one rank of torchrun's world (``nproc`` is not used; the
    config loader already set trainer.nproc to that world size). A failure on any rank stops the
    others: spawned ranks are terminated by the parent, which raises ``DistError`` naming the rank
    that failed first; under torchrun, the ranks left waiting in a collective fail when the peer's
    connection drops (gloo) or after ``timeout_s`` (NCCL's watchdog), each naming itself.
    """
    if torchrun_world() is not None:  # started by torchrun: it set RANK, MASTER_ADDR, ...
        for k, v in (env or {}).items():
            os.environ.setdefault(k, v)
        rank = int(os.environ["RANK"])
        with preempt.handling_signals(announce=rank == 0):
            _worker(rank, int(os.environ["WORLD_SIZE"]), device_kind, fn, args, timeout_s)
        return
    saved = dict(os.environ)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    os.environ.pop("LOCAL_RANK", None)
    for k, v in (env or {}).items():  # spawned ranks inherit this environment
        os.environ.setdefault(k, v)
    try:
        if nproc == 1 and not separate:
            with preempt.handling_signals(announce=True):
                _worker(0, 1, device_kind, fn, args, timeout_s)
        else:
            _run_spawned(nproc, device_kind, fn, args, timeout_s)
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


def agree_to_stop() -> int:
    """0, or the stop signal a rank received (fastcrit.train.preempt.requested): the same answer on
    every rank (one all-reduce, max), so all of them stop after the same step. Call it at the same
    point on every rank."""
    return int(all_reduce([float(preempt.requested())], "max")[0])


def stop_if_asked(step: int | None = None) -> None:
    """Raise ``Stopped`` on every rank when a rank received a stop signal (``agree_to_stop``);
    ``step``: the checkpoint step a rerun resumes from, None when there is none."""
    signum = agree_to_stop()
    if signum:
        raise Stopped(signum, step)


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def masked_mean_over_ranks(x: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of ``x`` where ``mask`` is nonzero, over the entries of all ranks together (one
    collective); 0 where no rank has one."""
    m = mask.detach().double().cpu()
    s, n = all_reduce([float((x.detach().double().cpu() * m).sum()), float(m.sum())])
    return s / n if n > 0 else 0.0


def std_over_ranks(values: torch.Tensor) -> float:
    """Sample standard deviation (n - 1, as ``Tensor.std``) of ``values`` of all ranks together;
    0 with fewer than two values (one collective when distributed)."""
    x = values.detach().double().flatten().cpu()
    n, s, ss = all_reduce([float(x.numel()), float(x.sum()), float((x * x).sum())])
    if n < 2:
        return 0.0
    mean = s / n
    return (max(ss - n * mean * mean, 0.0) / (n - 1)) ** 0.5
