"""Choosing the implementation behind each public function, and what every Triton launch shares.

Every public function takes ``backend="auto" | "triton" | "torch"``:
- ``triton``: the Triton kernels. On CUDA tensors they compile; on CPU tensors they run only under
  the Triton interpreter (``TRITON_INTERPRET=1`` set before ``fastcrit_kernels`` is imported),
  which is how the tests exercise them on machines without a GPU.
- ``torch``: the fast CPU path (chunked plain torch, no interpreter), also correct on GPU.
- ``auto``: ``triton`` for CUDA tensors, ``torch`` otherwise. The environment variable
  ``FASTCRIT_KERNELS_BACKEND`` overrides ``auto``.
Two cases always take the torch path, whatever was asked: float64 inputs (the kernels compute in
fp32, and fp64 tiles would not fit a GPU's shared memory) and ``auto`` where triton is not
installed. ``backend="triton"`` without triton is an error.

Triton is optional (``pip install 'fastcrit-kernels[triton]'``; CUDA builds of torch on Linux
bring it): when ``import triton`` fails, ``jit`` turns each kernel into a stand-in that raises on
launch, and the torch path works alone.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch path needs neither
    triton = None
    tl = None

HAS_TRITON = triton is not None
BACKENDS = ("auto", "triton", "torch")
# The way out a call that needs triton names where it is missing.
INSTALL_TRITON = (
    "pip install 'fastcrit-kernels[triton]' (or 'fastcrit[triton]', or triton itself; a CUDA "
    "build of torch on Linux brings it), or use backend='torch' (or 'auto'), the CPU path"
)


class _KernelWithoutTriton:
    """What ``jit`` gives where triton is not installed: a kernel that explains itself on launch."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__

    def __getitem__(self, grid):
        raise RuntimeError(f"{self.__name__} is a Triton kernel and triton is not installed: {INSTALL_TRITON}")


def jit(fn=None, *, do_not_specialize=()):
    """``triton.jit`` where triton is installed, else a stand-in that raises on launch.

    ``do_not_specialize`` names integer arguments that must keep one compiled type whatever their
    value (Triton otherwise compiles a value of 1 as a constant and multiples of 16 apart): run-time
    flags, so that each kernel has exactly the variants its module lists."""

    def wrap(f):
        if not HAS_TRITON:
            return _KernelWithoutTriton(f)
        return triton.jit(f, do_not_specialize=list(do_not_specialize) or None)

    return wrap if fn is None else wrap(fn)


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def requested_backend(backend: str) -> str:
    """What a call asked for: ``backend``, with ``FASTCRIT_KERNELS_BACKEND`` in place of ``auto``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = os.environ.get("FASTCRIT_KERNELS_BACKEND", "auto")
        if backend not in BACKENDS:
            raise ValueError(f"FASTCRIT_KERNELS_BACKEND must be one of {BACKENDS}, got {backend!r}")
    return backend


def resolve_backend(backend: str, *tensors: torch.Tensor) -> str:
    """Return "triton" or "torch" for a call on ``tensors`` (any CUDA tensor makes it a GPU call)."""
    backend = requested_backend(backend)
    if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tensors):
        return "torch"
    on_cuda = any(t.is_cuda for t in tensors if isinstance(t, torch.Tensor))
    if backend == "auto":
        backend = "triton" if on_cuda and HAS_TRITON else "torch"
    if backend == "triton" and not HAS_TRITON:
        raise RuntimeError(f"backend='triton' needs triton, which is not installed: {INSTALL_TRITON}")
    if backend == "triton" and not on_cuda and not triton_interpreting():
        raise RuntimeError(
            "backend='triton' on CPU tensors needs TRITON_INTERPRET=1 set before importing "
            "fastcrit_kernels; use backend='torch' (or 'auto') for the fast CPU path"
        )
    return backend


def device_guard(t: torch.Tensor):
    """Launch on ``t``'s GPU rather than the current one; a no-op context on CPU."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def check_on_host(t: torch.Tensor) -> bool:
    """Whether to run a value check that needs ``t``'s data on the host.

    On CPU always. On a GPU such a check is a device-to-host sync on every call (and breaks CUDA
    graph capture), so it runs only with ``FASTCRIT_KERNELS_VALIDATE=1`` and never while a graph is
    being captured."""
    if not t.is_cuda:
        return True
    if os.environ.get("FASTCRIT_KERNELS_VALIDATE", "0") in ("", "0"):
        return False
    return not torch.cuda.is_current_stream_capturing()


