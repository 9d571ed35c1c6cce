"""Memory per phase of a step: ``memory/<phase>_peak_mb`` and ``memory/<phase>_current_mb``.

On CUDA these are the caching allocator's ``max_memory_allocated`` (its peak reset when the phase
starts) and ``memory_allocated`` when it ends, plus ``memory/<phase>_reserved_mb``
(``memory_reserved``: what the allocator holds from the driver, freed or not). On CPU they are the
process's resident set: ``VmRSS`` when the phase ends and ``VmHWM`` after resetting it when the
phase starts (Linux resets the high-water mark when "5" is written to ``/proc/self/clear_refs``).
Where that reset is refused, the peak is the process's peak so far and is logged as
``memory/<phase>_process_peak_mb`` instead, so the name says what it is.

What this does not cover: on CUDA, memory outside torch's allocator (NCCL buffers, SGLang's own
pool in its scheduler process) is not counted; on CPU, RSS counts every thread of the process (a
reward pool's threads included) and not child processes (sandbox workers, SGLang). Phases may nest
(an outer phase's peak includes its inner ones); a phase entered twice in a step reports the larger
peak and the last current value. Each measure reads ``/proc`` or the allocator's counters: cheap.
"""

from __future__ import annotations

import gc

import torch

_MB = 1 << 20


def proc_status_kb(*fields: str) -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in fields:
                out[name] = int(rest.split()[0])
    return out


def reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PhaseMemory:
    """Measures phases on ``device`` (``begin(name)`` ... ``end(name)``); ``metrics`` holds the
    ``memory/...`` values of the phases ended since the last ``clear()``."""

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.metrics: dict[str, float] = {}
        self._open: list[float] = []  # running peak (bytes) of each open phase, outermost first
        try:
            proc_status_kb("VmRSS")
            self.proc = True
        except OSError:  # not Linux: no /proc, nothing measured on CPU
            self.proc = False
        self.resettable = self.proc and not self.cuda and reset_rss_peak()

    def clear(self) -> None:
        self.metrics = {}

    def _peak(self) -> float:
        """Bytes: the peak since the last reset (or, unresettable, of the process)."""
        if self.cuda:
            return float(torch.cuda.max_memory_allocated(self.device))
        return proc_status_kb("VmHWM")["VmHWM"] * 1024.0

    def begin(self, name: str) -> None:
        if not (self.cuda or self.proc):
            return
        if self._open:  # what happened so far in the outer phases, before the reset wipes it
            p = self._peak()
            self._open = [max(o, p) for o in self._open]
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.resettable:
            reset_rss_peak()
        self._open.append(0.0)

    def end(self, name: str) -> None:
        if not (self.cuda or self.proc) or not self._open:
            return
        p = self._peak()
        peak = max(self._open.pop(), p)
        self._open = [max(o, p) for o in self._open]
        if self.cuda:
            current = float(torch.cuda.memory_allocated(self.device))
            self.metrics[f"memory/{name}_reserved_mb"] = torch.cuda.memory_reserved(self.device) / _MB
        else:
            current = proc_status_kb("VmRSS")["VmRSS"] * 1024.0
        key = f"memory/{name}_peak_mb" if self.cuda or self.resettable else f"memory/{name}_process_peak_mb"
        self.metrics[key] = max(self.metrics.get(key, 0.0), peak / _MB)
        self.metrics[f"memory/{name}_current_mb"] = current / _MB


def return_memory(device: str | torch.device) -> None:
    """Give the device memory nothing uses any more back to the driver, so that another process (an
    SGLang scheduler resuming its weights and KV cache) can allocate it: collect the reference
    cycles that keep freed models alive (FSDP2's hooks hold cycles through their modules), then
    empty the caching allocator, whose freed blocks no other process can use. On a CPU, nothing
    (no other process shares an allocator with this one)."""
    device = torch.device(device)
    if device.type != "cuda":
        return
    gc.collect()
    torch.cuda.empty_cache()
