"""Choosing the implementation behind each public function.

Every public function takes ``backend="auto" | "triton" | "torch"``:
- ``triton``: the Triton kernels. On CUDA tensors they compile; on CPU tensors they run only under
  the Triton interpreter (``TRITON_INTERPRET=1`` set before ``fastcrit_kernels`` is imported),
  which is how the tests exercise them on machines without a GPU.
- ``torch``: the fast CPU path (chunked plain torch, no interpreter), also correct on GPU.
- ``auto``: ``triton`` for CUDA tensors, ``torch`` otherwise. The environment variable
  ``FASTCRIT_KERNELS_BACKEND`` overrides ``auto``.
"""
from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "triton", "torch")


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(backend: str, *tensors: torch.Tensor) -> str:
    """Return "triton" or "torch" for a call on ``tensors`` (the first tensor decides the device)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = os.environ.get("FASTCRIT_KERNELS_BACKEND", "auto")
        if backend not in BACKENDS:
            raise ValueError(f"FASTCRIT_KERNELS_BACKEND must be one of {BACKENDS}, got {backend!r}")
    on_cuda = any(t.is_cuda for t in tensors if isinstance(t, torch.Tensor))
    if backend == "auto":
        return "triton" if on_cuda else "torch"
    if backend == "triton" and not on_cuda and not triton_interpreting():
        raise RuntimeError(
            "backend='triton' on CPU tensors needs TRITON_INTERPRET=1 set before importing "
            "fastcrit_kernels; use backend='torch' (or 'auto') for the fast CPU path"
        )
    return backend
