"""Run a module or script in this process (``python _peak.py -m MODULE ARGS`` / ``_peak.py FILE ARGS``)
and, at exit, write its peak resident set (MB) as JSON to $FASTCRIT_PEAK_FILE.

The peak is the larger of VmHWM at exit and the resident set sampled every 2 ms by a thread:
fastcrit's per-phase memory metrics reset VmHWM at every phase (``/proc/self/clear_refs``), so
VmHWM alone would only cover the last phase.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
import time

_peak_kb = [0]


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next((int(line.split()[1]) for line in f if line.startswith(field)), 0)


def _sample() -> None:
    while True:
        _peak_kb[0] = max(_peak_kb[0], _status("VmRSS:"))
        time.sleep(0.002)


def _write() -> None:
    peak = max(_peak_kb[0], _status("VmHWM:"), _status("VmRSS:")) / 1024
    with open(os.environ["FASTCRIT_PEAK_FILE"], "w") as f:
        json.dump({"peak_rss_mb": peak}, f)


if __name__ == "__main__":
    atexit.register(_write)
    threading.Thread(target=_sample, daemon=True).start()
    if sys.argv[1] == "-m":
        sys.argv = [sys.argv[2], *sys.argv[3:]]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
