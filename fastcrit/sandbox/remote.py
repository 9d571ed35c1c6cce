"""A backend that runs jobs on a SandboxFusion server (for users who already run one).

Selected by ``SandboxConfig(backend="remote", remote_url=...)``; same async API as SandboxPool.
Standard library HTTP only (urllib in a thread pool), a concurrency cap, retries with backoff on
connection errors, HTTP 429/5xx and ``SandboxError`` answers.

Mapping onto SandboxFusion's API:
- ``stdio`` jobs -> ``POST /submit`` with ``dataset_type: CommonOJDataset`` and the tests in
  ``provided_data`` (``test: [{input: {stdin}, output: {stdout}}]``); the server compares outputs.
- ``call`` jobs -> ``POST /run_code`` per test with a driver that prints the JSON of the return
  value between random markers; the comparison happens here, so expected values never leave.
- ``assert`` jobs -> ``POST /run_code`` per test (code + test + a random end marker); a test passes
  when the run finished, the marker was printed and nothing failed.

What this backend does NOT give you: the local pool's isolation and its harness guarantees. A
remote ``assert`` pass is only as hard to fake as the server's process exit (a program that reads
its own source can print the marker); ``call`` and ``stdio`` verdicts still need the right output.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor

from .compare import values_equal
from .streaming import run_all, stream_results
from .types import (
    ERROR,
    FAILED,
    PASSED,
    SKIPPED,
    TIMEOUT,
    Job,
    Result,
    SandboxConfig,
    TestResult,
    error_result,
    summarise,
)


class RemoteError(RuntimeError):
    pass


class RemoteSandbox:
    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        url: str | None = None,
        concurrency: int | None = None,
        retries: int | None = None,
    ):
        self.cfg = config or SandboxConfig(backend="remote")
        self.url = (url or self.cfg.remote_url).rstrip("/")
        self.concurrency = concurrency or self.cfg.remote_concurrency or 1
        self.retries = self.cfg.remote_retries if retries is None else retries
        self._sem: asyncio.Semaphore | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.requests = 0
        self.retried = 0
        self.in_flight = 0
        self.max_in_flight = 0

    async def start(self):
        self._sem = asyncio.Semaphore(self.concurrency)
        self._executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="fastcrit-remote")
        return self

    async def close(self):
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.close()

    def stats(self) -> dict:
        return {
            "backend": "remote",
            "url": self.url,
            "requests": self.requests,
            "retried": self.retried,
            "max_in_flight": self.max_in_flight,
        }

    # -- HTTP ----------------------------------------------------------------------------------

    def _post_blocking(self, path: str, payload: dict, timeout_s: float) -> dict:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())

    async def _post(self, path: str, payload: dict, run_timeout_s: float) -> dict:
        loop = asyncio.get_running_loop()
        delay = 0.1
        last = None
        for attempt in range(self.retries + 1):
            async with self._sem:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                self.requests += 1
                try:
                    out = await loop.run_in_executor(
                        self._executor, self._post_blocking, path, payload, run_timeout_s + self.cfg.remote_timeout_s
                    )
                    if out.get("status") == "SandboxError":
                        raise RemoteError(f"SandboxError: {out.get('message', '')}")
                    return out
                except urllib.error.HTTPError as exc:
                    last = exc
                    if exc.code != 429 and exc.code < 500:
                        raise RemoteError(f"{path}: HTTP {exc.code} {exc.reason}") from None
                except (
                    urllib.error.URLError,
                    ConnectionError,
                    TimeoutError,
                    OSError,
                    RemoteError,
                    json.JSONDecodeError,
                ) as exc:
                    last = exc
                finally:
                    self.in_flight -= 1
            if attempt < self.retries:
                self.retried += 1
                await asyncio.sleep(delay)
                delay *= 2
        raise RemoteError(f"{path} failed after {self.retries + 1} attempts: {last!r}")

    # -- jobs ----------------------------------------------------------------------------------

    async def run(self, job: Job | dict) -> Result:
        if isinstance(job, dict):
            job = Job.from_dict(job, defaults={"timeout_s": self.cfg.timeout_s, "memory_mb": self.cfg.memory_mb})
        t0 = time.perf_counter()
        try:
            if not job.tests:
                return error_result(job.id, 0, "the job has no tests")
            if job.kind == "stdio":
                r = await self._run_stdio(job)
            else:
                r = await self._run_each(job)
        except RemoteError as exc:
            r = error_result(job.id, len(job.tests), f"remote sandbox: {exc}")
        r.elapsed_s = time.perf_counter() - t0
        r.judged_in = "remote"
        return r

    def _run_code_payload(self, job: Job, code: str) -> dict:
        return {
            "code": code,
            "language": "python",
            "run_timeout": job.timeout_s,
            "memory_limit_MB": job.memory_mb,
            "stdin": "",
            "files": {},
        }

    async def _run_each(self, job: Job) -> Result:
        tests: list[TestResult] = []
        stdout = stderr = ""
        for t in job.tests:
            if tests and tests[-1].status != PASSED and not job.run_all_cases:
                tests.append(TestResult(SKIPPED))
                continue
            marker = os.urandom(12).hex()
            if job.kind == "assert" and _checks_nothing(t):  # as the local judge: never a pass
                tests.append(TestResult(ERROR, "the test is empty (no statement): it checks nothing"))
                continue
            if job.kind == "assert":
                code = f"{job.code}\n\n{t}\n\nprint({marker!r})\n"
            else:
                code = (
                    f"{job.code}\n\nimport json as _j\n_f = globals().get({job.entry_point!r})\n"
                    f"if _f is None and 'Solution' in globals():\n    _f = getattr(Solution(), {job.entry_point!r})\n"
                    f"_r = _f(*_j.loads({json.dumps(json.dumps(t['args']))}), "
                    f"**_j.loads({json.dumps(json.dumps(t['kwargs']))}))\n"
                    f"print({marker!r} + _j.dumps(_r) + {marker!r})\n"
                )
            out = await self._post("/run_code", self._run_code_payload(job, code), job.timeout_s)
            rr = out.get("run_result") or {}
            stdout, stderr = rr.get("stdout") or "", rr.get("stderr") or ""
            rs = rr.get("status")
            if rs == "TimeLimitExceeded":
                tests.append(TestResult(TIMEOUT, "time limit exceeded"))
            elif job.kind == "assert":
                if out.get("status") == "Success" and rs == "Finished" and stdout.rstrip().endswith(marker):
                    tests.append(TestResult(PASSED))
                elif "AssertionError" in stderr:
                    tests.append(TestResult(FAILED, "AssertionError"))
                else:
                    tests.append(TestResult(ERROR, (stderr.strip().splitlines() or [str(rs)])[-1][:500]))
            else:
                parts = stdout.split(marker)
                if out.get("status") == "Success" and rs == "Finished" and len(parts) == 3:
                    try:
                        value = json.loads(parts[1])
                    except (ValueError, RecursionError):  # RecursionError: nested past our stack
                        tests.append(TestResult(ERROR, "unparseable return value"))
                        continue
                    ok = values_equal(value, t["expected"])
                    tests.append(TestResult(PASSED) if ok else TestResult(FAILED, f"returned {parts[1][:200]}"))
                else:
                    tests.append(TestResult(ERROR, (stderr.strip().splitlines() or [str(rs)])[-1][:500]))
        return summarise(job.id, tests, stdout=stdout[-self.cfg.tail_bytes :], stderr=stderr[-self.cfg.tail_bytes :])

    async def _run_stdio(self, job: Job) -> Result:
        payload = {
            "dataset": "fastcrit",
            "id": str(job.id),
            "completion": f"```python\n{job.code}\n```",
            "config": {
                "dataset_type": "CommonOJDataset",
                "language": "python",
                "run_timeout": job.timeout_s,
                "provided_data": {
                    "id": str(job.id),
                    "content": "",
                    "test": [{"input": {"stdin": t["input"]}, "output": {"stdout": t["output"]}} for t in job.tests],
                },
                "extra": {"run_all_cases": job.run_all_cases},
            },
        }
        out = await self._post("/submit", payload, job.timeout_s * len(job.tests))
        rtests = out.get("tests")
        if not isinstance(rtests, list):
            raise RemoteError("/submit answer has no 'tests' list")
        tests = []
        for t in rtests[: len(job.tests)]:
            info = t.get("exec_info") or {}
            rr = info.get("run_result") or {}
            if t.get("passed"):
                tests.append(TestResult(PASSED))
            elif rr.get("status") == "TimeLimitExceeded":
                tests.append(TestResult(TIMEOUT, "time limit exceeded"))
            elif rr.get("status") == "Finished" and rr.get("return_code", 0) == 0:
                tests.append(TestResult(FAILED, "wrong answer"))
            else:
                tests.append(TestResult(ERROR, ((rr.get("stderr") or "").strip().splitlines() or ["error"])[-1][:500]))
        while len(tests) < len(job.tests):  # the server stopped early (run_all_cases false)
            tests.append(TestResult(SKIPPED))
        return summarise(job.id, tests)

    def stream(self, jobs: Iterable) -> AsyncIterator[tuple[int, Result]]:
        """Yield (index, result) as jobs finish (see streaming.stream_results)."""
        return stream_results(self.run, jobs)

    async def run_many(self, jobs: Iterable) -> list[Result]:
        return await run_all(self.run, jobs)


def _checks_nothing(source: str) -> bool:
    """A test with no statement (blank, comments only), which any program that loads would pass."""
    import ast

    try:
        return not ast.parse(source).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False  # the server reports it
