"""Stopping on a signal: the first SIGTERM or SIGINT lets the ranks finish the step in progress, save
a checkpoint and stop together; a SIGINT after that stops at once.

A rank's handler only records the first signal (``requested``). The scaffold asks after every step,
all ranks at the same point, whether any rank has one (``fastcrit.train.dist.agree_to_stop``: one
all-reduce of the signal number, max), so every rank stops after the same step and the save, a
collective, runs on all of them. A SIGINT after the first signal raises KeyboardInterrupt where the
rank is (its ``finally`` blocks close the engines and the sandbox pools); a repeated SIGTERM changes
nothing, because schedulers repeat it (and SIGKILL after their grace period anyway).

How a signal reaches each rank once:

- one process (``trainer.nproc`` 1): the process is the rank.
- ranks spawned by ``fastcrit.train.dist.launch``: the launcher blocks SIGINT and SIGTERM while it
  starts them (the mask is inherited through fork and exec), and each rank first leaves the
  launcher's session (``setsid``), so a terminal's Ctrl-C, sent to the foreground process group,
  reaches the launcher alone; copies that reached a rank before it left are dropped while still
  blocked. The launcher forwards every SIGINT / SIGTERM it receives to every rank, in order, once
  the rank says it is ready (handler installed, signals unblocked), replaying what came before.
  ``PR_SET_PDEATHSIG`` = SIGKILL: a rank never outlives a killed launcher. The ranks' own children
  (an SGLang engine's scheduler processes) stay in the rank's session, out of the terminal's reach,
  and the launcher signals the ranks by pid, never their process group.
- torchrun: each worker is a rank with its own handler. torch 2.13's agent (elastic/agent/server/
  api.py:752-754, multiprocessing/api.py:1023-1053, subprocess_handler.py:63-66 and :79-85) starts
  every worker in a session of its own, turns SIGTERM / SIGINT / SIGHUP / SIGQUIT into a shutdown that
  sends the same signal once to each worker's process group, waits ``--shutdown-timeout`` (default
  30 s, launcher/api.py:145-149) and then SIGKILLs; a second signal to the agent ends up as SIGTERM
  to the workers (api.py:757-759), which does not stop them at once.

What is NOT covered: a signal sent to a spawned rank directly rather than to the launcher is handled
by that rank alone (its peers learn of it at the next agreement, which is enough), but a SIGINT sent
to a rank directly AND forwarded by the launcher counts twice there (stop at once). A signal sent to
a rank's process group (torchrun does) or to every process of a job (some schedulers do) also reaches
the rank's own children: SGLang's scheduler processes stop on it and the step cannot finish; the
sandbox's workers die on a SIGTERM and executions in flight score as errors. Stages that run on rank 0 alone
(CTRL's synthesis) see the request only when they end.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from contextlib import contextmanager
from multiprocessing import resource_tracker

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# How long the launcher waits after a second Ctrl-C for the ranks to close their engines and exit
# before it SIGKILLs them.
AT_ONCE_GRACE_S = 10.0


class Stopped(BaseException):
    """The run stopped on a signal. ``step``: the step of the checkpoint to resume from (written now,
    or the one the run had resumed from), None when there is none; ``at_once``: stopped by a second
    SIGINT without finishing the step. A BaseException, like KeyboardInterrupt: a request to stop is
    not an error, and no ``except Exception`` on the way out may swallow it."""

    def __init__(self, signum: int, step: int | None, at_once: bool = False):
        super().__init__(signum, step, at_once)
        self.signum, self.step, self.at_once = int(signum), step, at_once

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal number: what a shell reports for a process the signal ended (143, 130)."""
        return 128 + self.signum


class _Requests:
    signum = 0  # the first stop signal this process received; 0: none
    announce = False  # print what happens (the process that talks to the terminal)
    at_once = False  # a second SIGINT raised KeyboardInterrupt here (see stopped_at_once)


_requests = _Requests()


def requested() -> int:
    """The first SIGINT / SIGTERM this rank received (0: none)."""
    return _requests.signum


def stopped_at_once() -> bool:
    """Whether a second SIGINT raised KeyboardInterrupt in this process since its handlers were
    last installed. The interrupt can land inside a library that turns it into its own error (torch's
    checkpoint saver raises a CheckpointException holding it): whatever error follows is that stop."""
    return _requests.at_once


def _first_message(signum: int) -> str:
    return (
        f"{signal.Signals(signum).name}: finishing the current step, saving a checkpoint, then stopping "
        "(Ctrl-C again stops at once)"
    )


_AT_ONCE_MESSAGE = "SIGINT again: stopping at once, without a checkpoint of this step"


