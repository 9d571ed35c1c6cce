"""pacs_loss (reward method "1", RLOO, question weights) forward + backward vs eager torch autograd
in PACS's own layout (fixed group size, reshape, BCEWithLogitsLoss(weight=...)).

Run alone: ``python benchmarks/bench_pacs.py [--quick]``. Appends rows to
benchmarks/results/bench_pacs.csv and prints one JSON object as the last line. Measurement as in
bench_kl.py (CPU: ``backend="torch"``, RSS growth; GPU: ``triton`` too, torch peak allocation).
"""

from __future__ import annotations

import json
import sys

import torch
from _common import machine, measure, start, write_rows

from fastcrit_kernels import pacs_loss

NAME = "pacs"


def eager_pacs(lp, old, scores, mask, n, beta=1.0):
    """PACS's computation, vectorised (its question weights loop is replaced by tensor ops)."""
    reward = beta * ((lp - old) * mask).sum(-1)
    rg = reward.view(-1, n)
    adv = (rg - (rg.sum(1, keepdim=True) - rg) / (n - 1)).reshape(-1)
    y = scores.view(-1, n)
    npos = y.sum(1, keepdim=True)
    both = (npos > 0) & (npos < n)
    w = torch.where(both, n / (2 * torch.where(y > 0, npos, n - npos).clamp(min=1)), torch.ones_like(y)).reshape(-1)
    return torch.nn.functional.binary_cross_entropy_with_logits(adv, scores, weight=w)


def main() -> None:
    args, device = start(__doc__)
    shapes = [(2, 8, 512)] if args.quick else [(2, 8, 512), (8, 8, 2048), (16, 16, 4096)]  # (prompts, n, T)
    repeats = 3 if args.quick else 11
    backends = ["torch", "triton"] if device.type == "cuda" else ["torch"]
    info = machine()
    rows = []
    for P, n, T in shapes:
        g = torch.Generator().manual_seed(0)
        B = P * n
        old = (-torch.rand(B, T, generator=g) * 2).to(device)
        lp0 = old + (torch.randn(B, T, generator=g) * 0.05).to(device)
        mask = (torch.arange(T)[None, :] < torch.randint(T // 4, T + 1, (B, 1), generator=g)).to(device)
        maskf = mask.float()
        scores = torch.randint(0, 2, (B,), generator=g).float().to(device)
        index = torch.arange(P, device=device).repeat_interleave(n)

        def step(f):
            lp = lp0.clone().requires_grad_(True)
            (f(lp) * 1.3).backward()

        cases = {"eager_torch": lambda: step(lambda lp: eager_pacs(lp, old, scores, maskf, n))}
        for be in backends:
            cases[f"fastcrit_{be}"] = lambda be=be: step(
                lambda lp: pacs_loss(lp, old, scores, mask, index, weight_mode="question", backend=be)[0]
            )
        res = {k: measure(f, device, repeats) for k, f in cases.items()}
        base = res["eager_torch"]
        for k, r in res.items():
            rows.append(
                {
                    "bench": NAME,
                    "variant": k,
                    "B": B,
                    "T": T,
                    "group_size": n,
                    "dtype": "float32",
                    **r,
                    "time_ratio_vs_eager": r["ms"] / base["ms"],
                    "mem_ratio_vs_eager": r["peak_mb"] / max(base["peak_mb"], 1e-9),
                    **info,
                }
            )
    path = write_rows(rows, NAME, settings=("B", "T", "group_size", "dtype"), repeats=repeats)
    for r in rows:
        print(
            f"{r['variant']:16s} B={r['B']:4d} T={r['T']:5d}  {r['ms']:9.3f} ms  peak {r['peak_mb']:8.2f} MB  "
            f"x{r['time_ratio_vs_eager']:.2f} time  x{r['mem_ratio_vs_eager']:.2f} mem",
            file=sys.stderr,
        )
    print(json.dumps({"bench": NAME, "csv": path, "rows": rows}))


if __name__ == "__main__":
    main()
