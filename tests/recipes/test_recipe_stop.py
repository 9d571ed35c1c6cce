"""GRPO runs stopped by SIGTERM and SIGINT mid-run (one process; two spawned gloo ranks; torchrun):
each finishes the step in progress, saves it (no trainer.save_every here, so that checkpoint is the
stop's own), prints the command that continues and exits with 143 / 130; running the printed command
resumes, and the last run ends with the metrics and weights of a run never stopped. A signal during
the SFT warm start stops there, unsaved; a second SIGINT stops at once.

Every run is a real `fastcrit train configs/cpu/grpo.yaml` in a process of its own, in a session of
its own, as a terminal starts a job: a Ctrl-C is a SIGINT to that process group (os.killpg); a
scheduler's SIGTERM goes to the launcher alone (os.kill)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from recipe_cli import TINY_MODEL, stable
from recipe_cli import metric_rows as rows

from fastcrit.train.checkpoint import complete_checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "cpu", "grpo.yaml")
SETS = [
    *TINY_MODEL,
    "data.prompts_per_step=2",
    "data.val_size=4",
    "rollout.n=4",
    "rollout.max_new_tokens=6",
    "sft.steps=3",
    "sft.batch_size=8",
    "optim.lr=1e-3",
    "algorithm.kl_coef=0.01",
    "trainer.micro_batch_size=3",
    "trainer.progress=false",
    "trainer.seed=3",
    "trainer.compute_threads=1",
    "trainer.save_every=0",
]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "kernels"), env.get("PYTHONPATH", "")])
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    return env


def _args(out: str, steps: int, *extra: str) -> list[str]:
    args = ["train", CONFIG]
    for s in [*SETS, f"trainer.total_steps={steps}", f"trainer.output_dir={out}", *extra]:
        args += ["--set", s]
    return args


def _start(args: list[str], log: str, torchrun: bool = False) -> subprocess.Popen:
    head = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        if torchrun
        else [sys.executable]
    )
    with open(log, "w") as f:
        return subprocess.Popen(
            [*head, "-m", "fastcrit.cli", *args],
            cwd=ROOT,
            env=_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _finish(p: subprocess.Popen, log: str, rc: int = 0) -> str:
    try:
        p.wait(timeout=240)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = open(log).read()
    assert p.returncode == rc, text[-4000:]
    return text


def _logged(out: str) -> int:
    path = os.path.join(out, "metrics.jsonl")
    return len(rows(out)) if os.path.exists(path) else 0


def _wait_until(cond, p: subprocess.Popen, log: str, timeout: float = 240.0) -> None:
    t0 = time.monotonic()
    while not cond():
        if p.poll() is not None or time.monotonic() - t0 > timeout:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"the run ended or took too long (rc {p.poll()}):\n{open(log).read()[-4000:]}")
        time.sleep(0.01)


def _stop(p: subprocess.Popen, log: str, out: str, send, rc: int) -> tuple[int, list[str]]:
    """Once the run has logged a step of its own, ``send(pid)``; the run must exit with ``rc`` after
    the step in progress, its last logged step saved. Returns that step and the printed command."""
    before = _logged(out)
    _wait_until(lambda: _logged(out) > before, p, log)
    send(p.pid)
    text = _finish(p, log, rc)
    step = rows(out)[-1]["step"]
    assert complete_checkpoints(out)[-1][0] == step, text[-3000:]
    assert f"newest checkpoint: {os.path.join(out, 'checkpoints', f'step_{step}')}" in text, text[-3000:]
    (line,) = [x for x in text.splitlines() if x.startswith("resume with: ")]
    command = shlex.split(line[len("resume with: ") :])
    head = ["torchrun", "TORCHRUN_OPTIONS", "-m", "fastcrit.cli"] if command[0] == "torchrun" else ["fastcrit"]
    assert command[: len(head)] == head and command[len(head) : len(head) + 4] == ["train", CONFIG, "--resume", out]
    return step, command[len(head) :]  # the arguments after the program


def _terminal_ctrl_c(pid: int) -> None:
    os.killpg(pid, signal.SIGINT)


def _scheduler_sigterm(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)


def _same_run(ref: str, out: str, steps: int, same_checkpoint, exact_metrics: bool = True) -> None:
    """``out`` logged every step once and ends with ``ref``'s metrics (bit for bit, or to 1e-6 of
    their size) and ``ref``'s weights, bit for bit."""
    a, b = rows(ref), rows(out)
    assert [x["step"] for x in b] == list(range(1, steps + 1))
    for x, y in zip(a, b):
        x, y = stable(x), stable(y)
        if exact_metrics:
            assert x == y
        else:
            assert x.keys() == y.keys()
            for k in x:
                assert abs(x[k] - y[k]) <= 1e-6 * max(1.0, abs(x[k])), (x["step"], k, x[k], y[k])
    same_checkpoint(ref, out, steps)


