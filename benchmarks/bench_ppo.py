"""ppo_policy_loss (dual clip, token-mean) and value_loss forward + backward vs eager torch autograd
(verl's formulas).

Run alone: ``python benchmarks/bench_ppo.py [--quick]``. Appends rows to
benchmarks/results/bench_ppo.csv and prints one JSON object as the last line. Measurement as in
bench_kl.py (CPU: ``backend="torch"``, RSS growth; GPU: ``triton`` too, torch peak allocation).
"""
from __future__ import annotations

import json
import sys

import torch

from _common import machine, measure, start, write_rows
from fastcrit_kernels import ppo_policy_loss, value_loss

NAME = "ppo"


def eager_policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_c=3.0):
    """verl compute_policy_loss_vanilla, token-mean, in eager torch."""
    neg_kl = torch.clamp(lp - old, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    lc = torch.maximum(l1, l2)
    l3 = -adv * clip_c
    loss_mat = torch.where(adv < 0, torch.min(l3, lc), lc)
    with torch.no_grad():  # the stats, as verl logs them
        _ = ((l2 > l1).float() * mask).sum() / mask.sum(), (-neg_kl * mask).sum() / mask.sum()
    return (loss_mat * mask).sum() / mask.sum()


def eager_value_loss(v, vo, R, mask, clip=0.5):
    vc = torch.clamp(v, vo - clip, vo + clip)
    return 0.5 * (torch.max((v - R) ** 2, (vc - R) ** 2) * mask).sum() / mask.sum()


def main() -> None:
    args, device = start(__doc__)
    shapes = [(8, 512)] if args.quick else [(16, 512), (64, 2048), (256, 4096)]
    repeats = 3 if args.quick else 11
    backends = ["torch", "triton"] if device.type == "cuda" else ["torch"]
    info = machine()
    rows = []
    for B, T in shapes:
        g = torch.Generator().manual_seed(0)
        old = (-torch.rand(B, T, generator=g) * 3).to(device)
        lp0 = old + (torch.randn(B, T, generator=g) * 0.3).to(device)
        adv = torch.randn(B, T, generator=g).to(device)
        mask = (torch.rand(B, T, generator=g) > 0.2).to(device)
        maskf = mask.float()
        vo = torch.randn(B, T, generator=g).to(device)
        v0 = vo + (torch.randn(B, T, generator=g) * 0.5).to(device)
        R = torch.randn(B, T, generator=g).to(device)

        def step_policy(f):
            lp = lp0.clone().requires_grad_(True)
            (f(lp) * 1.3).backward()

        def step_value(f):
            v = v0.clone().requires_grad_(True)
            (f(v) * 1.3).backward()

        cases = {
            ("policy", "eager_torch"): lambda: step_policy(lambda lp: eager_policy_loss(lp, old, adv, maskf)),
            ("value", "eager_torch"): lambda: step_value(lambda v: eager_value_loss(v, vo, R, maskf)),
        }
        for be in backends:
            cases[("policy", f"fastcrit_{be}")] = lambda be=be: step_policy(
                lambda lp: ppo_policy_loss(lp, old, adv, mask, clip_high=0.28, clip_c=3.0, backend=be)[0])
            cases[("value", f"fastcrit_{be}")] = lambda be=be: step_value(
                lambda v: value_loss(v, vo, R, mask, clip=0.5, backend=be)[0])
        res = {k: measure(f, device, repeats) for k, f in cases.items()}
        for (what, variant), r in res.items():
            base = res[(what, "eager_torch")]
            rows.append({"bench": f"{NAME}_{what}", "variant": variant, "B": B, "T": T, "dtype": "float32", **r,
                         "time_ratio_vs_eager": r["ms"] / base["ms"],
                         "mem_ratio_vs_eager": r["peak_mb"] / max(base["peak_mb"], 1e-9), **info})
    path = write_rows(rows, NAME, settings=("B", "T", "dtype"), repeats=repeats)
    for r in rows:
        print(f"{r['bench']:11s} {r['variant']:16s} B={r['B']:4d} T={r['T']:5d}  {r['ms']:9.3f} ms  "
              f"peak {r['peak_mb']:8.2f} MB  x{r['time_ratio_vs_eager']:.2f} time  x{r['mem_ratio_vs_eager']:.2f} mem",
              file=sys.stderr)
    print(json.dumps({"bench": NAME, "csv": path, "rows": rows}))


if __name__ == "__main__":
    main()
