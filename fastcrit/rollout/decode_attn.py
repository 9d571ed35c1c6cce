"""The native engine's CPU decode attention in C (``native/decode_attn.c``, built by ``pip install``
into ``fastcrit/rollout/_native/lib``), called through ctypes.

One call does a decode step's attention for every row and KV head of a layer: it writes the step's
key and value into the row's generated cache, takes the scores over the prompt's shared cache and
the row's own, one softmax and the weighted values, on torch's threads. In torch ops the same step
is four batched products of tiny matrices, a concatenation, a softmax and the copies that stack a
prompt's rows; the C pass does it in about half their time (the A/B figures: docs/LOG.md), with the
same results to fp32 rounding (tests/rollout/test_decode_attn.py).

It stores keys in blocks of 16, each block transposed (``[.., columns / 16, d, 16]``, the columns
padded to a multiple of 16; ``key_cache`` / ``store_keys``): ``StaticDecoder`` keeps its key caches in
that layout when ``usable`` says this path applies. ``FASTCRIT_DECODE_ATTN=0``
turns it off (the torch ops then run, as they do where the library was not built).
"""

from __future__ import annotations

import ctypes
import os
import warnings

import torch

ABI = 1  # native/decode_attn.c's fc_decode_attn_abi(): the arguments and layouts this module passes
BLOCK = 16  # columns of a transposed key cache come in multiples of this
MAX_HEAD_DIM = 512
_LIB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native", "lib", "libfastcrit_decode_attn.so")
_lib = None  # the loaded library; False once loading failed


def _load():
    global _lib
    if _lib is None:
        _lib = False
        if os.path.isfile(_LIB_PATH):
            try:
                lib = ctypes.CDLL(_LIB_PATH)
            except OSError:
                return False  # e.g. built for another machine's libc: the torch ops run
            abi = getattr(lib, "fc_decode_attn_abi", None)
            found = abi() if abi is not None else None
            if found != ABI:  # built from another version of decode_attn.c: calling it could crash
                warnings.warn(
                    f"{_LIB_PATH} has interface {found}, this fastcrit needs {ABI}: the decode attention "
                    "runs in torch ops until the library is rebuilt (pip install -e . or make install)",
                    stacklevel=2,
                )
                return False
            v, i, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
            lib.fc_decode_attn.argtypes = (
                [v, i, v, i, v, i]  # q, k_new, v_new, each with its row stride
                + [v, i, v, v, v]  # the prompt's keys and their padded width, values, bias, group
                + [v, v, i, i, v]  # the generated keys and values, their capacity, t, out
                + [i, i, i, i, i, f]  # rows, kv, g, d, P, scale
                + [v, ctypes.c_int]  # scratch, threads
            )
            lib.fc_decode_attn.restype = ctypes.c_int
            _lib = lib
    return _lib


def available() -> bool:
    """Whether the library was built and loads (and ``FASTCRIT_DECODE_ATTN`` is not 0)."""
    return os.environ.get("FASTCRIT_DECODE_ATTN", "1") != "0" and bool(_load())


