"""Backend choice and the checks that would cost a device sync on a GPU (fastcrit_kernels._dispatch)."""

import contextlib

import pytest
import torch

from fastcrit_kernels import _dispatch
from fastcrit_kernels._dispatch import check_on_host, device_guard, resolve_backend


class _OnGpu:
    """Stands in for a CUDA tensor where only ``is_cuda`` is asked (this machine may have no GPU)."""

    is_cuda = True


def test_host_checks_run_on_cpu_and_are_opt_in_on_gpu(monkeypatch):
    monkeypatch.delenv("FASTCRIT_KERNELS_VALIDATE", raising=False)
    assert check_on_host(torch.zeros(2))
    assert not check_on_host(_OnGpu())  # default on a GPU: no sync, so CUDA graphs can capture
    monkeypatch.setenv("FASTCRIT_KERNELS_VALIDATE", "1")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert check_on_host(_OnGpu())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not check_on_host(_OnGpu())  # never while a graph is being captured


def test_fp64_and_missing_triton_choose_torch(monkeypatch):
    x64 = torch.zeros(3, dtype=torch.float64)
    for backend in ("auto", "triton", "torch"):
        assert resolve_backend(backend, torch.zeros(3), x64) == "torch"
    monkeypatch.setattr(_dispatch, "HAS_TRITON", False)
    assert resolve_backend("auto", torch.zeros(3)) == "torch"
    with pytest.raises(RuntimeError, match=r"triton, which is not installed: pip install 'fastcrit-kernels\[triton\]'"):
        resolve_backend("triton", torch.zeros(3))


def test_device_guard_is_a_no_op_on_cpu():
    assert isinstance(device_guard(torch.zeros(1)), contextlib.nullcontext)
