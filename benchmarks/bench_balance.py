"""Padding and rank imbalance of an RL batch with mixed lengths: row micro-batches on a contiguous
split of the rows over ranks (what a trainer without balancing does) vs fastcrit's Karmarkar-Karp
split by work and token-budget micro-batches (trainer.max_tokens_per_micro_batch).

Run alone: ``python benchmarks/bench_balance.py [--quick]``. Appends rows to
benchmarks/results/bench_balance.csv and prints one JSON object as the last line. No model runs:
the figures are token counts of the micro-batches each rank would run (a padded forward over
rows costs rows x (longest prompt + longest response)), over ``--repeats`` random batches (the
quantiles are over those batches), plus the time Karmarkar-Karp takes to split one batch.

Lengths: prompts uniform in [64, 512), responses uniform in [16, 2048) tokens, as in reasoning RL
where some responses stop early and some run to the limit.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
from _common import machine, start, write_rows

from fastcrit.train.balance import imbalance, karmarkar_karp, token_micro_batches, workload

NAME = "balance"


def padded_cells(prompts, responses, rows) -> int:
    """Token slots of one padded forward over ``rows``: prompts left-padded, responses
    right-padded, so rows x (longest prompt + longest response)."""
    return len(rows) * (max(prompts[i] for i in rows) + max(responses[i] for i in rows)) if rows else 0


def one_batch(rng, rows: int, ranks: int, budget: int) -> dict:
    prompts, responses = rng.integers(64, 512, rows).tolist(), rng.integers(16, 2048, rows).tolist()
    lengths = [p + r for p, r in zip(prompts, responses)]
    real = sum(lengths)
    # baseline: contiguous rows per rank, each rank's batch padded as one block (row micro-batches
    # are slices of it)
    split = [p.tolist() for p in np.array_split(np.arange(rows), ranks)]
    base_cells = sum(padded_cells(prompts, responses, p) for p in split)
    base_loads = [sum(lengths[i] for i in p) for p in split]
    base_work = [float(workload([lengths[i] for i in p]).sum()) for p in split]
    # fastcrit: Karmarkar-Karp by work over ranks, token-budget micro-batches on each, each
    # micro-batch cut to its own longest prompt and response
    t0 = time.perf_counter()
    parts = karmarkar_karp(workload(lengths), ranks)
    kk_ms = (time.perf_counter() - t0) * 1e3
    cells = 0
    for p in parts:
        for m in token_micro_batches([lengths[i] for i in p], budget):
            cells += padded_cells(prompts, responses, [p[j] for j in m])
    loads = [sum(lengths[i] for i in p) for p in parts]
    work = [float(workload([lengths[i] for i in p]).sum()) for p in parts]
    return {
        "base_pad": 1 - real / base_cells,
        "ours_pad": 1 - real / cells,
        "base_imb": imbalance(base_loads),
        "ours_imb": imbalance(loads),
        "base_work_imb": imbalance(base_work),
        "ours_work_imb": imbalance(work),
        "kk_ms": kk_ms,
    }


def main() -> None:
    def extra(ap):
        ap.add_argument("--repeats", type=int, default=None)

    args, _ = start(__doc__, extra)
    rows_per_batch, ranks, budget = (256, 8, 16384) if args.quick else (1024, 8, 32768)
    repeats = args.repeats or (5 if args.quick else 20)
    rng = np.random.default_rng(0)
    karmarkar_karp(workload([1, 2, 3]), 2)  # compile once (numba), outside the timing
    res = [one_batch(rng, rows_per_batch, ranks, budget) for _ in range(repeats)]

    def q(key):
        v = sorted(r[key] for r in res)
        return statistics.median(v), v[int(0.2 * (len(v) - 1))], v[int(0.8 * (len(v) - 1))]

    info = machine()
    out = []
    for metric, base, ours in (
        ("pad_frac", "base_pad", "ours_pad"),
        ("tokens_imbalance", "base_imb", "ours_imb"),
        ("work_imbalance", "base_work_imb", "ours_work_imb"),
    ):
        for variant, key in (("contiguous_rows_padded", base), ("kk_token_budget", ours)):
            med, lo, hi = q(key)
            out.append(
                {
                    "bench": NAME,
                    "variant": variant,
                    "what": metric,
                    "rows": rows_per_batch,
                    "ranks": ranks,
                    "micro_budget": budget,
                    "value": med,
                    "value_q20": lo,
                    "value_q80": hi,
                    **info,
                }
            )
    med, lo, hi = q("kk_ms")
    out.append(
        {
            "bench": NAME,
            "variant": "kk_split_time",
            "what": "ms",
            "rows": rows_per_batch,
            "ranks": ranks,
            "micro_budget": budget,
            "value": med,
            "value_q20": lo,
            "value_q80": hi,
            **info,
        }
    )
    path = write_rows(
        out,
        NAME,
        settings=("what", "rows", "ranks", "micro_budget"),
        repeats=repeats,
        metric="value",
        median="value",
        q20="value_q20",
        q80="value_q80",
    )
    for r in out:
        print(
            f"{r['what']:17s} {r['variant']:24s} {r['value']:.4f} [{r['value_q20']:.4f}, {r['value_q80']:.4f}]",
            file=sys.stderr,
        )
    print(json.dumps({"csv": path, "rows": [{k: r[k] for k in ("variant", "what", "value")} for r in out]}))


if __name__ == "__main__":
    main()