# ----------------------------------------------------------------------------------------------
# Tile configurations of the GEMM kernels
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tile:
    """One launch configuration of a tiled kernel: constexpr block sizes and compiler options."""

    BLOCK_N: int
    BLOCK_V: int
    BLOCK_H: int
    num_warps: int
    num_stages: int

    def meta(self) -> dict:
        return dict(
            BLOCK_N=self.BLOCK_N,
            BLOCK_V=self.BLOCK_V,
            BLOCK_H=self.BLOCK_H,
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )


def autotuning() -> bool:
    """GPU launches pick the fastest of their tile configs (``FASTCRIT_KERNELS_AUTOTUNE=0``: the
    first one, which gives the same numbers run after run)."""
    return os.environ.get("FASTCRIT_KERNELS_AUTOTUNE", "1") not in ("", "0")


_TUNED: dict = {}


def tuned(kernel, tiles: tuple[Tile, ...], key: tuple[str, ...]):
    """``kernel`` wrapped in ``triton.autotune`` over ``tiles`` (the first only when autotuning is
    off), built once per (kernel, tiles). Launch it as ``tuned(...)[grid](*args)`` without the tile
    constexprs; ``grid`` may be a function of the chosen config's meta-parameters."""
    tiles = tiles if autotuning() else tiles[:1]
    cached = _TUNED.get((kernel, tiles))
    if cached is None:
        configs = [
            triton.Config(
                dict(BLOCK_N=t.BLOCK_N, BLOCK_V=t.BLOCK_V, BLOCK_H=t.BLOCK_H),
                num_warps=t.num_warps,
                num_stages=t.num_stages,
            )
            for t in tiles
        ]
        cached = _TUNED[(kernel, tiles)] = triton.autotune(configs=configs, key=list(key))(kernel)
    return cached


# ----------------------------------------------------------------------------------------------
# What a GPU launch can compile
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Variant:
    """One compilation a GPU launch can ask for: a kernel with the Triton type of every argument,
    the constexpr values and the compiler options. Each module lists all of its own in
    ``_gpu_variants()``, next to the launchers that choose them, and
    tests/kernels/test_gpu_compile.py compiles every one for sm_80 and sm_90a (no GPU needed)."""

    kernel: object  # the @jit function
    dtype: str  # "fp32" | "bf16" | "fp16": the float dtype this variant serves
    signature: dict  # argument name -> Triton type: "*bf16", "i32", "fp32", "constexpr", ...
    constexprs: dict  # constexpr argument name -> value
    aligned: tuple  # arguments a typical launch sees 16-aligned (every pointer, plus these ints)
    num_warps: int = 4
    num_stages: int = 3
    tensor_cores: bool = False  # a GEMM whose PTX must use mma / wgmma

    @classmethod
    def of(cls, kernel, dtype: str, pointers: dict, *, constexprs: dict, floats=(), aligned=(), **options) -> Variant:
        """Types: pointers as given (element types), ``floats`` fp32, constexprs, the rest i32."""
        names = list(inspect.signature(kernel.fn).parameters)
        sig = {}
        for name in names:
            if name in pointers:
                sig[name] = "*" + pointers[name]
            elif name in constexprs:
                sig[name] = "constexpr"
            else:
                sig[name] = "fp32" if name in floats else "i32"
        unknown = (set(pointers) | set(constexprs) | set(floats)) - set(names)
        if unknown:
            raise ValueError(f"{kernel.__name__} has no argument(s) {sorted(unknown)}")
        return cls(
            kernel, dtype, sig, dict(constexprs), tuple(sorted(set(pointers) | (set(aligned) & set(names)))), **options
        )

    @property
    def name(self) -> str:
        consts = ",".join(f"{k}={v}" for k, v in self.constexprs.items())
        return f"{self.kernel.__name__}[{self.dtype};{consts};w{self.num_warps}s{self.num_stages}]"
