"""The sandbox pool: warm workers behind an asyncio (uvloop) front.

    async with SandboxPool(workers=4) as pool:
        result = await pool.run(job)
        results = await pool.run_many(jobs)            # bounded concurrency, input order
        async for i, r in pool.stream(jobs): ...       # as they finish

    with SyncSandboxPool() as pool:                     # scripts: same API without await
        results = pool.run_many(jobs)

Each worker is a Python interpreter with common modules imported, started inside the native jail
(see jail.py) with its own unprivileged uid; it forks per execution. A job waits for a free worker;
a worker that dies or stops answering is replaced and its job reported as an error (never a pass).
A worker that a job left in a state it cannot restore answers that job (scored 0) and retires; it
is replaced the same way, and the jobs queued behind it run again, never charged for it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import struct
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Iterable

from . import jail as jail_mod
from .cache import ResultCache, job_key
from .compare import judge
from .streaming import run_all, stream_results
from .types import (
    ERROR,
    Job,
    JobError,
    Result,
    SandboxConfig,
    error_result,
    summarise,
)
from .wire import unseal

_HDR = struct.Struct(">I")
_POOLS_STARTED = 0


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


class WorkerLost(RuntimeError):
    """The worker died (or was restarted, or retired) before answering. ``ran`` is True for the
    job it was running, False for jobs only queued behind it (those are run again elsewhere)."""

    def __init__(self, message: str, ran: bool):
        super().__init__(message)
        self.ran = ran


# How many times a job that never ran (queued behind a worker that was lost or retired, then
# replaced) is sent again before it is reported as an error.
_MAX_REQUEUES = 64


class _WorkerProc:
    """One warm worker process and its request pipeline.

    Up to ``DEPTH`` jobs are written to a worker ahead of time: it reads the next job from its pipe
    the moment it finishes one, instead of waiting for this process to be scheduled, read the answer
    and send more. Answers come back in order; a reader task matches them to the waiting calls.
    """

    DEPTH = 2

    def __init__(self, index: int, argv: list[str], scratch: str, env: dict):
        self.index = index
        self.argv = argv
        self.scratch = scratch
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.hello: dict = {}
        self.stderr_tail = b""
        self._stderr_task = None
        self._reader = None
        self.pending: collections.deque = collections.deque()
        self.generation = 0
        self._lock: asyncio.Lock | None = None

    async def start(self, timeout_s: float = 60.0):
        self.stderr_tail = b""
        self.pending = collections.deque()
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            limit=1 << 26,
        )
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(self.proc))
        try:
            self.hello = await asyncio.wait_for(self._read(self.proc), timeout_s)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            await self.kill()
            raise RuntimeError(
                f"sandbox worker {self.index} did not start: {exc!r}; "
                f"stderr: {self.stderr_tail.decode(errors='replace')[-800:]}"
            ) from None
        self.generation += 1
        self._reader = asyncio.ensure_future(self._read_loop(self.proc, self.pending))

    async def _drain_stderr(self, proc):
        while True:
            b = await proc.stderr.read(4096)
            if not b:
                return
            self.stderr_tail = (self.stderr_tail + b)[-4096:]

    @staticmethod
    async def _read_frame(proc) -> bytes:
        hdr = await proc.stdout.readexactly(4)
        (n,) = _HDR.unpack(hdr)
        return await proc.stdout.readexactly(n)

    @classmethod
    async def _read(cls, proc) -> dict:
        return json.loads(await cls._read_frame(proc))

    async def _read_loop(self, proc, pending):
        why, first = "died", True
        try:
            while True:
                body = await self._read_frame(proc)
                fut = pending.popleft()
                try:
                    out = json.loads(body)
                except RecursionError:
                    # A value nested deeper than this process's stack allows (a forged record can
                    # carry one): the frame was read whole, so only this answer is lost.
                    out = {"undecodable": "nested too deeply to decode"}
                if not fut.done():  # a caller that gave up (cancelled) leaves a done future
                    fut.set_result(out)
                if out.get("retire"):
                    # It answered the job that broke it and exits: the jobs behind it never ran.
                    why, first = "retired", False
                    asyncio.ensure_future(self._replace(self.generation))
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError) as exc:
            why = f"died ({type(exc).__name__})"
        except asyncio.CancelledError:
            why = "was restarted"
        while pending:
            fut = pending.popleft()
            if not fut.done():
                fut.set_exception(WorkerLost(f"sandbox worker {self.index} {why}", ran=first))
            first = False

    async def _replace(self, generation: int):
        try:
            await self.restart(generation)
        except RuntimeError:
            pass  # the next call finds it not running and tries again

    @property
    def alive(self) -> bool:
        return self.proc is not None and self._reader is not None and not self._reader.done()

    async def call(self, payload: dict, timeout_s: float, secret: bytes = b"") -> dict:
        if not self.alive and self._lock is not None and self._lock.locked():
            async with self._lock:  # a restart is under way (after a retirement): wait for it
                pass
        if not self.alive:
            raise WorkerLost(f"sandbox worker {self.index} is not running", ran=False)
        fut = asyncio.get_running_loop().create_future()
        self.pending.append(fut)
        body = json.dumps(payload, separators=(",", ":")).encode()
        try:
            # ``secret`` (an assert job's tests) follows the frame; the worker relays it to its
            # judge without reading it (``len(secret)`` is in the payload).
            self.proc.stdin.write(_HDR.pack(len(body)) + body + secret)
            await self.proc.stdin.drain()
        except (ConnectionError, BrokenPipeError, RuntimeError):
            pass  # the reader sees the worker go and fails the pending calls
        return await asyncio.wait_for(fut, timeout_s)

    async def restart(self, generation: int):
        """Replace the process once, however many callers saw it fail."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.generation != generation and self.alive:
                return  # someone else already restarted it
            await self.kill()
            await self.start()

    async def kill(self):
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
            await self.proc.wait()
        for t in (self._reader, self._stderr_task):
            if t is not None and not t.done():
                t.cancel()
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass

    async def close(self):
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.stdin.close()
                await asyncio.wait_for(self.proc.wait(), 5)
            except (asyncio.TimeoutError, ConnectionError, BrokenPipeError):
                pass
        await self.kill()


