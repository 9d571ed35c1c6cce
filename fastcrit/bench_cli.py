"""`fastcrit bench PART [--quick]`: one entry point over the scripts in the checkout's benchmarks/.

Each part names scripts that also run alone (``python benchmarks/bench_<thing>.py``); this module
runs them as subprocesses (benchmarks/ is not an installed package: it needs a source checkout),
counts the CSV rows each one appended, then writes a Markdown report with one table per CSV (the
rows of its latest run) and a PNG per CSV (matplotlib, the ``bench`` extra; without it the report
says there are no plots). A ``--quick`` run writes all that under results/quick/ (git ignores it),
labelled quick, and leaves the published CSVs, report and README tables alone. The last line
printed to stdout is one JSON object: parts, scripts, rows written, report path, wall time, failures.
Torch-free: the scripts import torch, not this.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Script:
    """One benchmark script run by a part."""

    name: str  # what ``--only`` selects
    file: str  # under benchmarks/
    csv: str  # the file it appends to, under the results directory
    args: tuple[str, ...] = ()  # always passed
    quick: tuple[str, ...] = ("--quick",)  # passed with --quick
    threads: bool = True  # takes --threads N


PARTS: dict[str, tuple[Script, ...]] = {
    "kernels": (
        # 256 tokens of Qwen2.5-0.5B's lm_head, ours vs the full-logits baseline: a few seconds a case
        Script(
            "fused_logprobs",
            "bench_fused_logprobs.py",
            "fused_logprobs.csv",
            quick=("--tokens", "256", "--repeats", "2", "--impls", "naive,ours"),
            threads=False,
        ),
        Script("kl", "bench_kl.py", "bench_kl.csv"),
        Script("advantages", "bench_advantages.py", "bench_advantages.csv"),
        Script("ppo", "bench_ppo.py", "bench_ppo.csv"),
        Script("pacs", "bench_pacs.py", "bench_pacs.csv"),
        # fused vs naive log-probs as the response length and the vocabulary grow (+ bench_scaling_sweeps.png)
        Script("scaling", "bench_scaling.py", "bench_scaling.csv"),
    ),
    "rollout": (Script("generate", "bench_generate.py", "bench_generate.csv"),),
    "sandbox": (
        Script(
            "sandbox",
            "bench_sandbox.py",
            "bench_sandbox.csv",
            args=("--repeats", "5"),
            quick=("--repeats", "2"),
            threads=False,
        ),
    ),
    "train": (
        Script("train", "bench_train.py", "bench_train.csv"),
        Script("balance", "bench_balance.py", "bench_balance.csv", threads=False),
    ),
    "e2e": (
        Script("e2e", "bench_train.py", "bench_e2e.csv", args=("--e2e",)),
        # against TRL's GRPOTrainer, in the Python of `make trl-venv` (skipped, saying so, without one)
        Script("trl", "bench_trl.py", "bench_trl.csv"),
    ),
}
CHOICES = (*PARTS, "all")
TABLE_COLUMNS = ("bench", "variant", "settings", "metric", "median", "spread", "repeats", "device", "commit", "machine")
README_START, README_END = "<!-- bench-table:start -->", "<!-- bench-table:end -->"
QUICK_DIR = "quick"  # under the results directory: where a --quick run writes by default


class BenchError(RuntimeError):
    pass


def bench_dir() -> Path:
    """The checkout's benchmarks/ directory, or a BenchError naming what is missing."""
    d = Path(__file__).resolve().parents[1] / "benchmarks"
    if not (d / "_common.py").is_file():
        raise BenchError(
            f"`fastcrit bench` runs the scripts of a source checkout, and {d} holds none "
            f"(benchmarks/_common.py missing: fastcrit installed from a wheel?). Clone the "
            f"repository and `pip install -e '.[bench]'` there."
        )
    return d


def select(part: str, only: list[str] | None = None) -> list[Script]:
    scripts = [s for p in (PARTS if part == "all" else (part,)) for s in PARTS[p]]
    if only:
        known = {s.name for s in scripts}
        unknown = sorted(set(only) - known)
        if unknown:
            raise BenchError(
                f"--only {','.join(unknown)}: not in part {part!r} (its scripts: {', '.join(sorted(known))})"
            )
        scripts = [s for s in scripts if s.name in only]
    return scripts


# ------------------------------------------------------------------------------------------ reading


