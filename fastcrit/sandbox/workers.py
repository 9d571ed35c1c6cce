"""The warm worker: a pre-started interpreter that forks once per execution.

Started by the pool (inside ``fastcrit-jail`` unless isolation is "none") with ``python -I``, by
``jail.worker_argv``, with the config as JSON in argv. It reads length-prefixed JSON jobs on fd 0
and answers length-prefixed JSON results on fd 1, one job at a time.

Per execution the forked child gets: its own process group, the scratch directory as its current
directory, HOME and TMPDIR (see Scratch), a scrubbed environment, rlimits (address space, CPU,
processes, file size, open files, no core files), stdin from a memfd, stdout/stderr to pipes read
here with a cap, and the result pipe (fd 3), read here as records arrive, with a cap. The worker
enforces the wall clock; on timeout, a cap or when the child ends, the whole process group is
killed and, when the worker is PID 1 of its own PID namespace (the jail), every other process in
the namespace too (``kill(-1)``), which also catches children that escaped the group.

Nothing of one execution may reach the next. After each one the worker waits until every process
it left is reaped (RLIMIT_NPROC counts zombies and dying processes too) and resets the scratch
directory. A program that changed what belongs to the worker (the scratch directory itself rather
than its contents) has its job scored 0; a state the worker cannot restore (processes that do not
die, space that stays used, file descriptors of its own that changed, its resource limits, nice
value, scheduling policy or CPU affinity changed: reaping.process_settings) scores the job 0 too, and
the worker answers it with ``retire`` and exits, so that the pool replaces it.
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import json
import math
import os
import resource
import select
import signal
import sys
import time

from . import harness
from .channels import RecordReader, Tail, drain_tails, read_frame, write_frame
from .judging import JudgedRuns
from .reaping import REAP_S, Reaping, process_settings
from .scratch import Scratch, Unrestorable

_GOOD = ("passed", "returned")  # statuses that do not stop a run_all_cases=False job here
_SIGNAMES = {getattr(signal, n): n for n in dir(signal) if n.startswith("SIG") and not n.startswith("SIG_")}
# The result pipe is read as records arrive only once an execution has run this long. Most
# executions end sooner, their records waiting in the pipe (64 KiB) until the exit: a wake-up per
# record would run Python here while the child still shares this process's pages, and every page
# written is copied. A value too big for the pipe blocks its writer for this long at most.
RESULTS_AFTER_S = 0.02


class Worker(JudgedRuns, Reaping):
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.is_init = os.getpid() == 1
        self._children_path = f"/proc/self/task/{os.getpid()}/children"
        self.counter = 0
        self.scratch = Scratch(cfg["scratch"], private=bool(cfg.get("jailed")))
        # What the current job did to the worker: changes undone (the job scores 0) and the first
        # state that could not be restored (the job scores 0 and the worker is replaced).
        self.damage: list[str] = []
        self.broken: str | None = None
        self.fd_count = None  # set by main once the worker's own descriptors are all open
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if not self.is_init:
            # Without the jail's PID namespace, orphans of an execution are re-parented here so
            # that the sweep after each execution can find and kill them.
            try:
                ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
            except (OSError, AttributeError):
                pass
        try:  # no execution may read this process's memory (it holds other tests' data)
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        except (OSError, AttributeError):
            pass
        try:
            # Big buffers (a job's return values, its answer) are mapped and unmapped on their own
            # rather than carved from the heap: glibc's default raises this threshold after the
            # first big free, and the heap then keeps what a big result made it grow, which every
            # later fork copies page tables for.
            ctypes.CDLL(None).mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD, fixed
        except (OSError, AttributeError):
            pass

    # -- one execution ----------------------------------------------------------------------

    def _limits(self, job: dict, cpu_s: float):
        mem = int(job["memory_mb"]) << 20
        cfg = self.cfg
        lims = [
            (resource.RLIMIT_AS, mem),
            (resource.RLIMIT_CPU, max(1, math.ceil(cpu_s))),
            (resource.RLIMIT_FSIZE, cfg["max_file_mb"] << 20),
            (resource.RLIMIT_NOFILE, cfg["max_open_files"]),
            (resource.RLIMIT_CORE, 0),
        ]
        if os.getuid() != 0:  # root ignores RLIMIT_NPROC; the jail drops root so it holds there
            # The worker and its judge run under the same uid, hence the + 2.
            lims.append((resource.RLIMIT_NPROC, cfg["max_processes"] + 2))
        for which, value in lims:
            try:
                soft, hard = resource.getrlimit(which)
                v = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.setrlimit(which, (v, v))
            except (ValueError, OSError):
                pass

    def _spawn(self, job, stdin_fd, cpu_s, target, results: bool, pass_fds=()):
        """Fork one execution. ``target`` runs in the child and never returns. Its stdin is
        ``stdin_fd`` (or /dev/null); fd 3 is the result pipe when ``results``, else ``pass_fds``
        become fds 3, 4, ..."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe() if results else (None, None)
        # The result channel's key and writer, made here (the child copies less); only executions
        # that write records (call tests) need them.
        key = os.urandom(32) if results else None
        reporter = harness.Reporter(3, key) if results else None
        keep = [res_w] if res_w is not None else list(pass_fds)
        pid = os.fork()
        if pid == 0:  # the execution
            try:
                os.setpgid(0, 0)
                os.dup2(stdin_fd if stdin_fd is not None else os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in keep]  # out of the way of 3, 4, ... first
                for k, fd in enumerate(high):
                    os.dup2(fd, 3 + k)
                os.closerange(3 + len(keep), 1 << 16)
                os.chdir(self.scratch.home)
                # The environment was scrubbed once at worker start (see main). `random` is not
                # preloaded, so programs that use it seed it afresh when they import it.
                self._limits(job, cpu_s)
                sys.argv = ["solution.py"]
                target(reporter)
            except BaseException:
                pass
            os._exit(70)
        for fd in (out_w, err_w, res_w):
            if fd is not None:
                os.close(fd)
        return pid, key, (out_r, err_r, res_r)

    def _execute(
        self,
        job,
        stdin_fd,
        cpu_s,
        target,
        stdout: Tail,
        stderr: Tail,
        timeout_s: float,
        on_records=None,
        result_budget: int = 0,
    ):
        """One execution, start to finish: fork it, watch it, kill and reap everything it left and
        reset the scratch directory. ``on_records`` (assert/call) takes each batch of verified
        records as they arrive and returns the time by which the running test must end.
        Returns (kill reason or None, wait status, RecordReader or None)."""
        pid, key, fds = self._spawn(job, stdin_fd, cpu_s, target, on_records is not None)
        reader = RecordReader(key) if on_records is not None else None
        try:
            reason, status = self._watch(pid, fds, stdout, stderr, reader, on_records, timeout_s, result_budget)
        finally:
            self._restore()
        return reason, status, reader

    def _restore(self):
        """Put the scratch directory back after an execution; note what had to be undone."""
        if self.broken is not None:
            return  # the worker is being replaced: its scratch goes with it
        try:
            self.damage += self.scratch.reset()
        except Unrestorable as exc:
            self.broken = str(exc)
        except OSError as exc:
            self.broken = f"cleaning its scratch directory failed: {exc}"

    def _watch(
        self, pid, fds, stdout: Tail, stderr: Tail, reader, on_records, timeout_s: float, result_budget: int
    ) -> tuple[str | None, int]:
        """Wait until the execution exits, its wall clock runs out or it writes too much.

        The child's exit and its stdout/stderr wake the worker, and its result pipe too once it
        has run RESULTS_AFTER_S: from then on records are read as they arrive, so a big return
        value never waits for a deadline to be read. Each batch of records moves the deadline on
        to the running test's (``on_records``). Returns (kill reason or None, wait status)."""
        out_r, err_r, res_r = fds
        ep = select.epoll(4)
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        for fd in fds:
            if fd is not None:
                os.set_blocking(fd, False)
        ep.register(out_r, select.EPOLLIN)
        ep.register(err_r, select.EPOLLIN)
        if pidfd is not None:
            ep.register(pidfd, select.EPOLLIN)
        cap = self.cfg["max_output_bytes"]
        start = time.monotonic()
        deadline = start + timeout_s
        watch_results_at = start + RESULTS_AFTER_S if res_r is not None else math.inf

        def take(b) -> bool:
            """Feed result bytes unless they would pass the budget (then nothing of them counts)."""
            nonlocal deadline
            if reader.total + len(b) > result_budget:
                return False
            deadline = max(deadline, on_records(reader.feed(b)))
            return True

        reason, status, done = None, None, False
        try:
            while not done:
                now = time.monotonic()
                if now >= deadline:
                    if res_r is not None and not self._drain(res_r, take):
                        reason = "result_limit"
                        break
                    if now >= deadline:
                        reason = "timeout"
                        break
                    continue
                if now >= watch_results_at:
                    watch_results_at = math.inf
                    ep.register(res_r, select.EPOLLIN)  # reports what is already waiting at once
                wait = min(deadline, watch_results_at) - now
                if pidfd is None:
                    wait = min(0.01, wait)
                for fd, _ in ep.poll(wait):
                    if fd == pidfd:
                        done = True
                        continue
                    try:
                        b = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if not b:
                        ep.unregister(fd)
                        continue
                    if fd == res_r:
                        if not take(b):
                            reason = "result_limit"
                    else:
                        (stdout if fd == out_r else stderr).add(b)
                if reason is not None:
                    break
                if stdout.total + stderr.total > cap:
                    reason = "output_limit"
                    break
                if pidfd is None:
                    p, st = os.waitpid(pid, os.WNOHANG)
                    if p:
                        status, done = st, True
        finally:
            if reason is not None or not done:
                self._kill_group(pid)
            if status is None:
                _, status = os.waitpid(pid, 0)
            # Kill whatever the execution left behind first, so that nobody writes any more; then
            # drain what was written before it ended.
            if not self._sweep(pid) and self.broken is None:
                self.broken = f"processes it started were still alive {REAP_S:.0f} s after being killed"
            if res_r is not None and reason != "result_limit" and not self._drain(res_r, take):
                reason = "result_limit"
            drain_tails(((out_r, stdout), (err_r, stderr)), cap)
            ep.close()
            for fd in fds:
                if fd is not None:
                    os.close(fd)
            if pidfd is not None:
                os.close(pidfd)
        return reason, status

    @staticmethod
    def _drain(fd, take) -> bool:
        """Read what is in the pipe now; False when ``take`` refused a piece."""
        while True:
            try:
                b = os.read(fd, 1 << 16)
            except (BlockingIOError, OSError):
                return True
            if not b:
                return True
            if not take(b):
                return False

    def _fd_count(self) -> int:
        return len(os.listdir("/proc/self/fd"))

    # -- one job ------------------------------------------------------------------------------

    def run_job(self, job: dict) -> dict:
        """Run one job and check the worker afterwards. A job that left the worker changed scores
        0 (every test an ``error`` saying what happened, and ``damage`` set for the pool); one
        that left it in a state it cannot restore also sets ``retire``: main answers, then exits."""
        self.counter += 1
        self.damage, self.broken = [], None
        try:
            kind = job["kind"]
            out = (
                self._run_stdio(job)
                if kind == "stdio"
                else self.run_assert(job)
                if kind == "assert"
                else self._run_in_process(job)
            )
        except Exception as exc:  # a harness bug must not look like a pass: report it
            out = {
                "tests": [
                    {"status": "error", "message": f"sandbox worker error: {exc!r}"[:500]} for _ in range(_n_tests(job))
                ],
                "stdout": "",
                "stderr": "",
            }
            self.drop_tests()
            # It may have stopped anywhere: kill what might be left and reset the scratch.
            if not self._sweep(None):
                self.broken = self.broken or "processes it started could not be killed"
            self._restore()
        self.ready_judge()  # stopped at a deadline, killed by the program, or grown big: a fresh one
        problem = self.broken or self.changed_process()
        if problem is not None:
            msg = (
                f"the program left its sandbox worker in a state it could not restore ({problem}); "
                f"the worker was replaced and the job scores 0"
            )
        elif self.damage:
            msg = (
                f"the program changed its scratch directory, which later jobs on this sandbox worker use "
                f"({'; '.join(dict.fromkeys(self.damage))}); the worker restored it and the job scores 0"
            )
        else:
            return out
        out = {
            "tests": [{"status": "error", "message": msg} for _ in range(_n_tests(job))],
            "damage": msg,
            "stdout": out.get("stdout", ""),
            "stderr": out.get("stderr", ""),
        }
        if problem is not None:
            out["retire"] = True
        return out

    def _end_reason(self, reason, status, stderr_tail):
        """Status of the test that was running when the execution ended without a record."""
        if reason == "timeout":
            return "timeout", "wall-clock timeout"
        if reason == "output_limit":
            return "output_limit", f"output over {self.cfg['max_output_bytes']} bytes"
        if reason == "result_limit":
            return "output_limit", f"return values over {self.cfg['max_result_bytes']} bytes in one job"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = _SIGNAMES.get(sig, str(sig))
            if sig == signal.SIGXCPU:
                return "timeout", "CPU time limit"
            if sig == signal.SIGXFSZ:
                return "output_limit", "file size limit"
            if "MemoryError" in stderr_tail:
                return "memory", f"killed by {name} after MemoryError"
            return "error", f"killed by {name}"
        code = os.WEXITSTATUS(status)
        if "MemoryError" in stderr_tail:
            return "memory", "MemoryError"
        return "error", f"exited (status {code}) before the test finished"

    def _run_in_process(self, job: dict) -> dict:
        """``call`` jobs: the entry point's return values, passed on as JSON text for the pool to
        compare (expected values never reach the worker, so a forked execution cannot find them
        in its own memory either)."""
        n = len(job["tests"])
        timeout = float(job["timeout_s"])
        view = {
            "code": job["code"],
            "entry_point": job.get("entry_point"),
            "run_all_cases": job["run_all_cases"],
            "tests": [{"args": t["args"], "kwargs": t["kwargs"]} for t in job["tests"]],
        }
        statuses = [None] * n
        stdout = Tail(0, self.cfg["tail_bytes"])
        stderr = Tail(0, self.cfg["tail_bytes"])
        # Return values of the whole job, together, up to this many bytes of records.
        result_budget = self.cfg["max_result_bytes"]
        start = 0
        while start < n:
            parsed = {"next": start, "code": None, "tampered": False, "loaded": False}

            def on_records(new, parsed=parsed):
                """Take in new records; return the time by which the running test must end. A
                record's time is the execution's word (a program that reaches the key can sign
                records): never later than now, so it cannot put its deadline off."""
                ext = 0.0
                for r in new:
                    if not job["run_all_cases"] and any(x is not None and x[0] not in _GOOD for x in statuses):
                        break  # stop at the first failure: later records are ignored
                    # A program that reaches the key can sign any record: a "code" record with a
                    # status harness._load never gives (e.g. "returned", without a value) is tampering.
                    if r.get("k") == "code" and r.get("s") in ("error", "memory", "output_limit"):
                        parsed["code"] = r
                    elif r.get("k") == "loaded":
                        parsed["loaded"] = True
                        ext = min(r["t"], time.monotonic()) + timeout
                    elif r.get("k") == "test" and r.get("i") == parsed["next"] and parsed["next"] < n:
                        i = parsed["next"]
                        st, msg, val = r.get("s"), str(r.get("m", ""))[:500], None
                        if st == "passed":  # the pool compares the value
                            st, val = "returned", r.get("vj")
                        if st not in ("passed", "returned", "failed", "error", "memory", "output_limit"):
                            st, msg = "error", "bad record"
                        statuses[i] = (st, msg, val)
                        parsed["next"] += 1
                        ext = min(r["t"], time.monotonic()) + timeout
                    else:
                        parsed["tampered"] = True
                return ext

            prep = harness.Prepared(view, start)

            def target(reporter, prep=prep):
                harness.run_tests(prep, reporter)

            # CPU budget: loading the code plus every remaining test.
            cpu_s = timeout * (n - start + 1) + 1
            reason, status, reader = self._execute(
                job, None, cpu_s, target, stdout, stderr, timeout, on_records, result_budget
            )
            result_budget -= reader.total
            nxt = parsed["next"]
            if parsed["tampered"] or reader.tampered:
                for i in range(start, n):
                    if statuses[i] is None or statuses[i][0] in _GOOD:
                        statuses[i] = ("error", "result channel tampered with")
                break
            if parsed["code"] is not None:  # the code itself failed: every remaining test fails
                c = parsed["code"]
                for i in range(nxt, n):
                    statuses[i] = (c.get("s", "error"), str(c.get("m", ""))[:500])
                break
            stopped = not job["run_all_cases"] and any(s is not None and s[0] not in _GOOD for s in statuses)
            if nxt >= n or stopped:
                break
            if reason is None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                # The harness exits 0 only after its last test: an early clean exit is the
                # program's own doing (os._exit / sys.exit from a thread ...).
                end = ("error", "the program exited before the test finished")
            else:
                end = self._end_reason(reason, status, stderr.tail_text())
            start = self._charge(statuses, nxt, end, parsed["loaded"], job["run_all_cases"])
            if start is None:
                break
        tests = []
        for s in statuses:
            if s is None:
                tests.append({"status": "skipped", "message": ""})
            elif s[0] == "returned":
                # JSON text, decoded by the pool: big values never become objects here.
                tests.append({"status": "returned", "message": "", "value_json": s[2]})
            else:
                tests.append({"status": s[0], "message": s[1]})
        return {"tests": tests, "stdout": stdout.tail_text(), "stderr": stderr.tail_text()}

    def _run_stdio(self, job: dict) -> dict:
        tests, last_out, last_err = [], "", ""
        failed = False
        cap = self.cfg["max_output_bytes"]
        # Every passing test's stdout travels to the pool (which alone holds the expected output),
        # so the job's together are bounded as call and assert jobs' values are: else 1 MiB a test
        # over hundreds of tests is hundreds of MB in the worker and the pool, per job in flight.
        budget = self.cfg["max_result_bytes"]
        prep = harness.Prepared({"code": job["code"]})  # compiled once for every test
        for t in job["tests"]:
            if failed and not job["run_all_cases"]:
                tests.append({"status": "skipped", "message": ""})
                continue
            # The input lives in a memfd, outside the scratch directory: it takes none of its
            # space and leaves nothing there.
            stdin_fd = os.memfd_create("stdin")
            try:
                data = memoryview(t["input"].encode("utf-8", "surrogatepass"))
                while data:
                    data = data[os.write(stdin_fd, data) :]
                os.lseek(stdin_fd, 0, os.SEEK_SET)
                stdout = Tail(cap, self.cfg["tail_bytes"])
                stderr = Tail(0, self.cfg["tail_bytes"])
                reason, status, _ = self._execute(
                    job,
                    stdin_fd,
                    float(job["timeout_s"]) + 1,
                    lambda reporter, prep=prep: harness.run_program(prep),
                    stdout,
                    stderr,
                    float(job["timeout_s"]),
                )
            finally:
                os.close(stdin_fd)
            if reason is None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                last_out, last_err = stdout.tail_text(), stderr.tail_text()
                budget -= len(stdout.head)
                if budget < 0:
                    msg = f"stdout over {self.cfg['max_result_bytes']} bytes over the job's tests (max_result_bytes)"
                    tests.append({"status": "output_limit", "message": msg})
                    failed = True
                    continue
                # Judged by the pool, which alone holds the expected output.
                tests.append(
                    {"status": "returned", "message": "", "value": bytes(stdout.head).decode("utf-8", "replace")}
                )
                continue
            elif reason is None and os.WIFEXITED(status):
                tail = stderr.tail_text()
                if "File too large" in tail or "No space left" in tail:
                    tests.append({"status": "output_limit", "message": "file size limit"})
                    failed = True
                    last_out, last_err = stdout.tail_text(), tail
                    continue
                st = (
                    ("memory", "MemoryError")
                    if "MemoryError" in tail
                    else ("error", (tail.strip().splitlines() or [f"exit status {os.WEXITSTATUS(status)}"])[-1][:500])
                )
            else:
                st = self._end_reason(reason, status, stderr.tail_text())
            tests.append({"status": st[0], "message": st[1]})
            failed = failed or st[0] != "passed"
            last_out, last_err = stdout.tail_text(), stderr.tail_text()
        return {"tests": tests, "stdout": last_out, "stderr": last_err}


