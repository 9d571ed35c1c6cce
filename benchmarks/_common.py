"""Measurement helpers shared by the benchmarks: command line, timing quantiles, peak memory,
machine facts, and the one CSV row writer every script uses (``standardize`` + ``append_csv``).

Every row written through ``append_csv`` carries the standard columns (``STANDARD``): bench,
variant, settings, metric, median, q20, q80, spread (q80 - q20), repeats, machine, device, commit,
run. Script-specific columns stay beside them. torch is imported only by the functions that need
it, so the torch-free benchmarks (bench_sandbox) can use the row writer too.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import os
import platform
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_ENV = "FASTCRIT_BENCH_RESULTS"  # `fastcrit bench --out DIR` points every script here
RUN_ENV = "FASTCRIT_BENCH_RUN"  # one id shared by all scripts of one `fastcrit bench` call
STANDARD = (
    "bench",
    "variant",
    "settings",
    "metric",
    "median",
    "q20",
    "q80",
    "spread",
    "repeats",
    "machine",
    "device",
    "commit",
    "run",
)


def start(doc: str, extra=None):
    """Parse the shared flags (--quick, --threads) and a script's own (``extra(parser)`` adds
    them), pin the allocator, pick the device."""
    import torch

    fixed_mmap_threshold()
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's choice); 1 is steadier on a loaded machine",
    )
    if extra is not None:
        extra(ap)
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


def _timed(fn, device, memory: bool = True) -> tuple[float, int]:
    """Wall time (s) and peak memory growth (bytes) of one ``fn()``: torch's peak allocation on a
    GPU; on CPU the process's peak resident set from the kernel (``VmHWM``, reset before the call
    through ``/proc/self/clear_refs``: exact, and nothing runs beside ``fn``), or, where that reset
    is refused, the resident set sampled every 0.2 ms by a thread. That thread takes the GIL and a
    core thousands of times a second, which on a machine of few cores slows the GEMMs it runs
    beside (the figures: docs/LOG.md), so it is the fallback only.
    ``memory=False``: nothing measured, 0 bytes. (``measure_interleaved`` also records the
    process's CPU time around each call.)"""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0, torch.cuda.max_memory_allocated() - base
    if not memory:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0, 0
    from fastcrit.train.memory import proc_status_kb, reset_rss_peak

    if reset_rss_peak():
        base = _rss()
        t0 = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - t0
        return elapsed, proc_status_kb("VmHWM")["VmHWM"] * 1024 - base
    base, peak, stop = _rss(), [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.0002)

    th = threading.Thread(target=sample)
    th.start()
    t0 = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - t0
    stop.set()
    th.join()
    return elapsed, max(peak[0], _rss()) - base


def _summary(times: list[float], peaks: list[int], cpu: list[float] | None = None) -> dict:
    import torch

    qs = torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64)
    q = torch.tensor(times, dtype=torch.float64).quantile(qs)
    out = {
        "ms": 1e3 * q[0].item(),
        "ms_q20": 1e3 * q[1].item(),
        "ms_q80": 1e3 * q[2].item(),
        "peak_mb": max(peaks) / 2**20,
    }
    if cpu:
        c = torch.tensor(cpu, dtype=torch.float64).quantile(qs)
        out.update(cpu_ms=1e3 * c[0].item(), cpu_ms_q20=1e3 * c[1].item(), cpu_ms_q80=1e3 * c[2].item())
    return out


def measure(fn, device, repeats: int, warmup: int = 2):
    """Median / q20 / q80 wall time (ms) and peak memory growth (MB) of ``fn()``. On CPU the peak
    comes from one extra run that samples the resident set; the timed runs do not sample."""
    for _ in range(warmup):
        fn()
    peak = _timed(fn, device)[1] if device.type != "cuda" else None
    runs = [_timed(fn, device, memory=device.type == "cuda") for _ in range(repeats)]
    return _summary([t for t, _ in runs], [p for _, p in runs] if peak is None else [peak])


