"""Mixed into workers.Worker: killing and reaping what an execution leaves behind (its process
group, orphans re-parented to the worker), with the judge spared."""

from __future__ import annotations

import os
import resource
import signal
import time

# How long processes left by an execution may take to die once killed (a process tearing down
# gigabytes takes a while) before the worker gives up on them and asks to be replaced.
REAP_S = 10.0
_RLIMITS = tuple(getattr(resource, n) for n in sorted(dir(resource)) if n.startswith("RLIMIT_"))


def process_settings(pid: int, as_soft: bool = True):
    """What any process of the same uid may change in process ``pid`` (0: this one) for good: an
    unprivileged process cannot raise a hard limit again, lower its nice value or leave SCHED_IDLE.
    An execution that lowered its worker's limits (prlimit), or made it nice 19, SCHED_IDLE or
    pinned to one CPU, would pass that on to every later execution (which inherit them): a
    correct program would then run out of memory or time. ``as_soft`` False leaves out the
    soft address-space limit, which the judge sets itself per execution. None: ``pid`` is gone."""
    try:
        lims = [resource.prlimit(pid, r) for r in _RLIMITS]
        if not as_soft:
            i = _RLIMITS.index(resource.RLIMIT_AS)
            lims[i] = lims[i][1]
        return (
            tuple(lims),
            os.getpriority(os.PRIO_PROCESS, pid),
            os.sched_getscheduler(pid),
            frozenset(os.sched_getaffinity(pid)),
        )
    except OSError:
        return None


class Reaping:
    """Uses the worker's ``judge_pid``, ``_judge_gone`` (judging.JudgedRuns), ``_children_path``,
    ``fd_count`` and ``settings`` (``process_settings(0)`` before the first job)."""

    fd_count: int | None = None
    settings = None

    def _kill_group(self, pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _sweep(self, pid) -> bool:
        """Kill and reap everything the execution left behind; False if something is still there
        after REAP_S. Until a process is reaped it counts against the uid's RLIMIT_NPROC, so the
        next execution could not start its full share of processes: wait for every one.

        Every process an execution leaves ends up a child of the worker (orphans are re-parented
        to PID 1 of the namespace, or to the worker as subreaper without the jail), so no child
        left but the judge means nothing left. Each round kills the worker's children other than
        the judge, whose own children then become the worker's."""
        if pid is not None:
            self._kill_group(pid)
        if not self._reap_all():
            return True
        deadline = time.monotonic() + REAP_S
        while True:
            for k in self._children():
                if k == self.judge_pid:
                    continue
                for f in (os.killpg, os.kill):
                    try:
                        f(k, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            if not self._reap_all():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0005)

    def changed_process(self) -> str | None:
        """What of the worker's own process an execution changed, that it cannot put back."""
        if self.fd_count is not None and self._fd_count() != self.fd_count:
            return "the worker's own file descriptors changed"
        if self.settings is not None and process_settings(0) != self.settings:
            return "its resource limits, scheduling priority or CPU affinity were changed"
        return None

    def _children(self):
        # The worker has one thread (its own pid), so one file lists every child.
        try:
            with open(self._children_path, "rb", buffering=0) as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def _reap_all(self) -> bool:
        """Reap exited children (the judge too, if it died); True while children other than the
        judge remain."""
        while True:
            try:
                p, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if p == 0:
                break
            if p == self.judge_pid:
                self._judge_gone()
        if self.judge_pid is None:
            return True
        return any(k != self.judge_pid for k in self._children())