def _n_tests(job: dict) -> int:
    return int(job["n"]) if job.get("kind") == "assert" else len(job.get("tests", ()))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(argv[0])
    # Keep the protocol pipes away from fds 0/1/2, which executions take over.
    fd_in = os.dup(0)
    fd_out = os.dup(1)
    for fd in (fd_in, fd_out):
        os.set_inheritable(fd, False)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    worker = Worker(cfg)
    # Nothing of the pool's environment reaches executions (they inherit this one).
    os.environ.clear()
    os.environ.update(worker.env, HOME=worker.scratch.home, TMPDIR=worker.scratch.home)
    failed = harness.prepare_worker(cfg.get("preimport", ()))
    worker.fd_in = fd_in
    worker.settings = process_settings(0)
    worker.start_judge()
    worker.fd_count = worker._fd_count()
    write_frame(
        fd_out,
        {
            "ready": True,
            "pid": os.getpid(),
            "uid": os.getuid(),
            "init": worker.is_init,
            "preimport_failed": failed,
            "package": os.path.dirname(harness.__file__),
        },
    )
    # The loop makes little cyclic garbage; automatic collections would walk (and, after each
    # fork, copy) pages for nothing. Collect explicitly now and then instead.
    gc.disable()
    while True:
        if worker.counter % 256 == 255:
            gc.collect()
        job = read_frame(fd_in)
        if job is None:
            return 0
        t0 = time.perf_counter()
        res = worker.run_job(job)
        res["elapsed_s"] = time.perf_counter() - t0
        write_frame(fd_out, res)
        if res.get("retire"):
            return 0  # answered; the pool replaces this worker, whose state could not be restored


if __name__ == "__main__":
    sys.exit(main())
