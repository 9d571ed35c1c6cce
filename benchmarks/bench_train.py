"""GRPO step time by phase: a short ``fastcrit train`` of configs/cpu/grpo.yaml, timed by the trainer.

Run alone: ``python benchmarks/bench_train.py [--quick] [--threads N] [--steps S] [--e2e]``.
Trains S GRPO steps (no SFT warm start, no checkpoints but the final one, a small final evaluation)
in a temporary directory and reads the trainer's own ``time/<phase>_s`` metrics from its
metrics.jsonl: rollout (generation), reward, ref (reference log-probs), update (the optimizer
steps), sync (weights into the engine) and step (the whole step). The first ``--warmup`` steps are
dropped (they pay for lazy initialisation). One row per phase: median, q20, q80 over the remaining
steps, in ms, plus the step's tokens/s. ``--e2e`` writes only the whole-step row, as bench ``e2e``.

What it does NOT cover: a comparison with another trainer on the same config -- bench_trl.py runs
TRL's GRPOTrainer side by side; the SFT warm start; evaluation and checkpoint time (outside
the step). Appends rows to <results>/bench_train.csv (or bench_e2e.csv) and prints one JSON object
as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _common import write_rows

CONFIG = os.path.join(ROOT, "configs", "cpu", "grpo.yaml")
PHASES = ("rollout", "reward", "ref", "update", "sync", "step")
PEER = "none here: bench_trl.py measures TRL's GRPOTrainer side by side"


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (the same rule as torch.quantile / numpy's default)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def train(steps: int, threads: int, workdir: str) -> list[dict]:
    """Run ``fastcrit train`` for ``steps`` steps into ``workdir``; the metrics.jsonl rows."""
    sets = {
        "trainer.total_steps": steps,
        "sft.steps": 0,
        "trainer.output_dir": workdir,
        "trainer.save_every": 0,
        "trainer.eval_every": 0,
        "data.val_size": 8,
        "trainer.compute_threads": threads,
    }
    cmd = [sys.executable, "-m", "fastcrit.cli", "train", CONFIG]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"bench_train: `fastcrit train` failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 steps (3 timed) instead of 12 (10 timed)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (overrides --quick)")
    ap.add_argument("--warmup", type=int, default=1, help="first steps left out of the quantiles")
    ap.add_argument("--threads", type=int, default=1, help="trainer.compute_threads (default 1)")
    ap.add_argument("--e2e", action="store_true", help="only the whole step, written as bench e2e")
    args = ap.parse_args()
    steps = args.steps or (4 if args.quick else 12)
    if steps <= args.warmup:
        ap.error(f"--steps ({steps}) must exceed --warmup ({args.warmup})")
    with tempfile.TemporaryDirectory(prefix="fastcrit-bench-train-") as d:
        metrics = [m for m in train(steps, args.threads, d) if "time/step_s" in m]
    timed = [m for m in metrics if m["step"] > args.warmup]
    name = "e2e" if args.e2e else "train"
    tps = [m["throughput/tokens_per_s"] for m in timed if "throughput/tokens_per_s" in m]
    rows = []
    for phase in ("step",) if args.e2e else PHASES:
        xs = [1e3 * m[f"time/{phase}_s"] for m in timed if f"time/{phase}_s" in m]
        if not xs:
            continue
        rows.append(
            {
                "bench": name,
                "variant": f"fastcrit_{phase}",
                "phase": phase,
                "config": "configs/cpu/grpo.yaml",
                "steps": steps,
                "warmup": args.warmup,
                "threads": args.threads,
                "model": "tiny",
                "ms": statistics.median(xs),
                "ms_q20": quantile(xs, 0.2),
                "ms_q80": quantile(xs, 0.8),
                "tokens_per_s": statistics.median(tps) if tps else "",
                "peer": PEER,
            }
        )
    path = write_rows(rows, name, settings=("config", "model", "steps", "warmup", "threads"), repeats=len(timed))
    for r in rows:
        print(f"{r['phase']:8s} {r['ms']:9.1f} ms  (q20 {r['ms_q20']:.1f}, q80 {r['ms_q80']:.1f})", file=sys.stderr)
    print(
        json.dumps({"bench": name, "csv": path, "steps": steps, "timed_steps": len(timed), "peer": PEER, "rows": rows})
    )


if __name__ == "__main__":
    main()
