"""group_advantages (GRPO) vs verl's loop version (a Python loop over samples and groups).

Run alone: ``python benchmarks/bench_advantages.py [--quick]``. Appends rows to
benchmarks/results/bench_advantages.csv and prints one JSON object as the last line. Measurement
as in bench_kl.py (CPU: ``backend="torch"``; GPU: ``triton`` too). No gradient is involved.
"""

from __future__ import annotations

import json
import sys

import torch
from _common import machine, measure, start, write_rows

from fastcrit_kernels import group_advantages
from fastcrit_kernels.advantages import ref_group_advantages

NAME = "advantages"


def main() -> None:
    args, device = start(__doc__)
    shapes = [(16, 8)] if args.quick else [(64, 8), (256, 16), (1024, 16)]  # (prompts, samples per prompt)
    repeats = 3 if args.quick else 9
    backends = ["torch", "triton"] if device.type == "cuda" else ["torch"]
    info = machine()
    rows = []
    for P, n in shapes:
        g = torch.Generator().manual_seed(0)
        B = P * n
        scores = torch.randint(0, 2, (B,), generator=g).float().to(device)
        # uids shuffled: groups are not contiguous in the batch
        index = torch.randperm(P, generator=g).repeat_interleave(n)[torch.randperm(B, generator=g)].to(device)
        cases = {"verl_loop_fp64": lambda: ref_group_advantages(scores, index, "grpo")}
        for be in backends:
            cases[f"fastcrit_{be}"] = lambda be=be: group_advantages(scores, index, "grpo", backend=be)
        res = {k: measure(f, device, repeats) for k, f in cases.items()}
        base = res["verl_loop_fp64"]
        for k, r in res.items():
            rows.append(
                {
                    "bench": NAME,
                    "variant": k,
                    "B": B,
                    "group_size": n,
                    "dtype": "float32",
                    **r,
                    "time_ratio_vs_loop": r["ms"] / base["ms"],
                    **info,
                }
            )
    path = write_rows(rows, NAME, settings=("B", "group_size", "dtype"), repeats=repeats)
    for r in rows:
        print(
            f"{r['variant']:16s} B={r['B']:6d} n={r['group_size']:3d}  {r['ms']:10.3f} ms  "
            f"x{r['time_ratio_vs_loop']:.4f} time",
            file=sys.stderr,
        )
    print(json.dumps({"bench": NAME, "csv": path, "rows": rows}))


if __name__ == "__main__":
    main()
