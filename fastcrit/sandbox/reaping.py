"""Mixed into workers.Worker: killing and reaping what an execution leaves behind (its process
group, orphans re-parented to the worker), with the judge spared."""

from __future__ import annotations

import os
import signal
import time

# How long processes left by an execution may take to die once killed (a process tearing down
# gigabytes takes a while) before the worker gives up on them and asks to be replaced.
REAP_S = 10.0


class Reaping:
    """Uses the worker's ``judge_pid``, ``_judge_gone`` (judging.JudgedRuns) and ``_children_path``."""

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
