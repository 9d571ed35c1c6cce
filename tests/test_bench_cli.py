"""`fastcrit bench`: the parser, the report builder on a hand-written CSV, the CSV writer's header
rule, and one real (cheapest) part run end to end in a subprocess. No timing is asserted."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastcrit.bench_cli import latest_run, markdown_table, update_readme
from fastcrit.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = ("machine", "device", "commit", "settings", "repeats", "median", "spread")


def test_parser_knows_the_parts():
    for part in ("rollout", "train", "e2e", "kernels", "sandbox", "all"):
        a = build_parser().parse_args(["bench", part, "--quick", "--threads", "1"])
        assert (a.part, a.quick, a.threads) == (part, True, 1)
    assert build_parser().parse_args(["bench", "kernels"]).quick is False


def test_parser_rejects_an_unknown_part(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["bench", "kernel"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'kernel'" in err and "kernels" in err and "sandbox" in err


def test_only_must_name_a_script_of_the_part(capsys):
    args = build_parser().parse_args(["bench", "rollout", "--only", "kl", "--out", "unused"])
    assert args.func(args) == 2
    assert "--only kl: not in part 'rollout' (its scripts: generate)" in capsys.readouterr().err


CSV_TEXT = """bench,variant,ms,commit,settings,metric,median,q20,q80,spread,repeats,machine,device,run
kl,old,9.0,aaa,B=1,ms,9.0,8.0,10.0,2.0,3,"m, 2 cpus",cpu,R1
kl,eager_torch,1.0,bbb,B=8 T=512,ms,1.25,1.0,1.5,0.5,3,"m, 2 cpus",cpu,R2
kl,fastcrit_torch,1.0,bbb,B=8 T=512,ms,0.123456,0.1,0.2,0.1,3,"m, 2 cpus",cpu,R2
"""


def test_report_table_from_a_hand_written_csv(tmp_path):
    p = tmp_path / "bench_kl.csv"
    p.write_text(CSV_TEXT)
    with open(p, newline="") as f:
        rows = latest_run(list(csv.DictReader(f)))
    assert [r["variant"] for r in rows] == ["eager_torch", "fastcrit_torch"]  # run R1 left out
    assert markdown_table(rows) == (
        "| bench | variant | settings | metric | median | spread | repeats | device | commit | machine |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
        "| kl | eager_torch | B=8 T=512 | ms | 1.25 | 0.5 | 3 | cpu | bbb | m, 2 cpus |\n"
        "| kl | fastcrit_torch | B=8 T=512 | ms | 0.1235 | 0.1 | 3 | cpu | bbb | m, 2 cpus |\n"
    )


def test_latest_run_of_rows_without_run_ids_is_the_last_commit_block():
    rows = [{"commit": "a", "v": 1}, {"commit": "b", "v": 2}, {"commit": "b", "v": 3}]
    assert [r["v"] for r in latest_run(rows)] == [2, 3]


def test_readme_table_goes_between_the_markers(tmp_path):
    p = tmp_path / "README.md"
    p.write_text("intro\n<!-- bench-table:start -->\nold\n<!-- bench-table:end -->\nafter\n")
    assert update_readme(p, "| new |\n")
    assert p.read_text() == "intro\n<!-- bench-table:start -->\n| new |\n<!-- bench-table:end -->\nafter\n"
    q = tmp_path / "NOMARKS.md"
    q.write_text("nothing\n")
    assert not update_readme(q, "x") and q.read_text() == "nothing\n"


def test_new_columns_rewrite_the_header_and_keep_old_rows(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _common import append_csv
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    p = tmp_path / "x.csv"
    append_csv(str(p), [{"a": 1, "b": 2}])
    append_csv(str(p), [{"a": 3, "b": 4}])
    append_csv(str(p), [{"a": 5, "b": 6, "median": 7}])
    with open(p, newline="") as f:
        r = csv.reader(f)
        assert list(r) == [["a", "b", "median"], ["1", "2", ""], ["3", "4", ""], ["5", "6", "7"]]


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set from /proc (Linux)")
@pytest.mark.parametrize("kernel_peak", [True, False])
def test_timed_cpu_peak_counts_a_buffer_freed_before_it_returns(monkeypatch, kernel_peak):
    """The peak of a call whose 64 MiB buffer is gone by the time it returns: the kernel's
    high-water mark (reset before the call) and, where the reset is refused, the sampling thread."""
    import time

    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _common
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import fastcrit.train.memory as memory

    if not kernel_peak:
        monkeypatch.setattr(memory, "reset_rss_peak", lambda: False)
    elif not memory.reset_rss_peak():
        pytest.skip("this kernel refuses /proc/self/clear_refs")

    def fn():
        x = torch.ones(16 << 20)  # 64 MiB, every page written
        time.sleep(0.05)  # long enough for the sampler's 0.2 ms period
        del x

    seconds, peak = _common._timed(fn, torch.device("cpu"))
    assert seconds >= 0.05
    assert 60 << 20 <= peak < 200 << 20, peak
    assert _common._timed(fn, torch.device("cpu"), memory=False)[1] == 0


def test_cheapest_real_part_writes_a_full_row_and_ends_with_json(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastcrit.cli",
            "bench",
            "kernels",
            "--quick",
            "--only",
            "kl",
            "--threads",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["failures"] == [] and summary["parts"] == ["kernels"]
    assert summary["scripts"][0]["name"] == "kl" and summary["rows_written"] == 2
    assert summary["report"] == str(tmp_path / "report.md") and summary["readme"] is None
    with open(tmp_path / "bench_kl.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for r in rows:
        assert all(r.get(k) not in (None, "") for k in REQUIRED), r
        assert float(r["spread"]) >= 0 and int(r["repeats"]) == 3
    assert "| kl | eager_torch | B=8 T=512 dtype=float32 | ms |" in (tmp_path / "report.md").read_text()


def test_trl_bench_without_a_trl_python_writes_nothing_and_says_why(tmp_path):
    """bench_trl.py needs a Python with trl (make trl-venv); without one the part reports a skip
    with the way out instead of failing or writing rows."""
    env = {k: v for k, v in os.environ.items() if k != "FASTCRIT_TRL_PYTHON"}
    env.update(OMP_NUM_THREADS="1", FASTCRIT_BENCH_RESULTS=str(tmp_path))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_trl
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert bench_trl.peer_python(str(tmp_path / "no-python")) in (None, str(ROOT / ".venv-trl" / "bin" / "python"))
    if (ROOT / ".venv-trl").exists():
        pytest.skip("this checkout has .venv-trl: the bench would run TRL")
    proc = subprocess.run(
        [sys.executable, "-m", "fastcrit.cli", "bench", "e2e", "--only", "trl", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["rows_written"] == 0 and "make trl-venv" in summary["scripts"][0]["skipped"]
    assert not (tmp_path / "bench_trl.csv").exists()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bench_ppo_checks_every_case_against_naive(dtype):
    """bench_ppo's agreement round: every fused case of the real loss lies within the tolerance
    of naive's loss and gradients, and a case whose d_weight is 10% off (as a wrong kernel's would
    be) does not."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_ppo
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    dt = getattr(torch, dtype)
    cases = bench_ppo.lm_cases(64, 32, 257, torch.device("cpu"), "torch", (1,), dt)
    fused = cases["fused_gif"]

    def off_by_ten_percent(keep=False):
        out = fused(keep)
        return None if out is None else (out[0], out[1], out[2] * 1.1)

    cases["broken"] = off_by_ten_percent
    errs = bench_ppo.agreement(cases, dt)
    tol = bench_ppo.AGREE_TOL[dt]
    assert "gemm3" not in errs and errs["naive"] == 0.0
    assert {"fused_recompute", "fused_gif", "fused_gif_entropy", "fused_gif_1MiB"} <= set(errs)
    assert all(e < tol / 3 for k, e in errs.items() if k != "broken"), errs
    assert errs["broken"] > tol


