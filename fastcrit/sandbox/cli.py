"""``fastcrit sandbox run JOBS.jsonl [--out RESULTS.jsonl] [--workers N]`` and ``fastcrit sandbox bench``.

The trainer's CLI calls ``register(subparsers)``; ``python -m fastcrit.sandbox.cli ...`` works alone.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .types import Job, JobError, SandboxConfig


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("sandbox", help="run untrusted code against tests (see docs/sandbox.md)")
    sub = p.add_subparsers(dest="sandbox_cmd", required=True)

    r = sub.add_parser("run", help="run the jobs of a JSONL file, one result per line")
    r.add_argument("jobs", help="JSONL: one job per line (id, code, kind, tests, entry_point, timeout_s, memory_mb)")
    r.add_argument("--out", help="write results here (JSONL) instead of stdout")
    r.add_argument("--workers", type=int, default=0, help="warm workers (default: number of CPUs)")
    r.add_argument("--isolation", choices=("jail", "none"), default="jail",
                   help="'none' runs without the jail: trusted code only")
    r.add_argument("--cache", default=None, help="sqlite result cache file (default: no cache)")
    r.add_argument("--timeout", type=float, default=None, help="default per-test timeout for jobs without one")
    r.add_argument("--memory-mb", type=int, default=None, help="default memory limit for jobs without one")
    r.add_argument("--max-concurrency", type=int, default=256)
    r.add_argument("--remote", default=None, help="URL of a SandboxFusion server to use instead of local workers")
    r.set_defaults(func=cmd_run)

    b = sub.add_parser("bench", help="executions per second on HumanEval's canonical solutions")
    b.add_argument("--workers", type=int, default=0)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--isolation", choices=("jail", "none"), default="jail")
    b.set_defaults(func=cmd_bench)
    return p


def read_jobs(path: str, defaults: dict, errors: list) -> list[Job]:
    """Valid jobs of a JSONL file; each bad line is recorded as (line number, message) and skipped."""
    jobs = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError as exc:
                errors.append((lineno, f"not valid JSON ({exc})"))
                continue
            try:
                job = Job.from_dict(d, defaults=defaults)
            except (JobError, TypeError) as exc:
                errors.append((lineno, str(exc)))
                continue
            if job.id is None:
                job.id = lineno
            jobs.append(job)
    return jobs


def cmd_run(args) -> int:
    cfg = SandboxConfig(workers=args.workers, isolation=args.isolation, cache_path=args.cache,
                        max_concurrency=args.max_concurrency,
                        backend="remote" if args.remote else "local",
                        remote_url=args.remote or SandboxConfig.remote_url)
    defaults = {"timeout_s": args.timeout or cfg.timeout_s, "memory_mb": args.memory_mb or cfg.memory_mb}
    if not os.path.exists(args.jobs):
        print(f"fastcrit sandbox run: {args.jobs}: no such file", file=sys.stderr)
        return 2
    errors: list = []
    jobs = read_jobs(args.jobs, defaults, errors)
    for lineno, msg in errors:
        print(f"{args.jobs}:{lineno}: skipped: {msg}", file=sys.stderr)
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    from . import make_pool
    from .pool import new_event_loop

    async def go():
        n_pass = 0
        rate_sum = 0.0
        t0 = time.perf_counter()
        pool = make_pool(cfg)
        async with pool:
            async for _, r in pool.stream(jobs):
                out.write(json.dumps(r.to_dict()) + "\n")
                out.flush()
                n_pass += r.all_passed
                rate_sum += r.pass_rate
            stats = pool.stats()
        dt = time.perf_counter() - t0
        summary = {"jobs": len(jobs), "all_passed": n_pass, "mean_pass_rate": rate_sum / len(jobs) if jobs else 0.0,
                   "skipped_lines": len(errors), "seconds": round(dt, 3),
                   "jobs_per_s": round(len(jobs) / dt, 1) if dt > 0 else None}
        if "cache" in stats:
            summary["cache_hit_rate"] = stats["cache"]["hit_rate"]
        print("fastcrit sandbox run: " + json.dumps(summary), file=sys.stderr)

    loop = new_event_loop()
    try:
        loop.run_until_complete(go())
    finally:
        loop.close()
        if args.out:
            out.close()
    return 0


def cmd_bench(args) -> int:
    from .bench import bench_pool, humaneval_jobs, humaneval_problems

    try:
        jobs = humaneval_jobs(humaneval_problems())
    except RuntimeError as exc:
        print(f"fastcrit sandbox bench: {exc}", file=sys.stderr)
        return 2
    workers = args.workers or os.cpu_count() or 1
    res = bench_pool(jobs, workers=workers, repeats=args.repeats, isolation=args.isolation)
    print(json.dumps({"workers": workers, "jobs": len(jobs), "exec_per_s": res["exec_per_s"],
                      "passed": res["passed"], "isolation": args.isolation}))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastcrit")
    sub = parser.add_subparsers(dest="cmd", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
