"""fastcrit.sandbox: run untrusted generated code fast, isolated, and without being fooled.

Usable without torch (nothing here imports it). See docs/sandbox.md for what is and is not isolated.

Names are imported lazily: the warm workers import ``fastcrit.sandbox.workers`` and must stay small
(every page they hold is copied or mapped again at each fork), so they never load the pool's
asyncio/uvloop, sqlite or HTTP machinery.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "SandboxPool": "pool",
    "SyncSandboxPool": "pool",
    "run_jobs": "pool",
    "RemoteSandbox": "remote",
    "ResultCache": "cache",
    "job_key": "cache",
    "sandbox_version": "cache",
    "IsolationUnavailable": "jail",
    "Probe": "jail",
    "probe": "jail",
    "Job": "types",
    "JobError": "types",
    "Result": "types",
    "SandboxConfig": "types",
    "TestResult": "types",
    "KINDS": "types",
    "STATUSES": "types",
    "PASSED": "types",
    "FAILED": "types",
    "ERROR": "types",
    "TIMEOUT": "types",
    "MEMORY": "types",
    "OUTPUT_LIMIT": "types",
    "SKIPPED": "types",
}


def __getattr__(name):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'fastcrit.sandbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))


def make_pool(config=None):
    """The backend the config selects: the local pool or a SandboxFusion server (same async API)."""
    from .pool import SandboxPool
    from .remote import RemoteSandbox
    from .types import SandboxConfig

    config = config or SandboxConfig()
    if config.backend == "remote":
        return RemoteSandbox(config)
    return SandboxPool(config)


__all__ = sorted(list(_EXPORTS) + ["make_pool"])