@pytest.mark.slow
def test_one_process_stopped_twice_resumes_to_the_uninterrupted_run(tmp_path, same_checkpoint):
    steps, ref, out = 6, str(tmp_path / "ref"), str(tmp_path / "run")
    _finish(_start(_args(ref, steps), str(tmp_path / "ref.log")), str(tmp_path / "ref.log"))

    log = str(tmp_path / "a.log")
    first, command = _stop(_start(_args(out, steps), log), log, out, _terminal_ctrl_c, 130)
    assert "SIGINT: finishing the current step" in open(log).read()
    log = str(tmp_path / "b.log")
    second, command = _stop(_start(command, log), log, out, _scheduler_sigterm, 143)
    assert first < second < steps
    log = str(tmp_path / "c.log")
    text = _finish(_start(command, log), log)
    assert f"resumed from {os.path.join(out, 'checkpoints', f'step_{second}')} at step {second}" in text
    _same_run(ref, out, steps, same_checkpoint)


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """An uninterrupted run on two spawned ranks, the reference of the tests that stop one."""
    ref = str(tmp_path_factory.mktemp("two") / "ref")
    log = ref + ".log"
    _finish(_start(_args(ref, TWO_RANK_STEPS, "trainer.nproc=2"), log), log)
    return ref


# Two ranks resume to the metrics of the run never stopped up to rounding: the first step after any
# resume (a signal's or not, e.g. a SIGKILLed run's) repeats actor/approx_kl, a mean of differences
# of about 1e-8, only to ~1e-7; every other metric, and the weights, bit for bit.
TWO_RANK_STEPS = 6


@pytest.mark.slow
def test_two_spawned_ranks_stop_together_and_resume_to_the_uninterrupted_run(tmp_path, two_rank_run, same_checkpoint):
    out = str(tmp_path / "run")
    log = str(tmp_path / "a.log")
    # A terminal's Ctrl-C reaches the launcher's process group, which the ranks have left: each gets
    # it once, from the launcher (twice would have stopped them at once, unsaved).
    step, command = _stop(_start(_args(out, TWO_RANK_STEPS, "trainer.nproc=2"), log), log, out, _terminal_ctrl_c, 130)
    assert step < TWO_RANK_STEPS and "trainer.nproc=2" in command
    assert sorted(f for f in os.listdir(os.path.join(out, "checkpoints", f"step_{step}")) if f.startswith("rng_")) == [
        "rng_rank0.pt",
        "rng_rank1.pt",
    ]
    log = str(tmp_path / "b.log")
    _finish(_start(command, log), log)
    _same_run(two_rank_run, out, TWO_RANK_STEPS, same_checkpoint, exact_metrics=False)


@pytest.mark.slow
def test_torchrun_workers_save_their_shards_and_resume(tmp_path, two_rank_run, same_checkpoint):
    """A scheduler's SIGTERM to torchrun: its agent sends one SIGTERM to each worker's process group
    and SIGKILLs them --shutdown-timeout (30 s) later; the step and its save take far less here. The
    workers exit with 143, torchrun itself with 1 (its SignalException)."""
    out = str(tmp_path / "run")
    log = str(tmp_path / "a.log")
    step, command = _stop(_start(_args(out, TWO_RANK_STEPS), log, torchrun=True), log, out, _scheduler_sigterm, 1)
    text = open(log).read()
    assert text.count("resume with: ") == 1  # rank 0 speaks for both
    assert sorted(f for f in os.listdir(os.path.join(out, "checkpoints", f"step_{step}")) if f.startswith("rng_")) == [
        "rng_rank0.pt",
        "rng_rank1.pt",
    ]
    log = str(tmp_path / "b.log")
    _finish(_start(command, log, torchrun=True), log)
    _same_run(two_rank_run, out, TWO_RANK_STEPS, same_checkpoint, exact_metrics=False)


@pytest.mark.slow
def test_a_signal_in_the_sft_warm_start_stops_unsaved_and_a_second_sigint_at_once(tmp_path):
    out = str(tmp_path / "run")
    log = str(tmp_path / "sft.log")
    p = _start(_args(out, 6, "sft.steps=400"), log)
    sft_rows = os.path.join(out, "sft", "metrics.jsonl")
    _wait_until(lambda: os.path.exists(sft_rows) and os.path.getsize(sft_rows) > 0, p, log)
    os.kill(p.pid, signal.SIGTERM)
    text = _finish(p, log, 143)
    assert "stopped by SIGTERM before the first RL step; nothing to resume from" in text, text[-3000:]
    (line,) = [x for x in text.splitlines() if x.startswith("start again with: ")]
    assert shlex.split(line[len("start again with: ") :])[:3] == ["fastcrit", "train", CONFIG]
    assert not os.path.exists(os.path.join(out, "sft", "final")) and not complete_checkpoints(out)
    n_sft = sum(1 for _ in open(sft_rows))
    assert 1 <= n_sft < 400

    # The RL loop (the warm start now short), two Ctrl-Cs: the second stops inside the step.
    log = str(tmp_path / "rl.log")
    p = _start(_args(out, 6), log)
    _wait_until(lambda: _logged(out) >= 1, p, log)
    os.killpg(p.pid, signal.SIGINT)
    time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)
    text = _finish(p, log, 130)
    assert "stopped at once by a second SIGINT" in text and "start again with: " in text, text[-3000:]
    assert not complete_checkpoints(out)
    with pytest.raises(ProcessLookupError):  # nothing of the run is left
        os.killpg(p.pid, 0)
