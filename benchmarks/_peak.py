"""Run a module or script in this process (``python _peak.py -m MODULE ARGS`` / ``_peak.py FILE ARGS``)
and, at exit, write its peak resident set (VmHWM, MB) as JSON to $FASTCRIT_PEAK_FILE."""
from __future__ import annotations

import atexit
import json
import os
import runpy
import sys


def _write() -> None:
    with open("/proc/self/status") as f:
        peak = next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")), float("nan"))
    with open(os.environ["FASTCRIT_PEAK_FILE"], "w") as f:
        json.dump({"peak_rss_mb": peak}, f)


if __name__ == "__main__":
    atexit.register(_write)
    if sys.argv[1] == "-m":
        sys.argv = [sys.argv[2], *sys.argv[3:]]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