def _say(text: str) -> None:
    # os.write, not print: a handler may run while the main thread is inside a print to stderr.
    try:
        os.write(2, f"fastcrit: {text}\n".encode())
    except OSError:
        pass


def _record(signum: int) -> None:
    """Record ``signum`` as a stop request; a SIGINT after one raises KeyboardInterrupt."""
    if _requests.signum:
        if signum == signal.SIGINT:
            if _requests.announce:
                _say(_AT_ONCE_MESSAGE)
            _requests.at_once = True
            raise KeyboardInterrupt
        return
    _requests.signum = signum
    if _requests.announce:
        _say(_first_message(signum))


def _on_signal(signum, frame) -> None:
    _record(signum)


@contextmanager
def handling_signals(announce: bool):
    """While the block runs, SIGINT and SIGTERM are stop requests for this process (see the module
    docstring); the previous handlers come back after it. ``announce``: say so on stderr. Outside the
    main thread, where Python cannot take signals, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _requests.signum, _requests.announce, _requests.at_once = 0, announce, False
    old = {s: signal.signal(s, _on_signal) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _requests.announce = False


def _set_parent_death_signal(sig: int) -> None:
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1  # linux/prctl.h
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


class Forwarder:
    """The launcher's side for ``nproc`` spawned ranks: ``with Forwarder(n) as f:`` blocks SIGINT /
    SIGTERM (so the ranks start with them blocked) and records each one from then on; ``started()``
    after the ranks are started unblocks them here; ``forward(pids)``, called in the wait loop,
    sends each rank that is ready every signal not yet sent to it, in order. ``shared`` (pass it to
    the ranks): ``shared[i]`` 1 once rank i is ready; ``shared[nproc]`` / ``shared[nproc + 1]`` the
    signal and checkpoint step (-1: none) rank 0 stopped with (``report_stop``)."""

    def __init__(self, nproc: int, mp_context):
        self.nproc = nproc
        self.shared = mp_context.RawArray("q", nproc + 2)
        self.received: list[int] = []
        self._sent = [0] * nproc
        self._old: dict | None = None

    def __enter__(self) -> Forwarder:
        if threading.current_thread() is threading.main_thread():
            # Starting multiprocessing's resource tracker unblocks SIGINT / SIGTERM after it (CPython
            # 3.11.7 multiprocessing/resource_tracker.py:145-151, ensure_running): start it first, so
            # the ranks started below still inherit them blocked.
            resource_tracker.ensure_running()
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            self._old = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        return self

    def _on_signal(self, signum, frame) -> None:
        was_at_once = self.at_once
        self.received.append(signum)
        if len(self.received) == 1:
            _say(_first_message(signum))
        elif self.at_once and not was_at_once:
            _say(_AT_ONCE_MESSAGE)

    @property
    def at_once(self) -> bool:
        """A SIGINT came after the first signal: the ranks stop at once."""
        return signal.SIGINT in self.received[1:]

    def started(self) -> None:
        if self._old is not None:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def forward(self, pids: list[int]) -> None:
        n = len(self.received)  # a signal arriving during the loop waits for the next call
        for i, pid in enumerate(pids):
            if self.shared[i] and self._sent[i] < n:
                for sig in self.received[self._sent[i] : n]:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:  # it has exited
                        break
                self._sent[i] = n

    def outcome(self) -> Stopped | None:
        """How rank 0 stopped (None: it ran to the end)."""
        sig, step = int(self.shared[self.nproc]), int(self.shared[self.nproc + 1])
        return Stopped(sig, None if step < 0 else step) if sig else None

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            for s, h in self._old.items():
                signal.signal(s, h)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def leave_launcher(parent_pid: int) -> None:
    """First thing in a spawned rank, its stop signals still blocked (inherited from the launcher):
    a session of its own, SIGKILL when the launcher dies, and the copies of signals that reached it
    before it left the launcher's process group dropped (the launcher replays what it received)."""
    os.setsid()
    _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:  # the launcher died before the line above took effect
        os._exit(1)
    for s in STOP_SIGNALS:  # SIG_IGN discards a pending signal, blocked or not (POSIX sigaction)
        signal.signal(s, signal.SIG_IGN)


def ready(shared, index: int) -> None:
    """In a spawned rank inside ``handling_signals``: unblock the stop signals and tell the launcher
    it may forward them now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    shared[index] = 1


def report_stop(shared, nproc: int, stopped: Stopped) -> None:
    """Rank 0 of spawned ranks: tell the launcher how the run stopped."""
    shared[nproc + 1] = -1 if stopped.step is None else stopped.step
    shared[nproc] = stopped.signum
