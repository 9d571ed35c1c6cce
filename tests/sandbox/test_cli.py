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
        json.dumps(
            {
                "id": "ok",
                "code": "def f(x):\n    return x + 1\n",
                "kind": "call",
                "tests": [[[1], 2], [[2], 4]],
                "entry_point": "f",
            }
        ),
        "{not json",
        json.dumps({"id": "nokind", "code": "print(1)", "tests": []}),
        json.dumps({"id": "badkind", "code": "print(1)", "kind": "rust", "tests": []}),
        "",
        json.dumps(
            {"code": "print(input())", "kind": "stdio", "tests": [{"input": "x\n", "output": "x\n"}], "timeout_s": 2}
        ),
        json.dumps([1, 2, 3]),
    ]
    jobs.write_text("\n".join(lines) + "\n")
    out = tmp_path / "results.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "fastcrit.sandbox.cli",
        "sandbox",
        "run",
        str(jobs),
        "--out",
        str(out),
        "--workers",
        "2",
    ]
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
    p = subprocess.run(
        [sys.executable, "-m", "fastcrit.sandbox.cli", "sandbox", "run", str(tmp_path / "nope.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "no such file" in p.stderr


def test_no_runnable_job_is_an_error_not_an_empty_pass(tmp_path):
    """A file whose every line is skipped, or that holds no line, exits 2 naming why: exit 0 with
    an empty result file read as a run that passed."""
    for name, text, why in (
        ("bad.jsonl", "{not json\n" + json.dumps({"id": 1, "code": "x"}) + "\n", "all 2 skipped"),
        ("empty.jsonl", "\n\n", "the file holds none"),
    ):
        path = tmp_path / name
        path.write_text(text)
        out = tmp_path / (name + ".out")
        p = subprocess.run(
            [sys.executable, "-m", "fastcrit.sandbox.cli", "sandbox", "run", str(path), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2, p.stderr
        assert f"{path}: no job to run: {why}" in p.stderr
        assert not out.exists()


def test_a_problem_file_needs_the_full_cli(tmp_path):
    """The sandbox alone reads jobs; problem formats are the full CLI's (fastcrit.data)."""
    path = tmp_path / "problems.jsonl"
    path.write_text(
        json.dumps({"id": "p", "question": "q", "test_kind": "stdio", "tests": [["", "1"]], "solutions": ["print(1)"]})
        + "\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "fastcrit.sandbox.cli", "sandbox", "run", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "needs the full CLI" in p.stderr


def test_run_shows_a_progress_bar_on_a_terminal_only(tmp_path, jail_probe, on_a_terminal):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_bytes(
        "".join(
            json.dumps({"id": i, "code": f"print({i})", "kind": "stdio", "tests": [{"input": "", "output": f"{i}\n"}]})
            + "\n"
            for i in range(3)
        ).encode("utf-8-sig")
    )
    cmd = [sys.executable, "-m", "fastcrit.sandbox.cli", "sandbox", "run", str(jobs), "--workers", "1"]
    if not jail_probe.ok:
        cmd += ["--isolation", "none"]
    rc, shown = on_a_terminal(cmd)
    assert rc == 0 and "sandbox: 100%" in shown and "3/3" in shown, shown
    assert '"jobs": 3' in shown and '"all_passed": 3' in shown  # the BOM kept the first job
    rc, shown = on_a_terminal(cmd + ["--no-progress"])
    assert rc == 0 and "sandbox:" not in shown and '"jobs": 3' in shown
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # stderr a pipe: no bar
    assert p.returncode == 0 and "sandbox:" not in p.stderr and "100%" not in p.stderr


def test_a_line_that_is_not_utf8_is_reported_with_its_line(tmp_path, jail_probe):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_bytes(
        json.dumps({"id": "a", "code": "print(1)", "kind": "stdio", "tests": [{"input": "", "output": "1\n"}]}).encode()
        + b"\n"
        + b'{"id": "b", "code": "print(\'\xe9\')", "kind": "stdio", "tests": []}\n'
    )
    cmd = [sys.executable, "-m", "fastcrit.sandbox.cli", "sandbox", "run", str(jobs), "--workers", "1"]
    if not jail_probe.ok:
        cmd += ["--isolation", "none"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"{jobs}:2: skipped: not UTF-8 text (byte 0xe9 at byte 29 of the line)" in p.stderr
    assert [json.loads(line)["id"] for line in p.stdout.splitlines()] == ["a"]
