"""kl_penalty (k3 / low_var_kl) forward + backward vs eager torch autograd (verl's formula).

Run alone: ``python benchmarks/bench_kl.py [--quick]``. Appends rows to
benchmarks/results/bench_kl.csv and prints one JSON object as the last line. On CPU the measured
path is ``backend="torch"`` (the Triton interpreter is a correctness tool, not a fast path); with a
CUDA GPU, ``backend="triton"`` is measured too. Peak memory on CPU is the growth of the process RSS
above its level before the call (the kernel's high-water mark, ``_common._timed``); on GPU it is
torch's peak allocation.
"""

from __future__ import annotations

import json
import sys

import torch
from _common import machine, measure, start, write_rows

from fastcrit_kernels import kl_penalty

NAME = "kl"


def eager_k3(lp, ref):
    """verl's low_var_kl in eager torch (what a trainer without a fused kernel runs)."""
    d = torch.clamp(ref - lp, min=-20, max=20)
    return torch.clamp(torch.exp(d) - d - 1, min=-10, max=10)


def main() -> None:
    args, device = start(__doc__)
    shapes = [(8, 512)] if args.quick else [(16, 512), (64, 2048), (256, 4096)]
    repeats = 3 if args.quick else 11
    info = machine()
    rows = []
    for B, T in shapes:
        g = torch.Generator(device="cpu").manual_seed(0)
        lp0 = (-torch.rand(B, T, generator=g) * 3).to(device)
        ref = lp0 + torch.randn(B, T, generator=g, device="cpu").to(device) * 0.5
        up = torch.randn(B, T, generator=g).to(device)

        def run(f):
            lp = lp0.clone().requires_grad_(True)
            f(lp).backward(up)

        variants = {"eager_torch": lambda lp: eager_k3(lp, ref)}
        variants["fastcrit_torch"] = lambda lp: kl_penalty(lp, ref, "k3", backend="torch")
        if device.type == "cuda":
            variants["fastcrit_triton"] = lambda lp: kl_penalty(lp, ref, "k3", backend="triton")
        res = {k: measure(lambda f=f: run(f), device, repeats) for k, f in variants.items()}
        for k, r in res.items():
            rows.append(
                {
                    "bench": NAME,
                    "variant": k,
                    "B": B,
                    "T": T,
                    "dtype": "float32",
                    **r,
                    "time_ratio_vs_eager": r["ms"] / res["eager_torch"]["ms"],
                    "mem_ratio_vs_eager": r["peak_mb"] / max(res["eager_torch"]["peak_mb"], 1e-9),
                    **info,
                }
            )
    path = write_rows(rows, NAME, settings=("B", "T", "dtype"), repeats=repeats)
    for r in rows:
        print(
            f"{r['variant']:16s} B={r['B']:4d} T={r['T']:5d}  {r['ms']:9.3f} ms  peak {r['peak_mb']:8.2f} MB  "
            f"x{r['time_ratio_vs_eager']:.2f} time  x{r['mem_ratio_vs_eager']:.2f} mem",
            file=sys.stderr,
        )
    print(json.dumps({"bench": NAME, "csv": path, "rows": rows}))


if __name__ == "__main__":
    main()