def usable(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """Whether a decoder of this dtype, device and head size can use it: fp32 on a CPU, head sizes
    in multiples of 16 up to 512."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and head_dim % BLOCK == 0
        and head_dim <= MAX_HEAD_DIM
        and available()
    )


def padded(n: int) -> int:
    """``n`` rounded up to a multiple of ``BLOCK``."""
    return -(-n // BLOCK) * BLOCK


def key_cache(lead: tuple[int, ...], columns: int, d: int, dtype) -> torch.Tensor:
    """A zeroed key cache of ``columns`` keys (padded to a multiple of ``BLOCK``) of size ``d`` in the
    blocked layout, ``lead + (columns / BLOCK, d, BLOCK)``."""
    return torch.zeros(lead + (padded(columns) // BLOCK, d, BLOCK), dtype=dtype)


def store_keys(cache: torch.Tensor, k: torch.Tensor) -> None:
    """Write keys ``k`` [.., n, d] into the first n columns of a blocked ``cache`` (those past n in
    the last block get zeros)."""
    n = k.shape[-2]
    full = padded(n) // BLOCK
    if n != full * BLOCK:
        k = torch.nn.functional.pad(k, (0, 0, 0, full * BLOCK - n))
    cache[..., :full, :, :].copy_(k.unflatten(-2, (full, BLOCK)).transpose(-1, -2))


def _rows(x: torch.Tensor, heads: int, d: int) -> tuple[torch.Tensor, int]:
    """``x`` ([rows, heads, 1, d] or [rows, heads, d]) as a tensor whose heads are contiguous within
    a row, and its row stride: a view where it already is one, else a copy."""
    x = x.reshape(x.shape[0], heads, d) if x.dim() == 4 else x
    if x.stride(2) != 1 or x.stride(1) != d:
        x = x.contiguous()
    return x, x.stride(0)


def attend(q, k, v, kp_t, vp, bias_p, group, kg_t, vg, t: int, scale: float, scratch: torch.Tensor) -> torch.Tensor:
    """Decode step ``t``'s attention for every row and KV head (see the module docstring).

    q [rows, heads, 1, d]; k, v [rows, kv, 1, d]; kp_t the prompt's keys ([prompts, kv, Pl / 16,
    d, 16], ``key_cache``); vp [prompts, kv, P, d]; bias_p [prompts, P]; group [rows] (int64: each
    row's prompt, which the caller keeps in range); kg_t [rows, kv, cap / 16, d, 16] and vg [rows,
    kv, cap, d], whose key / value t this call writes; scratch: at least ``threads * 2 * (Pl + cap)``
    floats. All fp32 on the CPU but group. Returns [rows, heads, d]."""
    rows, heads, _, d = q.shape
    kv, P = vp.shape[1], vp.shape[2]
    cap, pl = vg.shape[2], kp_t.shape[2] * BLOCK
    q, qs = _rows(q, heads, d)
    k, ks = _rows(k, kv, d)
    v, vs = _rows(v, kv, d)
    prompts = vp.shape[0]
    shapes = {
        "kp_t": (kp_t, (prompts, kv, pl // BLOCK, d, BLOCK)),
        "bias_p": (bias_p, (prompts, P)),
        "group": (group, (rows,)),
        "k": (k, (rows, kv, d)),
        "v": (v, (rows, kv, d)),
        "kg_t": (kg_t, (rows, kv, cap // BLOCK, d, BLOCK)),
        "vg": (vg, (rows, kv, cap, d)),
        "vp": (vp, (prompts, kv, P, d)),
        "scratch": (scratch, (scratch.numel(),)),
    }
    # the C kernel reads raw pointers: a wrong dtype, device or shape is refused here, not read
    for name, (x, shape) in shapes.items():
        want = torch.int64 if name == "group" else torch.float32
        if x.dtype != want or x.device.type != "cpu" or tuple(x.shape) != shape:
            raise ValueError(
                f"decode_attn.attend: {name} is {x.dtype} {tuple(x.shape)} on {x.device}, "
                f"expected {want} {shape} on cpu"
            )
    if q.dtype != torch.float32 or q.device.type != "cpu":
        raise ValueError(f"decode_attn.attend: q is {q.dtype} on {q.device}, expected float32 on cpu")
    threads = torch.get_num_threads()
    if scratch.numel() < threads * 2 * (pl + cap):
        raise ValueError(
            f"decode_attn.attend: scratch holds {scratch.numel()} floats, needs {threads * 2 * (pl + cap)}"
        )
    for name, x in (("kp_t", kp_t), ("vp", vp), ("bias_p", bias_p), ("group", group), ("kg_t", kg_t), ("vg", vg)):
        if not x.is_contiguous():
            raise ValueError(f"decode_attn.attend: {name} must be contiguous")
    out = torch.empty(rows, heads, d, dtype=q.dtype)
    rc = _load().fc_decode_attn(
        q.data_ptr(), qs, k.data_ptr(), ks, v.data_ptr(), vs,
        kp_t.data_ptr(), pl, vp.data_ptr(), bias_p.data_ptr(), group.data_ptr(),
        kg_t.data_ptr(), vg.data_ptr(), cap, t, out.data_ptr(), rows, kv, heads // kv, d, P, scale,
        scratch.data_ptr(), threads,
    )  # fmt: skip
    if rc != 0:
        raise ValueError(
            f"decode_attn.attend: shapes refused by the C kernel (d {d}, cap {cap}, Pl {pl}, P {P}, t {t})"
        )
    return out