def measure_interleaved(fns: dict, device, repeats: int, warmup: int = 1, log=None, memory: bool = True) -> dict:
    """``measure`` for several cases taking turns (a, b, c, a, b, c, ...), so that a change in the
    machine's load while they run reaches every case alike: {name: the row ``measure`` gives, plus
    the process CPU time ``cpu_ms`` (q20/q80 too): on a shared machine less sensitive to the other
    jobs than wall time, though thread barriers that spin count in it)}. ``log(name, round, seconds,
    cpu seconds)`` is called after each run (progress of long cases; round < 0: warm-up).
    ``memory=False``: no resident-set sampling on CPU (peaks 0; see ``_timed``)."""
    times, peaks, cpu = ({k: [] for k in fns} for _ in range(3))
    for r in range(warmup + repeats):
        for k, fn in fns.items():
            c0 = time.process_time()
            t, p = _timed(fn, device, memory=memory)
            c = time.process_time() - c0
            if r >= warmup:
                times[k].append(t)
                peaks[k].append(p)
                cpu[k].append(c)
            if log is not None:
                log(k, r - warmup, t, c)
    return {k: _summary(times[k], peaks[k], cpu[k]) for k in fns}


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip()
    except OSError:
        return ""


def machine_line() -> str:
    """CPU model, core count and the 1-minute load average in one string (load: timings taken on
    a shared, loaded machine are noisy, and the row should say so)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}"


def machine() -> dict:
    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu x{os.cpu_count()}"
    # the 1-minute load average: on a shared machine, timings taken under load are noisy
    return {
        "device": dev,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "commit": git_commit(),
    }


def results_dir() -> str:
    return os.environ.get(RESULTS_ENV) or os.path.join(HERE, "results")


def run_id() -> str:
    """The run a row belongs to: ``fastcrit bench`` sets one id for all its scripts; a script run
    alone uses the current UTC time."""
    return os.environ.get(RUN_ENV) or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def standardize(
    rows: list[dict],
    *,
    settings,
    repeats,
    metric: str = "ms",
    median: str = "ms",
    q20: str = "ms_q20",
    q80: str = "ms_q80",
    variant: str = "variant",
) -> list[dict]:
    """Add the ``STANDARD`` columns to each row (in place; returned for chaining).

    ``settings``: the keys whose values make the measured setting (joined ``k=v`` with spaces);
    ``median``/``q20``/``q80``: the keys holding the quantiles of ``metric`` (a unit such as ``ms``
    or ``exec/s``); ``variant``: the key naming what was measured. Keys already set win, so a
    script may set e.g. its own ``machine`` string."""
    run, mline, commit = run_id(), machine_line(), None
    for r in rows:
        lo, hi = r.get(q20), r.get(q80)
        std = {
            "bench": r.get("bench", ""),
            "variant": r.get(variant, ""),
            "settings": " ".join(f"{k}={r[k]}" for k in settings if k in r),
            "metric": metric,
            "median": r.get(median),
            "q20": lo,
            "q80": hi,
            "spread": (hi - lo) if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) else None,
            "repeats": repeats,
            "machine": mline,
            "device": r.get("device") or "cpu",
            "commit": r.get("commit") or (commit := commit or git_commit()),
            "run": run,
        }
        for k, v in std.items():
            if r.get(k) in (None, ""):
                r[k] = v
    return rows


def append_csv(path: str, rows: list[dict]) -> str:
    """Append ``rows`` to the CSV at ``path``. When the rows bring columns the file's header lacks,
    the file is rewritten once with the new columns appended to the old header (old rows get them
    empty), so every earlier row stays readable under its own column names."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    old_fields, old_rows = [], []
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            old_fields = list(reader.fieldnames or [])
            new_keys = [k for r in rows for k in r if k not in old_fields]
            if new_keys:
                old_rows = list(reader)
    fields = old_fields + [k for k in dict.fromkeys(k for r in rows for k in r) if k not in old_fields]
    if old_fields and fields == old_fields:
        with open(path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=fields).writerows(rows)
        return path
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(old_rows)
        w.writerows(rows)
    os.replace(tmp, path)
    return path


def write_rows(rows: list[dict], name: str, *, settings, repeats, **keys) -> str:
    """``standardize`` the rows (``keys``: its median / q20 / q80 / metric / variant arguments) and
    append them to <results>/bench_<name>.csv."""
    return append_csv(
        os.path.join(results_dir(), f"bench_{name}.csv"), standardize(rows, settings=settings, repeats=repeats, **keys)
    )