def _fake_checkout(tmp_path, monkeypatch):
    """A benchmarks/ with a README holding a table, a published CSV and report; running a script
    appends one row (run id from the environment, as the real scripts do) to its CSV."""
    import fastcrit.bench_cli as bench_cli

    bdir = tmp_path / "benchmarks"
    (bdir / "results").mkdir(parents=True)
    (bdir / "README.md").write_text("intro\n<!-- bench-table:start -->\npublished\n<!-- bench-table:end -->\n")
    (bdir / "results" / "bench_kl.csv").write_text(CSV_TEXT)
    (bdir / "results" / "report.md").write_text("published report\n")

    def fake_run(s, bdir_, results, quick, threads, env):
        new = not (results / s.csv).exists()
        with open(results / s.csv, "a", newline="") as f:
            f.write(CSV_TEXT.splitlines(keepends=True)[0] if new else "")
            f.write(f"kl,eager_torch,1.0,ccc,B=8 quick,ms,7.5,7,8,1,3,m,cpu,{env['FASTCRIT_BENCH_RUN']}\n")
        return {"name": s.name, "cmd": s.file, "rc": 0, "seconds": 0.0, "rows": 1}

    monkeypatch.setattr(bench_cli, "bench_dir", lambda: bdir)
    monkeypatch.setattr(bench_cli, "run_script", fake_run)
    monkeypatch.setattr(bench_cli, "plot", lambda rows, title, path: False)
    return bdir


def test_a_quick_run_leaves_the_published_tables_alone(tmp_path, monkeypatch, capsys):
    """`fastcrit bench kernels --quick` writes under results/quick/, its report labelled quick;
    benchmarks/README.md, results/report.md and the published CSVs keep their full-run figures."""
    bdir = _fake_checkout(tmp_path, monkeypatch)
    tracked = {
        p: p.read_text() for p in (bdir / "README.md", bdir / "results/report.md", bdir / "results/bench_kl.csv")
    }
    args = build_parser().parse_args(["bench", "kernels", "--quick", "--only", "kl"])
    assert args.func(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {p: p.read_text() for p in tracked} == tracked
    quick = bdir / "results" / "quick"
    assert summary["readme"] is None and summary["report"] == str(quick / "report.md")
    report = (quick / "report.md").read_text()
    assert "**Quick run**" in report and "| kl | eager_torch | B=8 quick | ms | 7.5 |" in report
    assert "`benchmarks/results/quick`" in report

    # a full run still publishes: the README table and report.md get its rows, with no quick label
    args = build_parser().parse_args(["bench", "kernels", "--only", "kl"])
    assert args.func(args) == 0
    readme = (bdir / "README.md").read_text()
    assert "published" not in readme.split("bench-table:start")[1] and "| B=8 quick |" in readme
    assert "Quick run" not in (bdir / "results/report.md").read_text()