class SandboxPool:
    """Async pool of warm, jailed workers.

    ``isolation="jail"`` (default) refuses to start where the jail cannot be set up and says why;
    ``isolation="none"`` runs workers without it (rlimits, process-group kill, scratch directory and
    scrubbed environment only) after a loud warning: only for trusted code.
    """

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        workers: int | None = None,
        isolation: str | None = None,
        cache_path: str | None | bool = False,
        max_concurrency: int | None = None,
    ):
        cfg = config or SandboxConfig()
        over = {}
        if workers is not None:
            over["workers"] = workers
        if isolation is not None:
            over["isolation"] = isolation
        if cache_path is not False:
            over["cache_path"] = cache_path
        if max_concurrency is not None:
            over["max_concurrency"] = max_concurrency
        if over:
            cfg = SandboxConfig(**{**cfg.__dict__, **over})
        self.cfg = cfg
        self.cache = ResultCache(cfg.cache_path) if cfg.cache_path else None
        self.probe: jail_mod.Probe | None = None
        self._workers: list[_WorkerProc] = []
        self._slots: asyncio.Queue | None = None
        self._sem: asyncio.Semaphore | None = None
        self._root = None
        self._started = False
        self.executed = 0

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self) -> SandboxPool:
        if self._started:
            return self
        cfg = self.cfg
        if cfg.isolation == "jail":
            self.probe = await asyncio.get_running_loop().run_in_executor(
                None, lambda: jail_mod.probe(packages=cfg.packages)
            )
            if not self.probe.ok:
                raise jail_mod.IsolationUnavailable(
                    "fastcrit sandbox: ISOLATION UNAVAILABLE on this machine, refusing to run untrusted code. "
                    f"{self.probe.describe()}. Set sandbox.isolation: none (SandboxPool(isolation='none')) "
                    "only if you trust the code."
                )
        else:
            msg = (
                "fastcrit sandbox: isolation is OFF (isolation='none'): programs run with rlimits only, "
                "with network access and this user's file permissions. Use only for trusted code."
            )
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            print(msg, file=sys.stderr)
        self._root = tempfile.mkdtemp(prefix="fastcrit-sandbox-")
        os.chmod(self._root, 0o755)
        n = cfg.worker_count()
        # A uid range per pool (from our pid and a per-process counter) so that two pools never
        # share RLIMIT_NPROC counts.
        global _POOLS_STARTED
        _POOLS_STARTED += 1
        uid_base = 200000 + ((os.getpid() * 8 + _POOLS_STARTED) % 200000) * 1024
        wcfg = {
            "max_output_bytes": cfg.max_output_bytes,
            "tail_bytes": cfg.tail_bytes,
            "max_processes": cfg.max_processes,
            "max_open_files": cfg.max_open_files,
            "max_file_mb": cfg.max_file_mb,
            "max_result_bytes": cfg.max_result_bytes,
            "preimport": list(cfg.preimport),
            "jailed": cfg.isolation == "jail",
        }
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        for i in range(n):
            scratch = os.path.join(self._root, f"w{i}")
            os.mkdir(scratch, 0o755)
            wc = dict(wcfg, scratch=scratch)
            inner = jail_mod.worker_argv(json.dumps(wc))
            if cfg.isolation == "jail":
                argv = jail_mod.jailed_argv(
                    self.probe.jail, uid_base + i % 1024, scratch, cfg.scratch_mb, inner, cfg.packages
                )
            else:
                argv = inner
            self._workers.append(_WorkerProc(i, argv, scratch, env))
        try:
            await asyncio.gather(*(w.start() for w in self._workers))
        except BaseException:
            await self.close()
            raise
        self._slots = asyncio.Queue()
        for _ in range(_WorkerProc.DEPTH):
            for w in self._workers:
                self._slots.put_nowait(w)
        self._sem = asyncio.Semaphore(max(1, cfg.max_concurrency))
        self._started = True
        return self

    async def close(self):
        if self._workers:
            await asyncio.gather(*(w.close() for w in self._workers), return_exceptions=True)
            self._workers = []
        if self._root:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        self._started = False

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.close()

    @property
    def isolated(self) -> bool:
        return self.cfg.isolation == "jail" and self.probe is not None and self.probe.ok

    def _worker_pids(self) -> list[int]:
        pids = []
        for w in self._workers:
            if w.proc is None:
                continue
            if self.cfg.isolation == "jail":  # the worker is the jail's child (PID 1 inside)
                try:
                    with open(f"/proc/{w.proc.pid}/task/{w.proc.pid}/children") as f:
                        pids.append(int(f.read().split()[0]))
                except (OSError, ValueError, IndexError):
                    pass
            else:
                pids.append(w.proc.pid)
        return pids

    def worker_cpu_s(self) -> float:
        """CPU seconds used so far by the workers, every execution they forked and reaped
        (utime + stime + cutime + cstime from /proc) and their live children (the judges). The
        pool process itself is not included."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self._worker_pids():
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                kids = []
            for p, fields_used in [(pid, slice(11, 15))] + [(k, slice(11, 13)) for k in kids]:
                try:
                    with open(f"/proc/{p}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    total += sum(int(x) for x in fields[fields_used])
                except (OSError, ValueError, IndexError):
                    pass
        return total / tick

    def worker_peak_rss_mb(self) -> list[float]:
        """Peak resident memory of each worker interpreter (VmHWM), from /proc; executions are
        forks and not included."""
        out = []
        for pid in self._worker_pids():
            try:
                with open(f"/proc/{pid}/status") as f:
                    kb = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
                out.append(round(kb / 1024, 1))
            except (OSError, StopIteration, ValueError):
                pass
        return out

    def stats(self) -> dict:
        d = {
            "workers": len(self._workers),
            "executed": self.executed,
            "isolation": self.cfg.isolation,
            "worker_peak_rss_mb": self.worker_peak_rss_mb(),
        }
        if self.probe is not None:
            d["jail"] = self.probe.features
        if self.cache is not None:
            d["cache"] = self.cache.stats()
        return d

    # -- running -------------------------------------------------------------------------------

    def _as_job(self, job) -> Job:
        if isinstance(job, Job):
            return job
        if isinstance(job, dict):
            return Job.from_dict(job, defaults={"timeout_s": self.cfg.timeout_s, "memory_mb": self.cfg.memory_mb})
        raise JobError(f"a job must be a Job or a dict, got {type(job).__name__}")

    async def run(self, job: Job | dict) -> Result:
        if not self._started:
            raise RuntimeError("SandboxPool not started: use `async with SandboxPool(...) as pool`")
        job = self._as_job(job)
        t0 = time.perf_counter()
        key = None
        if self.cache is not None:
            key = job_key(job, self.cfg)
            hit = self.cache.get(key)
            if hit is not None:
                hit.id = job.id
                hit.elapsed_s = time.perf_counter() - t0
                return hit
        if not job.tests:
            return error_result(job.id, 0, "the job has no tests")
        async with self._sem:
            failures = [0]  # worker faults met; a lost worker that was replaced does not count
            for _ in range(_MAX_REQUEUES):
                worker = await self._slots.get()
                try:
                    result = await self._execute(worker, job, failures)
                finally:
                    self._slots.put_nowait(worker)
                if result is not None:
                    break
            else:
                result = error_result(
                    job.id,
                    len(job.tests),
                    f"sandbox: the job was sent again {_MAX_REQUEUES} "
                    "times and never ran (its workers kept being replaced)",
                )
        result.elapsed_s = time.perf_counter() - t0
        self.executed += 1
        if self.cache is not None:
            self.cache.put(key, result)
        return result

    async def _call_worker(self, worker: _WorkerProc, job: Job, failures: list):
        """Send ``job`` to ``worker``: its raw per-test answers and stdout/stderr tails, None when
        the worker was lost before it started (run it again), or an error Result.

        A job queued behind a worker that was lost or retired never ran: it is sent again as long
        as the worker could be replaced. When replacing failed, that counts as one of the job's
        three tries. A job the worker reports as having damaged it (``damage``: the program
        changed or broke the worker's state) is an error Result, all tests failed."""
        payload = {
            "kind": job.kind,
            "code": job.code,
            "entry_point": job.entry_point,
            "timeout_s": job.timeout_s,
            "memory_mb": job.memory_mb,
            "run_all_cases": job.run_all_cases,
        }
        secret = b""
        seal_key = b""
        if job.kind == "assert":  # the tests go to the judge only (judge.py), with the key of its messages
            seal_key = os.urandom(16)
            secret = json.dumps({"k": seal_key.hex(), "t": job.tests}, separators=(",", ":")).encode()
            payload.update(n=len(job.tests), secret=len(secret))
        elif job.kind == "stdio":  # expected outputs stay here
            payload["tests"] = [{"input": t["input"]} for t in job.tests]
        else:
            payload["tests"] = [{"args": t["args"], "kwargs": t["kwargs"]} for t in job.tests]
        n = len(job.tests)
        # The worker enforces per-test limits; this guard only catches a stuck worker (jobs queued
        # ahead of this one on the same worker get their share too).
        guard = _WorkerProc.DEPTH * (n + 1) * (job.timeout_s + 2) + 30
        generation = worker.generation
        try:
            out = await worker.call(payload, guard, secret)
        except (WorkerLost, asyncio.TimeoutError) as exc:
            ran = isinstance(exc, asyncio.TimeoutError) or exc.ran
            why = "did not answer in time" if isinstance(exc, asyncio.TimeoutError) else str(exc)
            detail = worker.stderr_tail.decode(errors="replace")[-300:]
            try:
                await worker.restart(generation)
                replaced = True
            except RuntimeError as e:  # the slot stays; the next job on it tries again
                detail += f"; restart failed: {e}"
                replaced = False
            if not ran:
                if not replaced:
                    failures[0] += 1
                if failures[0] < 3:
                    return None  # it never started: run it again
            return error_result(job.id, n, f"{why}; {detail}".strip())
        if "undecodable" in out:
            return error_result(job.id, n, f"sandbox could not read the worker's answer: {out['undecodable']}")
        if len(out.get("tests", ())) != n:
            return error_result(job.id, n, "sandbox worker returned a malformed result")
        if out.get("damage"):
            # Never cached (a job-level message): the verdict is about the worker, not the tests.
            return error_result(job.id, n, str(out["damage"]))
        for i, t in enumerate(out["tests"]):
            if seal_key:
                t["message"] = unseal(seal_key, i, str(t.get("message", "")))[:500]
            if "value_json" in t:  # a returned value, left as JSON text by the worker
                try:
                    t["value"] = json.loads(t.pop("value_json"))
                except (TypeError, ValueError, RecursionError):
                    t["status"], t["message"] = ERROR, "the returned value could not be read"
        return out

    async def _execute(self, worker: _WorkerProc, job: Job, failures: list) -> Result | None:
        # Expected outputs stay here, and assert tests go to the worker's judge only: workers fork
        # executions, and an execution can read its own memory (/proc/self/mem), so nothing it
        # could compare against may be in the worker.
        out = await self._call_worker(worker, job, failures)
        if not isinstance(out, dict):
            return out
        tests = judge(job, out["tests"])
        return summarise(
            job.id,
            tests,
            stdout=out.get("stdout", ""),
            stderr=out.get("stderr", ""),
            judged_in="judge" if job.kind == "assert" else "pool",
        )

    def stream(self, jobs: Iterable) -> AsyncIterator[tuple[int, Result]]:
        """Yield (index, result) as jobs finish (see streaming.stream_results)."""
        return stream_results(self.run, jobs)

    async def run_many(self, jobs: Iterable) -> list[Result]:
        return await run_all(self.run, jobs)


class SyncSandboxPool:
    """The same pool for synchronous scripts; owns a private uvloop event loop."""

    def __init__(self, config: SandboxConfig | None = None, **kw):
        self._loop = new_event_loop()
        self.pool = SandboxPool(config, **kw)

    def __enter__(self):
        try:
            self._loop.run_until_complete(self.pool.start())
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if not self._loop.is_closed():
            self._loop.run_until_complete(self.pool.close())
            self._loop.close()

    def run(self, job) -> Result:
        return self._loop.run_until_complete(self.pool.run(job))

    def run_many(self, jobs) -> list[Result]:
        return self._loop.run_until_complete(self.pool.run_many(jobs))

    def stats(self) -> dict:
        return self.pool.stats()


def run_jobs(jobs, config: SandboxConfig | None = None, **kw) -> list[Result]:
    """One-shot helper: start a pool, run ``jobs``, close it."""
    with SyncSandboxPool(config, **kw) as pool:
        return pool.run_many(jobs)
