"""A GRPO run killed with SIGKILL at random moments, once inside a save, resumes every time and ends
with the metrics and weights of a run that was never interrupted; what the killed saves left is
removed, and only trainer.keep_last checkpoints stay."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from recipe_cli import TINY_MODEL, run_cli, stable
from recipe_cli import metric_rows as rows

from fastcrit.train.checkpoint import complete_checkpoints

STEPS = 8
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
    "algorithm.entropy_coef=0.01",
    "trainer.micro_batch_size=3",
    "trainer.progress=false",
    "trainer.seed=3",
    "trainer.compute_threads=1",
    f"trainer.total_steps={STEPS}",
    "trainer.save_every=1",
    "trainer.keep_last=2",
]
CPU_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "cpu", "grpo.yaml")

# `fastcrit train` in a child process. With PAUSE_IN set, the real save into that directory stops
# after the model, tokenizer and optimizer state are on disk (RNG, trainer state, COMPLETE and the
# rename still to come), touches PAUSE_FLAG and waits there to be killed.
CHILD = r"""
import os, sys, time
import fastcrit.train.checkpoint as ckpt
save_state = ckpt._save_state
def paused(actor, path):
    save_state(actor, path)
    if os.environ.get("PAUSE_IN") and path.endswith(os.environ["PAUSE_IN"]):
        open(os.environ["PAUSE_FLAG"], "w").close()
        time.sleep(600)
ckpt._save_state = paused
from fastcrit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def start(out, log, **env):
    argv = [sys.executable, "-c", CHILD, "train", CPU_CONFIG]
    for s in [*SETS, f"trainer.output_dir={out}"]:
        argv += ["--set", s]
    with open(log, "w") as f:  # a session of its own: the kill reaches every process it started
        return subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True
        )


def wait_for(cond, proc, log, timeout=300.0):
    t0 = time.monotonic()
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (rc {proc.returncode}) before it was killed:\n{open(log).read()}")
        if time.monotonic() - t0 > timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"waited {timeout:.0f} s:\n{open(log).read()}")
        time.sleep(0.01)


def kill(proc):
    assert proc.poll() is None, "the run ended before the kill"
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL


def newest(out):
    done = complete_checkpoints(out)
    return done[-1][0] if done else 0


@pytest.mark.slow
def test_killed_runs_resume_to_the_uninterrupted_run(tmp_path, same_checkpoint):
    ref, out = str(tmp_path / "ref"), str(tmp_path / "killed")
    assert run_cli("train", CPU_CONFIG, SETS, f"trainer.output_dir={ref}") == 0
    step_s = sum(r["time/step_s"] for r in rows(ref)) / STEPS
    ckpts = os.path.join(out, "checkpoints")

    # 1. Killed inside the save of step 3: the new checkpoint is only a temporary directory.
    flag, log = str(tmp_path / "paused"), str(tmp_path / "run0.log")
    proc = start(out, log, PAUSE_IN=".tmp_step_3", PAUSE_FLAG=flag)
    wait_for(lambda: os.path.exists(flag), proc, log)
    kill(proc)
    assert sorted(os.listdir(ckpts)) == [".tmp_step_3", "step_1", "step_2"]

    # 2. Killed at random moments: a random number of steps after the resume (early enough to
    # leave work to kill), then a random delay of up to two steps (in the step computation, the
    # metrics write, a save or a prune).
    rng = random.Random(1234)
    for i in (1, 2):
        at = min(newest(out) + rng.randint(1, 2), STEPS - 3)
        log = str(tmp_path / f"run{i}.log")
        proc = start(out, log)
        wait_for(lambda: newest(out) >= at, proc, log)
        time.sleep(rng.uniform(0.0, 2.0 * step_s))
        kill(proc)
        text = open(log).read()
        if i == 1:
            assert f"removed an unfinished checkpoint (a killed save): {ckpts}/.tmp_step_3" in text, text
            assert f"resumed from {ckpts}/step_2 at step 2" in text, text
        assert all(n.startswith(".tmp_") or n.startswith("step_") for n in os.listdir(ckpts))

    # 3. A last run to the end.
    log = str(tmp_path / "run3.log")
    proc = start(out, log)
    assert proc.wait(timeout=300) == 0, open(log).read()

    a, b = rows(ref), rows(out)
    assert [x["step"] for x in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        assert stable(x) == stable(y)  # bit for bit: the same numbers, not close ones
    same_checkpoint(ref, out, STEPS)
    assert (
        sorted(os.listdir(ckpts))
        == sorted(os.listdir(os.path.join(ref, "checkpoints")))
        == [f"step_{STEPS - 1}", f"step_{STEPS}"]
    )