def read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def latest_run(rows: list[dict]) -> list[dict]:
    """The rows of the newest run: those sharing the last row's ``run`` id; rows written before the
    ``run`` column existed: the trailing block with the last row's commit."""
    if not rows:
        return []
    last = rows[-1]
    if last.get("run"):
        return [r for r in rows if r.get("run") == last["run"]]
    out = []
    for r in reversed(rows):
        if r.get("run") or r.get("commit") != last.get("commit"):
            break
        out.append(r)
    return out[::-1]


def _cell(v) -> str:
    if v is None or v == "":
        return ""
    try:
        x = float(v)
    except ValueError:
        return str(v).replace("|", "/")
    return str(int(x)) if x.is_integer() and abs(x) < 1e12 else f"{x:.4g}"


def markdown_table(rows: list[dict], columns=TABLE_COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], title: str, path: Path) -> bool:
    """Horizontal bars: the median of each row, whiskers from q20 to q80. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pts = [r for r in rows if r.get("median")]
    if not pts:
        return False
    med = [float(r["median"]) for r in pts]
    lo = [max(m - float(r["q20"]), 0) if r.get("q20") else 0 for m, r in zip(med, pts)]
    hi = [max(float(r["q80"]) - m, 0) if r.get("q80") else 0 for m, r in zip(med, pts)]
    labels = [f"{r.get('bench', '')} {r.get('variant', '')}\n{r.get('settings', '')}" for r in pts]
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.45 * len(pts)))
    ax.barh(range(len(pts)), med, xerr=[lo, hi], capsize=3, color="#4c72b0")
    ax.set_yticks(range(len(pts)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"{pts[0].get('metric', '')} (median; whiskers q20..q80)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


QUICK_NOTE = (
    "**Quick run** (`--quick`: small shapes, few repeats): a smoke test of the scripts, not figures to "
    "quote; the published tables (benchmarks/README.md, results/report.md) come from full runs.\n"
)


def build_report(
    results: Path, out: Path, plots: bool = True, label: str | None = None, quick: bool = False
) -> tuple[str, list[str]]:
    """Markdown with, per part and CSV, the latest run's rows as a table (and its PNG, drawn into
    ``out``); returns (markdown, PNG paths). ``quick``: the report says so at the top."""
    sections, pngs, have_mpl = [], [], True
    seen = set()
    for part, scripts in PARTS.items():
        for s in scripts:
            if s.csv in seen:
                continue
            seen.add(s.csv)
            rows = latest_run(read_csv(results / s.csv))
            sections.append(f"### {part}: {s.csv}\n")
            if not rows:
                sections.append(f"No rows yet: `fastcrit bench {part}` writes them.\n")
                continue
            r0 = rows[-1]
            sections.append(
                f"Latest run {r0.get('run') or '(before run ids)'}, commit {r0.get('commit', '')}, "
                f"{len(rows)} rows.\n\n" + markdown_table(rows)
            )
            if plots:
                png = out / (Path(s.csv).stem + ".png")
                if plot(rows, f"{s.csv}: run {r0.get('run', '')}, commit {r0.get('commit', '')}", png):
                    pngs.append(str(png))
                    sections.append(f"\n![{s.csv}]({png.name})\n")
                elif rows[0].get("median"):  # figures to draw, yet no plot: matplotlib is missing
                    have_mpl = False
    head = [
        "# Benchmark report\n",
        f"Written {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} from the CSVs in "
        f"`{label or results}` by `fastcrit bench`. median / spread: the median and q80 - q20 of `metric` over "
        f"`repeats`; see benchmarks/README.md.\n",
    ]
    if quick:
        head.append(QUICK_NOTE)
    if plots and not have_mpl:
        head.append("No plots: matplotlib is not installed (`pip install -e '.[bench]'`).\n")
    return "\n".join(head + sections), pngs


def update_readme(readme: Path, tables: str) -> bool:
    """Replace the text between the README's markers with ``tables``; False when the markers are missing."""
    if not readme.is_file():
        return False
    text = readme.read_text()
    a, b = text.find(README_START), text.find(README_END)
    if a < 0 or b < a:
        return False
    readme.write_text(text[: a + len(README_START)] + "\n" + tables.strip() + "\n" + text[b:])
    return True


# ------------------------------------------------------------------------------------------ running


