"""Measurement helpers shared by the element-wise kernel benchmarks (bench_kl, bench_advantages,
bench_ppo, bench_pacs): command line, timing quantiles, peak memory, machine facts, CSV rows."""
from __future__ import annotations

import argparse
import csv
import os
import platform
import subprocess
import sys
import threading
import time

import torch


def start(doc: str):
    """Parse the shared flags (--quick, --threads), pin the allocator, pick the device."""
    fixed_mmap_threshold()
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's choice); 1 is steadier on a loaded machine")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args, torch.device("cuda" if torch.cuda.is_available() else "cpu")


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
