"""The sandbox is a service any trainer can use: importing and running it never loads torch."""

import subprocess
import sys

SCRIPT = r"""
import sys, warnings
import fastcrit.sandbox as sb
from fastcrit.sandbox import cli, cache, harness, jail, pool, remote, types, workers, bench
ok = sb.probe().ok
with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    res = sb.run_jobs([sb.Job(code="print(2)", kind="stdio", tests=[["", "2"]])], workers=1,
                      isolation="jail" if ok else "none")
assert res[0].all_passed, res
bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m == "triton")
print("LOADED:", bad)
"""


def test_sandbox_never_imports_torch():
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "LOADED: []" in p.stdout, p.stdout


def test_worker_process_stays_small():
    """The warm worker must not drag in the pool's machinery (asyncio, uvloop, sqlite, http)."""
    code = (
        "import sys, fastcrit.sandbox.workers\n"
        "print(sorted(m for m in ('asyncio', 'uvloop', 'sqlite3', 'urllib.request', 'http.client', 'torch')"
        " if m in sys.modules))"
    )
    p = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
