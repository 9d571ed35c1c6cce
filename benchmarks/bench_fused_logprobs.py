"""Benchmark: log-probs of the labels from hidden states x lm_head, forward + backward.

Shapes: Qwen2.5-0.5B's lm_head (H=896, V=151936), fp32, tokens in {1024, 2048, 4096, 8192}.
Implementations, side by side in one run:
  naive        full logits -> log_softmax -> gather (verl's non-fused path), plain autograd
  ours         fastcrit_kernels.fused_logprobs, backend "auto" (torch path on CPU; on CUDA Triton, except
               exact fp32, which goes to the torch path's cuBLAS GEMMs)
  ours_recompute  the same with keep_bytes=0: the backward recomputes the logits (the default on a
               GPU; on a CPU "ours" keeps them up to 4 GiB)
  ours_torch   the same with backend="torch" (on CUDA: cuBLAS GEMMs over chunks; not in the default set)
  ours_triton  the same with backend="triton" (the Triton kernels; not in the default set)
  liger_lp     Liger-Kernel's chunked selective log-prob (LigerFusedLinearPPOBase.chunk_forward)
  ours_grpo    fastcrit_kernels.fused_linear_ppo_loss (token-mean PPO clip + k3 KL, beta 0.04)
  liger_grpo   Liger-Kernel's LigerFusedLinearGRPOLoss (loss_type "bnpo" = token-mean, beta 0.04)
The log-prob rows backpropagate a fixed random upstream gradient; the loss rows call backward().

CPU: each (impl, tokens) runs in a fresh subprocess. Peak memory = growth of the process's peak
resident set (VmHWM in /proc/self/status, reset through /proc/self/clear_refs after the inputs
are built) over the resident set at that moment, during one forward+backward. It includes the
gradients (d_weight is V x H x 4 B = 545 MB for every implementation); `work_mb` subtracts the
gradient buffers to show the working memory alone. Times: wall-clock of forward+backward, median
and 0.2/0.8 quantiles over --repeats runs after the memory run, plus process CPU time (the machine
may be shared; CPU time is less sensitive to other load).
CUDA: triton.testing.do_bench (quantiles 0.5/0.2/0.8) and torch.cuda.max_memory_allocated growth.

Appends rows to benchmarks/results/fused_logprobs.csv and the run's summary to fused_logprobs.jsonl,
draws peak memory vs tokens from the newest CSV row per (impl, tokens) into
benchmarks/results/fused_logprobs_memory.png (needs matplotlib), and prints one JSON object as its
last line. Run: python benchmarks/bench_fused_logprobs.py [--tokens 1024,2048] [--impls ...]
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _common import append_csv, results_dir, standardize

from fastcrit.train.memory import proc_status_kb, reset_rss_peak

RESULTS = results_dir()
CSV_PATH = os.path.join(RESULTS, "fused_logprobs.csv")
PNG_PATH = os.path.join(RESULTS, "fused_logprobs_memory.png")
JSONL_PATH = os.path.join(RESULTS, "fused_logprobs.jsonl")  # one summary object per run
IMPLS = ("naive", "ours", "ours_recompute", "liger_lp", "ours_grpo", "liger_grpo")
EXTRA = ("ours_torch", "ours_triton")  # chosen by --impls only
H, V = 896, 151936
SEQ = 1024  # tokens per sequence for the [B, T] losses


def _make_case(impl: str, tokens: int, device: str):
    """Inputs and a closure running one forward+backward of ``impl``; returns (fn, grad_bytes)."""
    import torch

    g = torch.Generator().manual_seed(0)
    B, T = max(1, tokens // SEQ), min(tokens, SEQ)
    hidden = torch.randn(B, T, H, generator=g).to(device).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.02).to(device).requires_grad_()
    labels = torch.randint(0, V, (B, T), generator=g).to(device)
    up = torch.randn(B, T, generator=g).to(device)
    mask = torch.ones(B, T, device=device)
    adv = torch.randn(B, generator=g).to(device)
    with torch.no_grad():
        base = torch.randn(B, T, generator=g).to(device) * 0.1 - 12.0  # plausible log-prob scale
    old = base + 0.05
    ref = base - 0.05
    grad_bytes = (hidden.numel() + weight.numel()) * 4

    def zero():
        hidden.grad = None
        weight.grad = None

    if impl == "naive":
        from fastcrit_kernels.logprobs import logprobs_reference

        def fn():
            lp = logprobs_reference(hidden, weight, labels, dtype=torch.float32)
            lp.backward(up)
    elif impl == "ours":
        from fastcrit_kernels import fused_logprobs

        def fn():
            lp = fused_logprobs(hidden, weight, labels)
            lp.backward(up)
    elif impl == "ours_recompute":
        from fastcrit_kernels import fused_logprobs

        def fn():
            lp = fused_logprobs(hidden, weight, labels, keep_bytes=0)
            lp.backward(up)
    elif impl == "ours_torch":
        from fastcrit_kernels import fused_logprobs

        def fn():
            lp = fused_logprobs(hidden, weight, labels, backend="torch")
            lp.backward(up)
    elif impl == "ours_triton":
        from fastcrit_kernels import fused_logprobs

        def fn():
            lp = fused_logprobs(hidden, weight, labels, backend="triton")
            lp.backward(up)
    elif impl == "liger_lp":
        from liger_kernel.chunked_loss.fused_linear_ppo import LigerFusedLinearPPOBase

        def fn():
            lp = LigerFusedLinearPPOBase.chunk_forward(hidden, weight, labels)
            lp.backward(up)
    elif impl == "ours_grpo":
        from fastcrit_kernels import fused_linear_ppo_loss

        def fn():
            loss, _ = fused_linear_ppo_loss(
                hidden, weight, labels, old, adv, mask, ref_logp=ref, kl_coef=0.04, kl_kind="low_var_kl"
            )
            loss.backward()
    elif impl == "liger_grpo":
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        peer = LigerFusedLinearGRPOLoss(beta=0.04, compiled=False, use_ref_model=True, chunk_size=1, loss_type="bnpo")

        def fn():
            loss, _ = peer(hidden, weight, labels, mask.long(), adv, ref_per_token_logps=ref, old_per_token_logps=old)
            loss.backward()
    else:
        raise ValueError(f"unknown impl {impl!r}; choose from {IMPLS + EXTRA}")

    def run():
        zero()
        fn()

    return run, grad_bytes


def _worker(impl: str, tokens: int, repeats: int) -> dict:
    """CPU measurement inside a fresh process."""
    import torch

    run, grad_bytes = _make_case(impl, tokens, "cpu")
    if not reset_rss_peak():
        raise RuntimeError("cannot reset VmHWM through /proc/self/clear_refs; peak RSS unmeasurable")
    rss0 = proc_status_kb("VmRSS")["VmRSS"]
    t0, c0 = time.perf_counter(), time.process_time()
    run()
    first_s, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_mb = (proc_status_kb("VmHWM")["VmHWM"] - rss0) / 1024
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    if not walls:
        walls, cpus = [first_s], [first_cpu]
    q = statistics.quantiles(walls, n=10, method="inclusive") if len(walls) > 1 else [walls[0]] * 9
    return {
        "impl": impl,
        "tokens": tokens,
        "peak_mb": round(peak_mb, 1),
        "work_mb": round(peak_mb - grad_bytes / 2**20, 1),
        "ms_p50": round(1e3 * statistics.median(walls), 1),
        "ms_p20": round(1e3 * q[1], 1),
        "ms_p80": round(1e3 * q[7], 1),
        "cpu_s_p50": round(statistics.median(cpus), 2),
        "first_ms": round(1e3 * first_s, 1),
        "repeats": len(walls),
        "threads": torch.get_num_threads(),
    }


def _cuda_case(impl: str, tokens: int) -> dict:
    import torch
    import triton.testing

    run, grad_bytes = _make_case(impl, tokens, "cuda")
    run()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
    p50, p20, p80 = triton.testing.do_bench(run, quantiles=[0.5, 0.2, 0.8])
    # bytes that must move at least once: weight read twice (forward, backward), d_weight written
    min_bytes = 3 * V * H * 4 + 4 * tokens * H * 4
    return {
        "impl": impl,
        "tokens": tokens,
        "peak_mb": round(peak_mb, 1),
        "work_mb": round(peak_mb - grad_bytes / 2**20, 1),
        "ms_p50": round(p50, 3),
        "ms_p20": round(p20, 3),
        "ms_p80": round(p80, 3),
        "gbps": round(min_bytes / (p50 * 1e-3) / 1e9, 1),
        "repeats": None,
        "threads": None,
    }


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "kernels", "benchmarks"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}, {os.cpu_count()} cpus, load {load:.1f}"


def _latest_csv_rows(device):
    """The newest CSV row per (impl, tokens) on ``device``: one curve across several runs."""
    if not os.path.exists(CSV_PATH):
        return []
    latest = {}
    with open(CSV_PATH, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("device") != device or r.get("error") or not r.get("peak_mb") or int(r.get("V") or V) != V:
                continue
            latest[(r["impl"], int(r["tokens"]))] = {
                "impl": r["impl"],
                "tokens": int(r["tokens"]),
                "peak_mb": float(r["peak_mb"]),
            }
    return list(latest.values())


def _plot(rows, device):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for impl in IMPLS + EXTRA:
        pts = sorted((r["tokens"], r["peak_mb"]) for r in rows if r["impl"] == impl and "peak_mb" in r)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] / 1024 for p in pts], marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens")
    ax.set_ylabel("peak memory growth, GiB (incl. gradients)")
    ax.set_title(f"log-probs fwd+bwd, H={H}, V={V}, fp32, {device}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(PNG_PATH, dpi=120)
    return PNG_PATH


def main(argv=None) -> dict:
    global V  # --vocab: the worker processes get it too
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--tokens",
        default=None,
        help="comma list; default 1024,2048,4096 on CPU (8192 takes minutes per case "
        "there), 1024,2048,4096,8192 on CUDA",
    )
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"comma list from {IMPLS + EXTRA}")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs after the memory run (CPU)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--no-csv", action="store_true")
    ap.add_argument(
        "--plot-only", action="store_true", help="redraw the PNG from the newest CSV row per (impl, tokens) and exit"
    )
    ap.add_argument("--vocab", type=int, default=V, help=f"lm_head rows V (default {V}, Qwen2.5's)")
    ap.add_argument("--no-plot", action="store_true", help="leave fused_logprobs_memory.png as it is")
    ap.add_argument("--worker", nargs=3, metavar=("IMPL", "TOKENS", "REPEATS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    V = args.vocab

    if args.worker:
        impl, tokens, repeats = args.worker
        print(json.dumps(_worker(impl, int(tokens), int(repeats))))
        return {}

    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.plot_only:
        print(json.dumps({"png": _plot(_latest_csv_rows(device), device)}))
        return {}
    default_tokens = "1024,2048,4096" if device == "cpu" else "1024,2048,4096,8192"
    tokens_list = [int(t) for t in (args.tokens or default_tokens).split(",")]
    impls = [i for i in args.impls.split(",") if i]
    for i in impls:
        if i not in IMPLS + EXTRA:
            ap.error(f"unknown impl {i!r}; choose from {IMPLS + EXTRA}")

    commit, stamp = _git_commit(), _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    rows = []
    for tokens in tokens_list:
        for impl in impls:
            if device == "cpu":
                env = dict(os.environ, TRITON_INTERPRET="0")
                proc = subprocess.run(
                    [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--worker",
                        impl,
                        str(tokens),
                        str(args.repeats),
                        "--vocab",
                        str(V),
                    ],
                    capture_output=True,
                    text=True,
                    env=env,
                )
                if proc.returncode != 0:
                    row = {"impl": impl, "tokens": tokens, "error": proc.stderr.strip()[-400:]}
                else:
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
            else:
                row = _cuda_case(impl, tokens)
                torch.cuda.empty_cache()
            rows.append(row)
            print(
                f"{impl:>10} tokens={tokens:5d} "
                + " ".join(f"{k}={v}" for k, v in row.items() if k not in ("impl", "tokens")),
                file=sys.stderr,
                flush=True,
            )

    # ratios against naive measured in this run
    naive = {r["tokens"]: r for r in rows if r["impl"] == "naive" and "error" not in r}
    for r in rows:
        n = naive.get(r["tokens"])
        if n and "error" not in r:
            r["mem_vs_naive"] = round(r["peak_mb"] / n["peak_mb"], 3) if n["peak_mb"] > 0 else None
            r["work_vs_naive"] = round(r["work_mb"] / n["work_mb"], 3) if n["work_mb"] > 0 else None
            r["time_vs_naive"] = round(r["ms_p50"] / n["ms_p50"], 3)
            if "cpu_s_p50" in r:
                r["cpu_vs_naive"] = round(r["cpu_s_p50"] / n["cpu_s_p50"], 3)
    machine = _machine()
    if not args.no_csv:
        os.makedirs(RESULTS, exist_ok=True)
        fields = [
            "timestamp",
            "commit",
            "machine",
            "device",
            "dtype",
            "H",
            "V",
            "impl",
            "tokens",
            "peak_mb",
            "work_mb",
            "ms_p50",
            "ms_p20",
            "ms_p80",
            "cpu_s_p50",
            "gbps",
            "mem_vs_naive",
            "work_vs_naive",
            "time_vs_naive",
            "cpu_vs_naive",
            "repeats",
            "threads",
            "error",
        ]
        out = [
            {
                k: v
                for k, v in dict(
                    r,
                    timestamp=stamp,
                    commit=commit,
                    machine=machine,
                    device=device,
                    dtype="fp32",
                    H=H,
                    V=V,
                    bench="fused_logprobs",
                ).items()
                if k in fields or k == "bench"
            }
            for r in rows
        ]
        append_csv(
            CSV_PATH,
            standardize(
                out,
                settings=("tokens", "H", "V", "dtype"),
                repeats=args.repeats,
                median="ms_p50",
                q20="ms_p20",
                q80="ms_p80",
                variant="impl",
            ),
        )
    png = None if args.no_plot else _plot(rows if args.no_csv else _latest_csv_rows(device), device)
    summary = {
        "bench": "fused_logprobs",
        "timestamp": stamp,
        "commit": commit,
        "machine": machine,
        "device": device,
        "H": H,
        "V": V,
        "dtype": "fp32",
        "memory_method": (
            "peak RSS growth (VmHWM after clear_refs) in a fresh subprocess per case"
            if device == "cpu"
            else "torch.cuda.max_memory_allocated growth"
        ),
        "png": png,
        "rows": rows,
    }
    if not args.no_csv:
        with open(JSONL_PATH, "a") as f:
            f.write(json.dumps(summary) + "\n")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