def run_script(s: Script, bdir: Path, results: Path, quick: bool, threads: int | None, env: dict) -> dict:
    cmd = [sys.executable, str(bdir / s.file), *s.args, *(s.quick if quick else ())]
    if threads and s.threads:
        cmd += ["--threads", str(threads)]
    before = len(read_csv(results / s.csv))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=bdir.parent, env=env, capture_output=True, text=True)
    out = {
        "name": s.name,
        "cmd": " ".join(cmd[1:]),
        "rc": proc.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": len(read_csv(results / s.csv)) - before,
    }
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    try:
        summary = json.loads(last[0])
        if isinstance(summary, dict) and summary.get("skipped"):
            out["skipped"] = summary["skipped"]
    except ValueError:
        if proc.returncode == 0:
            out["rc"] = -1
            out["error"] = "last stdout line is not JSON"
    if out["rc"] != 0:
        out["error"] = (out.get("error", "") + " " + proc.stderr.strip()[-600:]).strip()
    return out


def cmd_bench(args) -> int:
    t0 = time.perf_counter()
    try:
        bdir = bench_dir()
        scripts = [] if args.report_only else select(args.part, args.only.split(",") if args.only else None)
    except BenchError as e:
        print(f"fastcrit bench: {e}", file=sys.stderr)
        return 2
    default_results = bdir / "results"
    # A quick run (small shapes, few repeats) must not stand in for the published figures: its
    # rows would become the "latest run" of the tracked CSVs, so report.md and the README tables
    # would show them (and a later --report-only too). So by default it writes its CSVs, report and
    # PNGs under results/quick/ (git ignores it), its report labelled quick, and never touches
    # benchmarks/README.md: after a smoke run `git status` stays clean and the figures stay full-run ones.
    if args.out:
        results = Path(args.out).resolve()
    else:
        results = default_results / QUICK_DIR if args.quick else default_results
    results.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        FASTCRIT_BENCH_RESULTS=str(results),
        FASTCRIT_BENCH_RUN=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    from tqdm import tqdm

    done = []
    # disable=None: no bar when stderr is not a terminal (as every fastcrit bar)
    bar = tqdm(scripts, desc="bench", unit="script", file=sys.stderr, disable=None if scripts else True)
    for s in bar:
        bar.set_postfix_str(s.name)
        done.append(run_script(s, bdir, results, args.quick, args.threads, env))
    bar.close()
    inside = results.is_relative_to(bdir.parent)
    label = os.path.relpath(results, bdir.parent) if inside else str(results)
    md, pngs = build_report(results, results, label=label, quick=args.quick)
    report = results / "report.md"
    report.write_text(md)
    readme = None
    # the README sits one level above results/: its image links get the folder
    if (
        not args.quick
        and results == default_results
        and update_readme(bdir / "README.md", md.split("\n", 1)[1].replace("](", "](results/"))
    ):
        readme = str(bdir / "README.md")
    failures = [{k: d[k] for k in ("name", "rc", "error")} for d in done if d["rc"] != 0]
    print(
        json.dumps(
            {
                "parts": [args.part] if not args.report_only else [],
                "quick": args.quick,
                "scripts": [{k: d[k] for k in ("name", "rc", "rows", "seconds", "skipped") if k in d} for d in done],
                "rows_written": sum(max(d["rows"], 0) for d in done),
                "results": str(results),
                "report": str(report),
                "plots": pngs,
                "readme": readme,
                "wall_s": round(time.perf_counter() - t0, 1),
                "failures": failures,
            }
        )
    )
    return 1 if failures else 0


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench", help="run the benchmarks of a source checkout; CSV rows, a report, plots")
    p.add_argument(
        "part",
        choices=CHOICES,
        help="which part: " + ", ".join(f"{k} ({', '.join(s.name for s in v)})" for k, v in PARTS.items()) + ", or all",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small settings, few repeats (all: minutes on 2 cores); writes under benchmarks/results/quick/ "
        "(report labelled quick), never the published CSVs, report or README tables",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for every script (OMP_NUM_THREADS and --threads where taken)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="results directory for the CSVs, report.md and PNGs (default: benchmarks/results, "
        "benchmarks/results/quick with --quick; only a full run into benchmarks/results updates the "
        "tables in benchmarks/README.md)",
    )
    p.add_argument("--only", default=None, help="comma list of script names within the part, e.g. kl,ppo")
    p.add_argument("--report-only", action="store_true", help="run nothing; rewrite the report from the CSVs")
    p.set_defaults(func=cmd_bench)
    return p
