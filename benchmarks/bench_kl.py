"""kl_penalty (k3 / low_var_kl) forward + backward vs eager torch autograd (verl's formula).

Run alone: ``python benchmarks/bench_kl.py [--quick]``. Appends rows to
benchmarks/results/bench_kl.csv and prints one JSON object as the last line. On CPU the measured
path is ``backend="torch"`` (the Triton interpreter is a correctness tool, not a fast path); with a
CUDA GPU, ``backend="triton"`` is measured too. Peak memory on CPU is the growth of the process RSS
above its level before the call, sampled every 0.2 ms; on GPU it is torch's peak allocation.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import threading
import time

import torch

from fastcrit_kernels import kl_penalty

NAME = "kl"


# ---- measurement helpers, shared by bench_advantages / bench_ppo / bench_pacs (they import them) ----
def fixed_mmap_threshold() -> None:
    """Re-exec with a fixed glibc mmap threshold (Linux, CPU): every freed block >= 64 KiB then goes
    back to the OS at once, so the process RSS follows the live tensors (glibc's default threshold
    adapts upwards after frees and would hide them)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and sys.platform.startswith("linux"):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(fn, device, repeats: int, warmup: int = 2):
    """Median / q20 / q80 wall time (ms) and peak memory growth (MB) of ``fn()``."""
    for _ in range(warmup):
        fn()
    times, peaks = [], []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            peaks.append(torch.cuda.max_memory_allocated() - base)
        else:
            base, peak, stop = _rss(), [0], threading.Event()

            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], _rss())
                    time.sleep(0.0002)

            th = threading.Thread(target=sample)
            th.start()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            stop.set()
            th.join()
            peaks.append(max(peak[0], _rss()) - base)
    q = torch.tensor(times, dtype=torch.float64).quantile(torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64))
    return {"ms": 1e3 * q[0].item(), "ms_q20": 1e3 * q[1].item(), "ms_q80": 1e3 * q[2].item(),
            "peak_mb": max(peaks) / 2**20}


def machine() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = ""
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu x{os.cpu_count()}"
    # the 1-minute load average: on a shared machine, timings taken under load are noisy
    return {"device": dev, "platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "loadavg_1m": round(os.getloadavg()[0], 2), "commit": commit}


def write_rows(rows: list[dict], name: str) -> str:
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"bench_{name}.csv")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    new = not os.path.exists(out)
    with open(out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)
    return out


# ---- this benchmark ----
def eager_k3(lp, ref):
    """verl's low_var_kl in eager torch (what a trainer without a fused kernel runs)."""
    d = torch.clamp(ref - lp, min=-20, max=20)
    return torch.clamp(torch.exp(d) - d - 1, min=-10, max=10)


def main() -> None:
    fixed_mmap_threshold()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's choice); 1 is steadier on a loaded machine")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = [(8, 512)] if args.quick else [(16, 512), (64, 2048), (256, 4096)]
    repeats = 3 if args.quick else 11
    info = machine()
    rows = []
    for B, T in shapes:
        g = torch.Generator(device="cpu").manual_seed(0)
        lp0 = (-torch.rand(B, T, generator=g) * 3).to(device)
        ref = (lp0 + torch.randn(B, T, generator=g, device="cpu").to(device) * 0.5)
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
            rows.append({"bench": NAME, "variant": k, "B": B, "T": T, "dtype": "float32", **r,
                         "time_ratio_vs_eager": r["ms"] / res["eager_torch"]["ms"],
                         "mem_ratio_vs_eager": r["peak_mb"] / max(res["eager_torch"]["peak_mb"], 1e-9), **info})
    path = write_rows(rows, NAME)
    for r in rows:
        print(f"{r['variant']:16s} B={r['B']:4d} T={r['T']:5d}  {r['ms']:9.3f} ms  peak {r['peak_mb']:8.2f} MB  "
              f"x{r['time_ratio_vs_eager']:.2f} time  x{r['mem_ratio_vs_eager']:.2f} mem", file=sys.stderr)
    print(json.dumps({"bench": NAME, "csv": path, "rows": rows}))


if __name__ == "__main__":
    main()
