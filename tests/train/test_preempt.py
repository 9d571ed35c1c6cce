"""Stop signals (fastcrit.train.preempt, launch): a rank records the first SIGTERM / SIGINT and stops
at the next agreement, every rank after the same step; a SIGINT after it stops at once; spawned ranks
get each signal the launcher gets exactly once (a terminal's Ctrl-C reaches the whole foreground
process group, which the ranks have left), even one sent while they start; they die with a SIGKILLed
launcher. The loop here is a stand-in for training steps (sleep, then agree), so these run in seconds;
tests/recipes/test_recipe_stop.py stops real runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from fastcrit.train.dist import launch, stop_if_asked
from fastcrit.train.preempt import Stopped, handling_signals, requested, stopped_at_once

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc (Linux)")


def _steps(ctx, out: str, steps: int, step_s: float) -> None:
    """Steps of ``step_s`` seconds, each ended by the ranks' agreement; what each rank saw goes to
    ``out/rank<r>.json``."""
    with open(os.path.join(out, f"pid{ctx.rank}"), "w") as f:
        f.write(str(os.getpid()))
    seen = {"pid": os.getpid(), "sid": os.getsid(0), "step": None, "signal": None, "interrupted": False}
    try:
        for step in range(1, steps + 1):
            time.sleep(step_s)
            seen["step"] = step
            stop_if_asked(step)
    except Stopped as s:
        seen["signal"] = s.signum
        raise
    except KeyboardInterrupt:
        seen["interrupted"] = True
        raise
    finally:
        with open(os.path.join(out, f"rank{ctx.rank}.json"), "w") as f:
            json.dump(seen, f)


# The launcher in a process of its own, in a session of its own (like a shell's foreground job):
# prints how it stopped as JSON and exits with Stopped.exit_code.
LAUNCHER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from test_preempt import _steps
from fastcrit.train.dist import launch
from fastcrit.train.preempt import Stopped
out, nproc, steps, step_s = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
try:
    launch(_steps, (out, steps, step_s), nproc, "cpu", 60)
except Stopped as s:
    print(json.dumps({"signal": s.signum, "step": s.step, "at_once": s.at_once}), flush=True)
    sys.exit(s.exit_code)
"""


def _start(out, nproc, steps=400, step_s=0.05):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "kernels"), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, HERE, str(out), str(nproc), str(steps), str(step_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


def _wait(cond, proc, timeout=60.0):
    t0 = time.monotonic()
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"the launcher ended (rc {proc.returncode}) too early:\n{proc.communicate()[0]}")
        if time.monotonic() - t0 > timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"waited {timeout:.0f} s:\n{proc.communicate()[0]}")
        time.sleep(0.01)


def _ranks_running(out, n):
    return lambda: all(os.path.exists(os.path.join(out, f"pid{r}")) for r in range(n))


def _seen(out, n):
    result = []
    for r in range(n):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            result.append(json.load(f))
    return result


def _children(pid):
    """The ranks the launcher ``pid`` spawned (not multiprocessing's resource tracker)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = [int(x) for x in f.read().split()]
    found = []
    for k in kids:
        try:
            with open(f"/proc/{k}/cmdline") as f:
                if "spawn_main" in f.read():
                    found.append(k)
        except FileNotFoundError:
            pass
    return found


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


# ------------------------------------------------------------------------------ one process, in this one


def test_a_rank_records_the_first_signal_and_a_second_sigint_interrupts():
    before = signal.getsignal(signal.SIGINT)
    with handling_signals(announce=False):
        assert requested() == 0
        os.kill(os.getpid(), signal.SIGTERM)
        assert requested() == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # schedulers repeat SIGTERM: still the first request
        assert requested() == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_sigint_wrapped_by_a_library_is_still_known_as_the_stop():
    """torch's checkpoint saver turns a KeyboardInterrupt raised inside it into a CheckpointException:
    the process must still know that the error is the user's second Ctrl-C (exit 130, no traceback)."""

    def library_call():
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt as e:
            raise RuntimeError("the library's own error") from e

    with handling_signals(announce=False):
        os.kill(os.getpid(), signal.SIGINT)  # the first: a stop request
        assert not stopped_at_once()
        with pytest.raises(RuntimeError):
            library_call()
        assert stopped_at_once()
    assert stopped_at_once()  # still known after the handlers are gone, where the exit code is chosen
    with handling_signals(announce=False):
        assert not stopped_at_once()  # a new run starts clean


def test_the_launcher_reports_a_wrapped_second_sigint_as_the_stop_at_once(tmp_path, capsys):
    from fastcrit.cli import _run
    from fastcrit.config import load_config
    from fastcrit.train.metrics import exit_code_of

    cfg = load_config("configs/cpu/grpo.yaml", [f"trainer.output_dir={tmp_path}"])

    def entry(ctx, cfg):
        with handling_signals(announce=False):
            os.kill(os.getpid(), signal.SIGINT)
            try:
                os.kill(os.getpid(), signal.SIGINT)
            except KeyboardInterrupt as e:
                raise RuntimeError("CheckpointException, say") from e

    class Args:
        command, config, set, resume = "train", "configs/cpu/grpo.yaml", [], None

    assert _run(Args(), cfg, entry, 1) == 130
    assert "stopped at once by a second SIGINT" in capsys.readouterr().err
    assert exit_code_of(RuntimeError("wrapped")) == 130

    from torch.distributed.checkpoint.api import CheckpointException

    def in_a_save(ctx, cfg):  # the saver's own wrapper, which derives from BaseException, not Exception
        with handling_signals(announce=False):
            os.kill(os.getpid(), signal.SIGINT)
            try:
                os.kill(os.getpid(), signal.SIGINT)
            except KeyboardInterrupt as e:
                raise CheckpointException("plan", {0: e}) from e

    assert _run(Args(), cfg, in_a_save, 1) == 130
    assert "stopped at once by a second SIGINT" in capsys.readouterr().err

    def failing(ctx, cfg):
        with handling_signals(announce=False):
            raise RuntimeError("a real error")

    with pytest.raises(RuntimeError, match="a real error"):
        _run(Args(), cfg, failing, 1)


