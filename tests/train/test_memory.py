"""Memory per phase on CPU: the resident set, and the phase's own peak where Linux lets it be reset."""

import pytest
import torch

from fastcrit.train.memory import PhaseMemory

MB = 1 << 20


def _touch(mb: int) -> torch.Tensor:
    return torch.ones(mb * MB, dtype=torch.uint8)  # written, so resident


@pytest.mark.skipif(not PhaseMemory("cpu").proc, reason="needs Linux /proc")
def test_cpu_phase_peaks_current_and_nesting():
    """In a fresh process: in the test runner, what earlier tests left mapped can serve the 200 MB
    from pages already resident, which then never raise the peak."""
    import multiprocessing

    proc = multiprocessing.get_context("spawn").Process(target=_phases_in_a_fresh_process)
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0, "the phase checks failed in the child (its traceback is above)"


def _phases_in_a_fresh_process():
    mem = PhaseMemory("cpu")
    peak = "peak" if mem.resettable else "process_peak"
    mem.begin("big")
    x = _touch(200)
    del x  # freed inside the phase: its peak remembers it, its current does not
    mem.end("big")
    m = mem.metrics
    assert m[f"memory/big_{peak}_mb"] >= m["memory/big_current_mb"] + 150
    if mem.resettable:  # a later, smaller phase does not inherit the big one's peak
        mem.begin("small")
        mem.end("small")
        assert mem.metrics["memory/small_peak_mb"] < m["memory/big_peak_mb"] - 150
        # an outer phase's peak includes an inner phase that reset the counter
        mem.begin("outer")
        x = _touch(200)
        del x
        mem.begin("inner")
        mem.end("inner")
        mem.end("outer")
        assert mem.metrics["memory/outer_peak_mb"] >= mem.metrics["memory/inner_peak_mb"] + 150
    mem.clear()
    assert mem.metrics == {}
