"""The worker's side of ``assert`` jobs: its judge process and the executions the judge questions.

The worker forks its judge (judge.py) once, before any program runs, and talks to it over a
socket pair: per execution, a header and the two pipe ends of that execution's channel (passed as
file descriptors), the job's tests the first time (relayed from the pool with ``os.splice``, so
their bytes never enter the worker's memory, and so never a forked execution's), and back the
judge's signed records. The execution (harness.serve) gets the other two pipe ends as fds 3 and 4.

Limits: the judge gets the job's ``memory_mb`` on top of its own size as its address-space limit;
its time is the test's: the worker's deadline for a test covers the program's work and the judge's
together. At the deadline the worker kills the execution; a judge waiting on it notices at once
and says ``stop``; a judge still busy after ``JUDGE_GRACE_S`` (its own evaluation ran away, e.g.
``'apple' in range(10**18)`` on a program's return value) is killed and replaced, and the job's
tests after that one are not run (the tests left with it): they are ``error``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time

from . import harness, judge
from .channels import RecordReader, Tail, drain_tails
from .reaping import process_settings

JUDGE_GRACE_S = 0.5
# A judge whose address space grew by more than this over a job is replaced before the next job:
# what a program's values made it map stays mapped after they are freed (the allocators keep it),
# host memory held for nothing by every worker.
JUDGE_RECYCLE_BYTES = 128 << 20
# Once an execution has run this long, the judge's records are read as they arrive (as the result
# pipe in workers.Worker._watch): a judge with more records than its socket holds would otherwise
# block on writing them, and the job would wait for the deadline.
RECORDS_AFTER_S = 0.02
_VERDICTS = ("passed", "failed", "error", "memory", "output_limit")


class JudgedRuns:
    """Mixed into workers.Worker: everything about ``assert`` jobs."""

    judge_pid: int | None = None
    judge_sock: socket.socket | None = None
    judge_size = 0  # its address space when it started, in bytes
    judge_settings = None
    secret_left = 0  # bytes of the current job's tests still in the pool's channel
    _relay = None  # the pipe the tests pass through on their way to the judge
    fd_in = 0

    # -- the judge process --------------------------------------------------------------------

    def start_judge(self) -> None:
        if self._relay is None:
            self._relay = os.pipe()
        a, b = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the judge: a copy of the worker, which has never run a program
            try:
                os.setpgid(0, 0)
                a.close()
                fd = b.detach()
                if fd != 3:
                    os.dup2(fd, 3)
                os.closerange(4, 1 << 16)
                judge.main(3)
            except BaseException:
                pass
            os._exit(70)
        b.close()
        self.judge_pid, self.judge_sock = pid, a
        self.judge_size = _address_space(pid)  # a fresh fork: the worker's size
        self.judge_settings = process_settings(0, as_soft=False)  # and the worker's settings

    def ready_judge(self) -> None:
        """Between jobs: a judge that is gone, that grew by more than JUDGE_RECYCLE_BYTES, or
        whose limits, priority or CPU affinity a program changed (reaping.process_settings) is
        replaced by a fresh one."""
        if self.judge_pid is not None and (
            _address_space(self.judge_pid) - self.judge_size > JUDGE_RECYCLE_BYTES
            or process_settings(self.judge_pid, as_soft=False) != self.judge_settings
        ):
            self._kill_judge()
        if self.judge_pid is None:
            self.start_judge()

    def _judge_gone(self) -> None:
        if self.judge_sock is not None:
            self.judge_sock.close()
        self.judge_pid, self.judge_sock = None, None

    def _kill_judge(self) -> None:
        if self.judge_pid is not None:
            try:
                os.kill(self.judge_pid, signal.SIGKILL)
                os.waitpid(self.judge_pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        self._judge_gone()

    def _relay_tests(self, to_fd: int | None) -> None:
        """Move the job's tests from the pool's channel to the judge (or drop them: ``to_fd``
        None). ``splice`` needs a pipe on one side, and the pool's channel may be a socket (uvloop
        makes socket pairs), so the bytes go through a pipe of the worker's own: kernel to kernel."""
        pr, pw = self._relay
        sink = to_fd if to_fd is not None else os.open(os.devnull, os.O_WRONLY)
        try:
            while self.secret_left > 0:
                n = os.splice(self.fd_in, pw, min(self.secret_left, 1 << 16))
                if n <= 0:
                    raise OSError("the pool's channel closed in the middle of a job")
                self.secret_left -= n
                while n > 0:
                    n -= os.splice(pr, sink, n)
        finally:
            if to_fd is None:
                os.close(sink)

    def drop_tests(self) -> None:
        """Consume what is left of the job's tests (the job ended before the judge took them)."""
        if self.secret_left > 0:
            self._relay_tests(None)

    @staticmethod
    def _charge(statuses: list, nxt: int, end: tuple, loaded: bool, run_all: bool):
        """Give the test that was running when an execution ended its end reason (every test
        left, when the code never finished loading). Returns the test to go on from, or None."""
        if not loaded:
            statuses[nxt:] = [end] * (len(statuses) - nxt)
            return None
        statuses[nxt] = end
        return nxt + 1 if run_all else None

    # -- one job ------------------------------------------------------------------------------

    def run_assert(self, job: dict) -> dict:
        n = int(job["n"])
        timeout = float(job["timeout_s"])
        self.secret_left = int(job.get("secret", 0))
        statuses: list = [None] * n
        stdout = Tail(0, self.cfg["tail_bytes"])
        stderr = Tail(0, self.cfg["tail_bytes"])
        budget = self.cfg["max_result_bytes"]  # bytes the program's answers may take, whole job
        prep = harness.Prepared({"code": job["code"]})
        start, plain = 0, False
        while start < n:
            if self.judge_pid is None:
                if self.secret_left == 0:  # the judge holding this job's tests was stopped
                    for i in range(start, n):
                        statuses[i] = (
                            "error",
                            "not run: the judge holding this job's tests was stopped at an earlier "
                            "test (out of time in its own evaluation, or killed)",
                        )
                    break
                self.start_judge()
            parsed = {
                "next": start,
                "code": None,
                "loaded": False,
                "end": False,
                "stop": None,
                "bad": False,
                "fresh": None,
            }
            key = os.urandom(32)

            def on_records(new, parsed=parsed):
                ext = 0.0
                for r in new:
                    k = r.get("k")
                    if k == "code":
                        parsed["code"] = (r.get("s") if r.get("s") in _VERDICTS else "error", r.get("m", ""))
                    elif k == "loaded":
                        parsed["loaded"] = True
                        ext = min(r["t"], time.monotonic()) + timeout
                    elif k == "test" and r.get("i") == parsed["next"] < n:
                        st = r.get("s")
                        # Sealed by the judge for the pool (wire.seal): passed on as it is.
                        statuses[parsed["next"]] = (
                            (st, str(r.get("m", ""))[:4096])
                            if st in _VERDICTS
                            else ("error", "sandbox judge sent a bad record")
                        )
                        parsed["next"] += 1
                        ext = min(r["t"], time.monotonic()) + timeout
                    elif k == "stop":
                        parsed["stop"] = str(r.get("m", ""))[:300]
                    elif k == "end":
                        parsed["end"] = True
                    elif k == "fresh":  # go on from the next test in a fresh execution
                        parsed["fresh"] = r.get("s") == "plain"  # and without a plan
                    else:
                        parsed["bad"] = True
                return ext

            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
            hdr = json.dumps(
                {
                    "start": start,
                    "key": key.hex(),
                    "budget": budget,
                    "memory_mb": job["memory_mb"],
                    "run_all_cases": bool(job["run_all_cases"]),
                    "secret": self.secret_left,
                    "plain": plain,
                }
            ).encode()
            try:
                try:
                    socket.send_fds(self.judge_sock, [len(hdr).to_bytes(4, "big") + hdr], [req_w, rep_r])
                    self._relay_tests(self.judge_sock.fileno())
                except OSError:
                    self._kill_judge()
                    self.drop_tests()
                    for i in range(start, n):
                        statuses[i] = ("error", "sandbox judge could not be reached")
                    break
            finally:
                os.close(req_w)
                os.close(rep_r)
            reader = RecordReader(key)
            cpu_s = timeout * (n - start + 1) + 1
            pid, _, fds = self._spawn(
                job, None, cpu_s, lambda rep: harness.serve(prep, 3, 4), False, pass_fds=(req_r, rep_w)
            )
            os.close(req_r)
            os.close(rep_w)
            try:
                reason, status = self._watch_judged(pid, fds[:2], stdout, stderr, reader, on_records, parsed, timeout)
            finally:
                self._restore()
            budget -= reader.total
            nxt = parsed["next"]
            if self.judge_pid is None and reason == "timeout":
                parsed["loaded"] = True  # a judge busy with a test had the program's names: it loaded
            if parsed["bad"] or reader.tampered:
                for i in range(start, n):
                    if statuses[i] is None or statuses[i][0] == "passed":
                        statuses[i] = ("error", "sandbox judge sent a bad record")
                self._kill_judge()
                break
            if parsed["code"] is not None:  # the program did not load: every remaining test fails
                for i in range(nxt, n):
                    statuses[i] = parsed["code"]
                break
            if parsed["end"] or nxt >= n:
                break
            if parsed["fresh"] is not None and reason is None:
                start, plain = nxt, plain or parsed["fresh"]
                continue
            if reason == "judge":
                end = ("error", "sandbox judge stopped (killed from outside)")
            elif reason is not None:
                end = self._end_reason(reason, status, stderr.tail_text())
            elif (
                status is not None
                and os.WIFEXITED(status)
                and os.WEXITSTATUS(status) == 0
                and "MemoryError" not in stderr.tail_text()
            ):
                end = ("error", "the program exited before the test finished")
            elif status is not None:
                end = self._end_reason(None, status, stderr.tail_text())
            else:
                end = ("error", parsed["stop"] or "the program stopped answering")
            start = self._charge(statuses, nxt, end, parsed["loaded"], job["run_all_cases"])
            if start is None:
                break
        self.drop_tests()
        tests = [
            {"status": "skipped", "message": ""} if s is None else {"status": s[0], "message": s[1]} for s in statuses
        ]
        return {"tests": tests, "stdout": stdout.tail_text(), "stderr": stderr.tail_text()}

    def _watch_judged(self, pid, fds, stdout: Tail, stderr: Tail, reader, on_records, parsed, timeout_s):
        """Wait until the judge ends the segment (``end``/``stop``), its deadline passes, the
        program writes too much or the judge dies. Returns (reason or None, the execution's wait
        status or None).

        For its first RECORDS_AFTER_S the worker does not read the judge's records: each wake-up
        would run Python here while the execution still shares this process's pages (every page
        written is copied), and most executions are over by then; the judge closes the execution's
        channel when it is done, so the execution exits, and the records wait in the socket. After
        that they are read as they come (the judge sends them in batches, ``judge.Records``): a
        judge whose records fill its socket would otherwise block until the deadline."""
        out_r, err_r = fds
        sock = self.judge_sock.fileno()
        # poll, not epoll: one system call per wait, none to set up. Every fd is read only once
        # poll says it is readable, so none needs to be non-blocking.
        ep = select.poll()
        pidfd = os.pidfd_open(pid)
        for fd in (out_r, err_r, pidfd):
            ep.register(fd, select.POLLIN)
        cap = self.cfg["max_output_bytes"]
        deadline = time.monotonic() + timeout_s
        watch_records_at = time.monotonic() + RECORDS_AFTER_S
        reason, status, judge_eof, swept = None, None, False, None

        def judge_bytes(wait: bool = True) -> bool:
            """Take in what the judge sent; False when it is gone."""
            nonlocal deadline, judge_eof
            if self.judge_sock is None:  # reaped by a sweep (killed by the program): its socket is closed
                judge_eof = True
                return False
            try:
                b = self.judge_sock.recv(1 << 16, 0 if wait else socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            if not b:
                judge_eof = True
                return False
            deadline = max(deadline, on_records(reader.feed(b)))
            return True

        def finished() -> bool:
            return parsed["end"] or parsed["stop"] is not None or parsed["bad"] or parsed["fresh"] is not None

        try:
            # Done when the judge has ended the segment and the execution is gone (the judge closes
            # its channel after its last record, so it goes at once), or at the deadline.
            while not (finished() and status is not None):
                now = time.monotonic()
                if now >= deadline:
                    # Records the judge held back may move the deadline on.
                    while judge_bytes(wait=False) and not finished() and select.select([sock], [], [], 0)[0]:
                        pass
                    if judge_eof:
                        reason = "judge"
                    elif not finished() and time.monotonic() >= deadline:
                        reason = "timeout"
                    if reason is not None or finished():
                        break
                    continue
                if now >= watch_records_at:
                    watch_records_at = float("inf")
                    ep.register(sock, select.POLLIN)
                wait = min(deadline, watch_records_at) - now
                for fd, _ in ep.poll(max(1, int(wait * 1000 + 1))):
                    if fd == pidfd:
                        ep.unregister(pidfd)
                        _, status = os.waitpid(pid, 0)
                        # What it left would keep the judge's channel open: the judge must see it
                        # close (if it still waits on the program) and say so.
                        swept = self._sweep(None)
                        if self.judge_sock is None:  # the sweep reaped a judge the program killed
                            judge_eof, reason = True, "judge"
                            break
                        watch_records_at = float("inf")
                        ep.register(sock, select.POLLIN)
                    elif fd == sock:
                        if not judge_bytes():
                            reason = "judge"
                            break
                    else:
                        b = os.read(fd, 1 << 16)
                        if not b:
                            ep.unregister(fd)
                            continue
                        (stdout if fd == out_r else stderr).add(b)
                if reason is not None:
                    break
                if stdout.total + stderr.total > cap:
                    reason = "output_limit"
                    break
        finally:
            if status is None:
                self._kill_group(pid)
                _, status = os.waitpid(pid, 0)
            if swept is None:
                swept = self._sweep(pid)
            if not swept and self.broken is None:
                self.broken = "processes it started were still alive 10 s after being killed"
            if reason is not None and not judge_eof:
                # The judge may be waiting on the execution just killed: it stops within moments.
                # One that does not is busy with its own evaluation: it goes, with the tests.
                end = time.monotonic() + JUDGE_GRACE_S
                while not finished():
                    left = end - time.monotonic()
                    if (
                        self.judge_sock is None  # reaped by the sweep above: it died
                        or left <= 0
                        or not select.select([sock], [], [], left)[0]
                        or not judge_bytes()
                    ):
                        self._kill_judge()
                        break
            if judge_eof:
                self._kill_judge()
            drain_tails(((out_r, stdout), (err_r, stderr)), cap)
            os.close(pidfd)
            for fd in fds:
                os.close(fd)
        return reason, status


def _address_space(pid: int) -> int:
    """The address space of process ``pid`` in bytes (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
