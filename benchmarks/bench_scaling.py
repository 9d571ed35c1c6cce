"""Scaling: time and peak memory of log-probs from hidden states x lm_head, fused against naive,
as the response length and the vocabulary grow.

Run alone: ``python benchmarks/bench_scaling.py [--quick] [--repeats R]``. Two sweeps, H=896, fp32,
forward + backward, each case in a fresh process (bench_fused_logprobs.py's worker: peak = growth of
VmHWM after clear_refs, gradients included; wall time median and 0.2 / 0.8 quantiles over R runs):
- tokens (the response length of one sequence's worth of rows) in 256 .. 4096 at V = 32768;
- vocabulary V in 8192 .. 131072 at 1024 tokens.
``naive`` materialises the [tokens, V] logits (and their gradient); ``ours`` is
``fastcrit_kernels.fused_logprobs`` (chunks of tokens, logits never whole), so its working memory
should stay flat where naive's grows with tokens x V. Appends rows to <results>/bench_scaling.csv
(``sweep`` = tokens or vocab), draws bench_scaling_sweeps.png (time and memory against each axis) and
prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import results_dir, write_rows

NAME = "scaling"
IMPLS = ("naive", "ours")


def sweep(tokens: list[int], vocab: int, repeats: int) -> list[dict]:
    import bench_fused_logprobs as bfl

    out = bfl.main(
        [
            "--tokens",
            ",".join(map(str, tokens)),
            "--vocab",
            str(vocab),
            "--impls",
            ",".join(IMPLS),
            "--repeats",
            str(repeats),
            "--device",
            "cpu",
            "--no-csv",
            "--no-plot",
        ]
    )
    return [dict(r, V=vocab) for r in out["rows"]]


def plot(rows: list[dict], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for col, (axis, label) in enumerate((("tokens", "tokens (V = 32768)"), ("V", "vocabulary V (1024 tokens)"))):
        pts = [r for r in rows if r["sweep"] == ("tokens" if axis == "tokens" else "vocab") and "error" not in r]
        for impl in IMPLS:
            xs = sorted((r[axis], r) for r in pts if r["impl"] == impl)
            if not xs:
                continue
            axes[0][col].plot([x for x, _ in xs], [r["ms_p50"] / 1e3 for _, r in xs], marker="o", label=impl)
            axes[1][col].plot([x for x, _ in xs], [r["work_mb"] / 1024 for _, r in xs], marker="o", label=impl)
        for row, ylabel in enumerate(("fwd+bwd wall time, s", "working memory, GiB (peak - gradients)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel(label)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend()
    fig.suptitle("log-probs from hidden states x lm_head, H=896, fp32, CPU: fused (ours) vs full logits (naive)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="three points per sweep, 1 repeat")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per case (default 2; quick 1)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in each case (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    repeats = args.repeats or (1 if args.quick else 2)
    tokens = [256, 1024, 4096] if args.quick else [256, 512, 1024, 2048, 4096]
    vocabs = [8192, 32768, 131072] if args.quick else [8192, 16384, 32768, 65536, 131072]
    rows = [dict(r, sweep="tokens") for r in sweep(tokens, 32768, repeats)]
    for v in vocabs:
        rows += [dict(r, sweep="vocab") for r in sweep([1024], v, repeats)]
    for r in rows:
        r.update(bench=NAME, variant=r["impl"], H=896, dtype="fp32")
    good = [r for r in rows if "error" not in r]
    out = write_rows(
        good,
        NAME,
        settings=("sweep", "tokens", "V", "H", "dtype"),
        repeats=repeats,
        median="ms_p50",
        q20="ms_p20",
        q80="ms_p80",
    )
    png = plot(rows, os.path.join(results_dir(), "bench_scaling_sweeps.png"))
    for r in rows:
        print(
            f"{r['sweep']:6s} {r['impl']:5s} tokens={r['tokens']:5d} V={r['V']:6d} "
            + (f"{r['ms_p50']:9.1f} ms  work {r['work_mb']:8.1f} MB" if "error" not in r else r["error"][-200:]),
            file=sys.stderr,
        )
    print(
        json.dumps({"bench": NAME, "csv": out, "png": png, "rows": rows, "errors": [r for r in rows if "error" in r]})
    )


if __name__ == "__main__":
    main()
