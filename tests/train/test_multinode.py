"""Past one process and one machine: `fastcrit train` with trainer.nproc=2, and two torchrun launches
(--nnodes 2, --node-rank 0/1, a localhost rendezvous) standing in for two machines, train the same
as one process on the same global batch; a rank that dies or stops answering ends every rank with a
message naming a rank and what failed, within a timeout.

Every run is a real `fastcrit train configs/cpu/grpo.yaml` in its own process (the SFT warm start
included, shortened), as a user would start it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "cpu", "grpo.yaml")
SHORT = ["trainer.total_steps=3", "sft.steps=4", "trainer.eval_every=0", "trainer.save_every=0"]
# Numbers that must agree: what training computes, not how long it took or how much memory it used.
SKIP = ("time/", "throughput/", "memory/", "logprob/")


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    return env


def _sets(out: str, extra: list[str]) -> list[str]:
    args = []
    for s in [*SHORT, f"trainer.output_dir={out}", *extra]:
        args += ["--set", s]
    return args


def _train(out: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fastcrit.cli", "train", CONFIG, *_sets(out, list(extra))],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_node(node: int, port: int, out: str, *extra: str, torchrun_args=()) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--node-rank",
        str(node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"fastcrit-test-{port}",
        "--max-restarts",
        "0",
        *torchrun_args,
        "-m",
        "fastcrit.cli",
        "train",
        CONFIG,
        *_sets(out, list(extra)),
    ]
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(p: subprocess.Popen, timeout: float = 600) -> str:
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out[-4000:]
    return out


def _rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def _assert_same_run(one: str, other: str) -> None:
    a, b = _rows(os.path.join(one, "metrics.jsonl")), _rows(os.path.join(other, "metrics.jsonl"))
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    moved = 0.0
    for x, y in zip(a, b):
        keys = {k for k in x if not k.startswith(SKIP)}
        assert keys == {k for k in y if not k.startswith(SKIP)}
        for k in keys:
            assert abs(x[k] - y[k]) <= 1e-5 * max(1.0, abs(x[k])), (x["step"], k, x[k], y[k])
        moved = max(moved, abs(x.get("actor/grad_norm", 0.0)))
    assert moved > 0  # the runs did train (a zero update would match trivially)
    sa, sb = _rows(os.path.join(one, "sft", "metrics.jsonl")), _rows(os.path.join(other, "sft", "metrics.jsonl"))
    assert len(sa) == len(sb) == 4
    for x, y in zip(sa, sb):
        assert abs(x["sft/nll"] - y["sft/nll"]) < 1e-5
    start = load_file(os.path.join(one, "sft", "final", "model.safetensors"))
    wa = load_file(os.path.join(one, "checkpoints", "step_3", "model.safetensors"))
    wb = load_file(os.path.join(other, "checkpoints", "step_3", "model.safetensors"))
    assert wa.keys() == wb.keys()
    rl_moved = max(float((wa[k] - start[k]).abs().max()) for k in wa)
    gap = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert rl_moved > 1e-4 and gap < 1e-5, (rl_moved, gap)


def test_two_processes_and_two_torchrun_nodes_train_as_one_process(tmp_path):
    one, two, nodes = str(tmp_path / "one"), str(tmp_path / "two"), str(tmp_path / "nodes")
    _finish(_train(one))  # first: it builds and caches the tiny model the others then find
    port = _free_port()
    procs = [_train(two, "trainer.nproc=2"), _torchrun_node(0, port, nodes), _torchrun_node(1, port, nodes)]
    logs = [_finish(p) for p in procs]
    assert "replaced by torchrun's world size 2" in "".join(logs[1:])  # the config's nproc=1 gave way
    _assert_same_run(one, two)
    _assert_same_run(one, nodes)
    assert sorted(f for f in os.listdir(os.path.join(nodes, "checkpoints", "step_3")) if f.startswith("rng_")) == [
        "rng_rank0.pt",
        "rng_rank1.pt",
    ]


def _wait_for_step(out: str, procs, timeout: float = 240) -> None:
    path = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return
        for p in procs:
            assert p.poll() is None, p.communicate()[0][-4000:]
        time.sleep(0.2)
    raise AssertionError(f"no step logged in {timeout} s")


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


LONG = ["trainer.total_steps=400", "sft.steps=0"]


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="finds the rank processes through /proc (Linux)")
def test_a_killed_rank_stops_every_rank_and_is_named(tmp_path):
    out = str(tmp_path / "run")
    p = _train(out, "trainer.nproc=2", *LONG)
    _wait_for_step(out, [p])
    ranks = [c for c in _children(p.pid) if "spawn_main" in open(f"/proc/{c}/cmdline").read()]
    assert len(ranks) == 2
    t0 = time.time()
    os.kill(ranks[-1], signal.SIGKILL)
    log, _ = p.communicate(timeout=60)
    assert time.time() - t0 < 30
    assert p.returncode == 1
    assert "of 2 (host" in log and ("ended with signal SIGKILL" in log or "a collective failed" in log), log[-3000:]


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="finds the rank processes through /proc (Linux)")
def test_a_rank_that_stops_answering_times_out_with_the_waiting_rank_named(tmp_path):
    out = str(tmp_path / "run")
    p = _train(out, "trainer.nproc=2", "trainer.dist_timeout_s=3", *LONG)
    _wait_for_step(out, [p])
    ranks = [c for c in _children(p.pid) if "spawn_main" in open(f"/proc/{c}/cmdline").read()]
    t0 = time.time()
    os.kill(ranks[-1], signal.SIGSTOP)  # alive, but never reaches the next collective
    try:
        log, _ = p.communicate(timeout=90)  # spawn's SIGTERM waits out its grace period on a stopped process
    finally:
        for r in ranks:
            try:
                os.kill(r, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert p.returncode == 1
    assert time.time() - t0 < 80
    assert "rank 0 of 2 (host" in log and "a collective failed" in log and "trainer.dist_timeout_s (3 s)" in log, log[
        -3000:
    ]


def test_a_node_whose_worker_dies_stops_the_other_node(tmp_path):
    out, port = str(tmp_path / "nodes"), _free_port()
    a, b = _torchrun_node(0, port, out, *LONG), _torchrun_node(1, port, out, *LONG)
    _wait_for_step(out, [a, b])
    victim = _children(b.pid)
    assert len(victim) == 1
    t0 = time.time()
    os.kill(victim[0], signal.SIGKILL)
    log_b, _ = b.communicate(timeout=60)
    log_a, _ = a.communicate(timeout=60)
    assert time.time() - t0 < 30
    assert a.returncode != 0 and b.returncode != 0
    assert "SIGKILL" in log_b  # torchrun names the rank it lost
    assert "a collective failed" in log_a and "Another rank most likely stopped first" in log_a, log_a[-3000:]


def test_a_node_that_never_joins_ends_the_rendezvous(tmp_path):
    """torchrun's own rendezvous waits --rdzv-conf join_timeout (600 s by default) for the others."""
    t0 = time.time()
    p = _torchrun_node(0, _free_port(), str(tmp_path / "alone"), torchrun_args=("--rdzv-conf", "join_timeout=3"))
    log, _ = p.communicate(timeout=120)
    assert p.returncode != 0 and "RendezvousTimeoutError" in log
    assert time.time() - t0 < 60
