"""fastcrit.sandbox: run untrusted generated code fast, isolated, and without being fooled.

Usable without torch (nothing here imports it). See docs/sandbox.md for what is and is not isolated.
"""
from .cache import ResultCache, job_key, normalise
from .jail import IsolationUnavailable, Probe, probe
from .pool import SandboxPool, SyncSandboxPool, run_jobs
from .remote import RemoteSandbox
from .types import (ERROR, FAILED, KINDS, MEMORY, OUTPUT_LIMIT, PASSED, SKIPPED, STATUSES, TIMEOUT, Job,
                    JobError, Result, SandboxConfig, TestResult)


def make_pool(config: SandboxConfig | None = None):
    """The backend the config selects: the local pool or a SandboxFusion server (same async API)."""
    config = config or SandboxConfig()
    if config.backend == "remote":
        return RemoteSandbox(config)
    return SandboxPool(config)


__all__ = [
    "ERROR", "FAILED", "KINDS", "MEMORY", "OUTPUT_LIMIT", "PASSED", "SKIPPED", "STATUSES", "TIMEOUT",
    "IsolationUnavailable", "Job", "JobError", "Probe", "RemoteSandbox", "Result", "ResultCache",
    "SandboxConfig", "SandboxPool", "SyncSandboxPool", "TestResult", "job_key", "make_pool", "normalise",
    "probe", "run_jobs",
]