def test_one_process_stops_at_the_next_agreement(tmp_path):
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(Stopped) as e:
        launch(_steps, (str(tmp_path), 400, 0.05), 1, "cpu", 30)
    timer.join()
    (seen,) = _seen(str(tmp_path), 1)
    assert e.value.signum == signal.SIGINT and e.value.exit_code == 130 and not e.value.at_once
    assert e.value.step == seen["step"] and 1 <= seen["step"] < 400


# ------------------------------------------------------------------------------ spawned ranks


@linux_only
def test_a_separate_single_rank_runs_in_its_own_session_and_gets_the_launchers_signal(tmp_path):
    # What `fastcrit train` does for one rank with an SGLang engine: the engine's processes, started
    # by the rank, are then out of reach of a terminal's Ctrl-C.
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))  # this process is the launcher
    t = threading.Thread(target=lambda: (_wait_for_file(os.path.join(str(tmp_path), "pid0")), timer.start()))
    t.start()
    with pytest.raises(Stopped) as e:
        launch(_steps, (str(tmp_path), 400, 0.05), 1, "cpu", 30, separate=True)
    t.join()
    (seen,) = _seen(str(tmp_path), 1)
    assert seen["pid"] != os.getpid() and seen["sid"] == seen["pid"]
    assert e.value.signum == signal.SIGTERM and e.value.exit_code == 143 and e.value.step == seen["step"]


def _wait_for_file(path, timeout=60.0):
    t0 = time.monotonic()
    while not os.path.exists(path) and time.monotonic() - t0 < timeout:
        time.sleep(0.01)


@linux_only
def test_ctrl_c_to_the_process_group_reaches_each_spawned_rank_once(tmp_path):
    out = str(tmp_path)
    p = _start(out, 2)
    launcher_session = os.getsid(p.pid)
    _wait(_ranks_running(out, 2), p)
    time.sleep(0.3)
    os.killpg(p.pid, signal.SIGINT)  # what a terminal does: the launcher's process group
    log, _ = p.communicate(timeout=60)
    assert p.returncode == 130, log
    a, b = _seen(out, 2)
    # A rank that got the signal twice (from the terminal and from the launcher) would have stopped
    # at once, interrupted; both stopped gracefully after the same step, in sessions of their own.
    assert a["signal"] == b["signal"] == signal.SIGINT and not a["interrupted"] and not b["interrupted"]
    assert a["step"] == b["step"] and json.loads(log.splitlines()[-1]) == {
        "signal": signal.SIGINT,
        "step": a["step"],
        "at_once": False,
    }
    assert a["sid"] == a["pid"] and b["sid"] == b["pid"] and launcher_session not in (a["sid"], b["sid"])
    assert "SIGINT: finishing the current step" in log


@linux_only
def test_a_signal_while_the_ranks_start_is_delivered_once_when_they_are_ready(tmp_path):
    out = str(tmp_path)
    p = _start(out, 2, steps=3)
    _wait(lambda: len(_children(p.pid)) >= 2, p)  # spawned, still starting (importing torch)
    os.killpg(p.pid, signal.SIGINT)  # reaches the ranks too: they have not left the group yet
    log, _ = p.communicate(timeout=60)
    assert p.returncode == 130, log
    # Replayed once they were ready (a lost signal would have let them finish, rc 0), and only that
    # copy counted (the terminal's as well would have stopped them at once).
    a, b = _seen(out, 2)
    assert a["signal"] == b["signal"] == signal.SIGINT and a["step"] == b["step"], log
    assert not a["interrupted"] and not b["interrupted"]
    assert json.loads(log.splitlines()[-1])["at_once"] is False


@linux_only
def test_a_second_sigint_stops_spawned_ranks_at_once(tmp_path):
    out = str(tmp_path)
    p = _start(out, 2, steps=400, step_s=0.5)
    _wait(_ranks_running(out, 2), p)
    ranks = _children(p.pid)
    os.kill(p.pid, signal.SIGINT)
    time.sleep(0.1)
    os.kill(p.pid, signal.SIGINT)
    t0 = time.monotonic()
    log, _ = p.communicate(timeout=60)
    assert p.returncode == 130, log
    assert json.loads(log.splitlines()[-1]) == {"signal": signal.SIGINT, "step": None, "at_once": True}
    assert "SIGINT again: stopping at once" in log
    assert all(s["interrupted"] for s in _seen(out, 2))  # inside a step, not at its end
    assert time.monotonic() - t0 < 10
    assert not any(_alive(r) for r in ranks)


@linux_only
def test_spawned_ranks_die_with_a_sigkilled_launcher(tmp_path):
    out = str(tmp_path)
    p = _start(out, 2)
    _wait(_ranks_running(out, 2), p)
    ranks = _children(p.pid)
    assert len(ranks) == 2
    os.kill(p.pid, signal.SIGKILL)  # the ranks left its process group: only the kernel can take them
    p.communicate(timeout=30)
    t0 = time.monotonic()
    while any(_alive(r) for r in ranks) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert not any(_alive(r) for r in ranks)
