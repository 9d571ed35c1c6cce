"""Result cache keyed by the exact job, persisted in sqlite.

The key (``job_key``) is a SHA-256 over

- the program's text exactly as given: no normalisation, since programs that differ only in local
  names, comments or blank lines can behave differently (a function reading its own
  ``co_varnames`` or ``co_firstlineno``);
- kind, tests (in their order, dict items in their order: a program can observe both), entry point,
  ``timeout_s``, ``memory_mb``, ``run_all_cases``;
- every pool setting that can change a result (all of ``SandboxConfig`` but ``_NOT_IN_KEY``, so a
  setting added later is in the key until someone decides otherwise): isolation, limits, preimported
  modules, the backend and its URL, the tail size;
- ``sandbox_version()``: a digest of the sandbox's own code (every ``.py`` file of this package and
  the jail binary) and of the Python version. Any change to how verdicts are reached gives new keys,
  with no version number to remember to bump; unchanged code keeps its entries across runs.

Only results the program itself decided are stored (``cacheable``): not a result with a job-level
message (a worker that died or stopped answering, a remote failure), not one with a ``timeout``
(it may depend on load), not one with a test whose message starts with ``FAULT_PREFIX`` (the
sandbox's own faults: a worker that raised, an answer the pool could not read or judge), not one
without tests. A hit returns the verdicts and the stdout/stderr tails of the first run.

The sqlite file and its WAL and shared-memory files (which sqlite creates with the main file's
mode) are readable and writable by their owner only.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import os
import sqlite3
import sys
import threading
import time

from .types import FAULT_PREFIX, PASSED, TIMEOUT, Job, Result, SandboxConfig

_HERE = os.path.dirname(os.path.abspath(__file__))
# Settings that change how fast or how many jobs run, never a result: left out of the key. The
# config's timeout_s/memory_mb are only defaults for jobs given as dicts; a Job holds its own.
_NOT_IN_KEY = frozenset(
    {
        "workers",
        "max_concurrency",
        "cache_path",
        "timeout_s",
        "memory_mb",
        "remote_concurrency",
        "remote_retries",
        "remote_timeout_s",
    }
)


@functools.cache
def sandbox_version() -> str:
    """Digest of the code that reaches verdicts: this package's sources, the jail binary and the
    Python version (see the module docstring)."""
    from .jail import jail_path

    h = hashlib.sha256(sys.version.encode())
    files = sorted(glob.glob(os.path.join(_HERE, "*.py")))
    jail = jail_path()
    for path in files + ([jail] if jail else []):
        with open(path, "rb") as f:
            data = f.read()
        h.update(b"%s %d\n" % (os.path.basename(path).encode(), len(data)))
        h.update(data)
    return h.hexdigest()


def job_key(job: Job, config: SandboxConfig) -> str:
    """The cache key of ``job`` run by a pool with ``config`` (see the module docstring)."""
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in _NOT_IN_KEY}
    payload = json.dumps(
        [
            sandbox_version(),
            settings,
            job.code,
            job.kind,
            job.tests,
            job.entry_point,
            job.timeout_s,
            job.memory_mb,
            job.run_all_cases,
        ],
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def cacheable(result: Result) -> bool:
    """True when every verdict of ``result`` was decided by the program's own behaviour."""
    if result.message or not result.tests:
        return False
    return not any(
        t.status == TIMEOUT or (t.status != PASSED and t.message.startswith(FAULT_PREFIX)) for t in result.tests
    )


def _make_private(path: str) -> None:
    """Create ``path`` with mode 0600, or make an existing file (and its sqlite companions) so."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    finally:
        os.close(fd)
    for extra in (path + "-wal", path + "-shm", path + "-journal"):
        try:
            os.chmod(extra, 0o600)
        except FileNotFoundError:
            pass


class ResultCache:
    """sqlite-backed; safe to share between threads of one process and between processes."""

    def __init__(self, path: str):
        self.path = path
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        _make_private(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, result TEXT NOT NULL, created REAL NOT NULL)"
        )
        self._db.commit()
        self.hits = 0
        self.misses = 0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def get(self, key: str) -> Result | None:
        with self._lock:
            row = self._db.execute("SELECT result FROM results WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        r = Result.from_dict(json.loads(row[0]))
        r.cached = True
        return r

    def put(self, key: str, result: Result) -> None:
        if not cacheable(result):
            return
        d = result.to_dict()
        d["cached"] = False
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?)", (key, json.dumps(d), time.time()))
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0]

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hit_rate, "entries": len(self)}

    def close(self) -> None:
        with self._lock:
            self._db.close()
