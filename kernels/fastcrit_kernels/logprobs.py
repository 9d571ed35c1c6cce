"""Log-probabilities of the labels straight from hidden states and the lm_head, without the
unfused path's ``[tokens, V]`` logits, log-softmax and gradient tensors.

    logp[n]    = log_softmax((hidden[n] @ weight.T + bias) / temperature)[labels[n]]
    entropy[n] = -sum_v p[n, v] log p[n, v]   (same distribution)

Both are computed with an online log-sum-exp over vocab chunks, and the backward recomputes the
logits chunk by chunk, so the extra memory is O(tokens x chunk) instead of O(tokens x V); or, on the
torch path when the logits fit in ``keep_bytes`` (4 GiB by default on a CPU, none on a GPU), the
forward keeps them, once (without the entropy: their exps, against a running max per block), and
the backward reads them instead of recomputing. Guarantees and departures:

- Log-probs are clamped to <= 0 and entropies to >= 0 (rounding can otherwise give +1e-7 for a
  token with probability ~1; some fused kernels in the wild return positive log-probs).
- Padded vocab columns enter the log-sum-exp as -inf, never as 0.
- The entropy gradient is computed from the logits, ``dH/dz_v = -p_v (z_v - lse + H)``, which is
  finite where ``p_v`` underflows to 0 (the ``p log p`` form gives NaN there).
- Logits of -inf (a bias masking tokens) are exact: such a token has log-prob -inf and adds 0 to
  the entropy (0 log 0 = 0) and to every gradient, also where a whole tile, chunk or vocab split
  holds nothing else (the online log-sum-exp shifts by 0 while its running max is -inf). A row
  whose logits are all -inf gives NaN, as torch's log_softmax does.
- Labels equal to ``ignore_index`` give log-prob 0, entropy 0 and no gradient. Any other label
  outside ``[0, V)`` is an error on CPU, and NaN on a GPU unless FASTCRIT_KERNELS_VALIDATE=1 (the
  check needs a device sync).
- Log-sum-exp and softmax math are in fp32; outputs are fp32; gradients come back in the dtype of
  each input. fp64 inputs always run the torch path, in fp64 end to end (fp64 tiles would not fit a
  GPU's shared memory). With bf16/fp16 inputs the torch path upcasts the weight to fp32 one vocab
  chunk at a time.
- Triton GEMMs take their operands in the inputs' dtype (bf16/fp16: tensor cores) and accumulate
  in fp32. fp32 operands use exact fp32 ("ieee", no tensor cores) unless TF32 is asked for
  (``allow_tf32=True`` or FASTCRIT_KERNELS_ALLOW_TF32=1). Mixed hidden/weight dtypes are promoted
  to one (a copy of the narrower tensor).
- The Triton backward computes d_logits tile by tile in a kernel and stores it in the inputs'
  dtype, then leaves the two GEMMs ``d_hidden += d_logits @ W_chunk`` and ``d_W_chunk = d_logits^T
  @ hidden`` to torch, one vocab chunk at a time, with operands in that dtype and fp32 accumulation
  (as verl's fused linear kernels do): d_hidden accumulates over chunks in fp32 (on CUDA via
  ``torch.mm(..., out_dtype=torch.float32)`` where torch has it, else each chunk's product is
  rounded once), d_W rows come from one GEMM each and are rounded once to the weight's dtype.
- GPU launches are autotuned over a few tile configs (see ``_TILES_16BIT`` / ``_TILES_FP32``) on
  their first call for each (H, dtype): run one step before capturing a CUDA graph. Nothing else
  on the Triton path syncs with the host.
- Cost: forward + backward is four [N, H] x [H, V]-sized products (logits, recomputed logits,
  d_hidden, d_W) against three for the unfused path, which keeps its logits; with the logits kept
  (``keep_bytes``) it is the same three. See benchmarks/bench_fused_logprobs.py.
"""

from __future__ import annotations

import math
import os
import re

import torch

from fastcrit_kernels._dispatch import (
    Tile,
    Variant,
    check_on_host,
    device_guard,
    requested_backend,
    resolve_backend,
    triton,
    tuned,
)
from fastcrit_kernels._fused_linear_torch import compute_dtype
from fastcrit_kernels._logprobs_kernels import _logprobs_bwd_dlogits_kernel, _logprobs_fwd_kernel
from fastcrit_kernels._logprobs_torch import _torch_backward, _torch_forward
from fastcrit_kernels._reference import logprobs_reference as logprobs_reference  # re-exported: callers import it here

# Bytes of logits one chunk may hold. The torch path keeps two fp32 [chunk_tokens, V] buffers alive,
# the Triton backward one [tokens, chunk_vocab] d_logits buffer in the inputs' dtype.
CPU_CHUNK_BYTES = 64 * 1024 * 1024
GPU_CHUNK_BYTES = 512 * 1024 * 1024
# Bytes of logits the torch path keeps from the forward for the backward instead of recomputing them
# (``fused_logprobs(keep_bytes=...)``). On a CPU the recompute is a fourth GEMM of the same size as
# the three every path does, while the kept logits are still a third of what the unfused path holds;
# on a GPU the kernel exists to keep [N, V] out of memory, so nothing is kept by default.
CPU_KEEP_BYTES = 4 * 1024**3
GPU_KEEP_BYTES = 0

# GPU tile configs, autotuned once per (H, dtype, dot precision); the first is the default (and the
# only one with FASTCRIT_KERNELS_AUTOTUNE=0). Each compiles for sm_80 and sm_90a within the A100's
# shared memory and without register spills: tests/kernels/test_gpu_compile.py checks that by
# compiling every one (compile only; their speed has not been measured here).
_TILES_16BIT = (
    Tile(BLOCK_N=64, BLOCK_V=128, BLOCK_H=64, num_warps=8, num_stages=3),
    Tile(BLOCK_N=128, BLOCK_V=128, BLOCK_H=64, num_warps=16, num_stages=2),  # 3 stages spill on sm_90
    Tile(BLOCK_N=64, BLOCK_V=256, BLOCK_H=64, num_warps=16, num_stages=3),
)
_TILES_FP32 = (
    Tile(BLOCK_N=32, BLOCK_V=64, BLOCK_H=32, num_warps=4, num_stages=3),
    Tile(BLOCK_N=64, BLOCK_V=128, BLOCK_H=32, num_warps=8, num_stages=3),
)
_TUNE_KEY = ("H", "DOT_PRECISION")


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _on_gpu(t: torch.Tensor) -> bool:
    """Whether a launch takes the GPU configs (autotuned tiles); the interpreter takes one small tile.
    (A test points this at CPU tensors to run the GPU launch code under the interpreter.)"""
    return t.is_cuda


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _gemm_aligned(h: torch.Tensor, w: torch.Tensor) -> bool:
    """H and both row strides multiples of 16 elements, rows 16-byte aligned: what every LLM's
    hidden size gives, what the GPU kernels are compiled for in tests/kernels/test_gpu_compile.py,
    and what lets their loads pipeline. Anything else takes the torch path on a GPU."""
    return all(t.shape[1] % 16 == 0 and t.stride(0) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (h, w))


def _gpu_tiles(dtype: torch.dtype) -> tuple[Tile, ...]:
    return _TILES_16BIT if dtype in (torch.bfloat16, torch.float16) else _TILES_FP32


def _interpreter_tile(H: int) -> Tile:
    """The one config of the interpreter: small tiles keep the CPU tests fast and deterministic."""
    return Tile(BLOCK_N=16, BLOCK_V=64, BLOCK_H=max(16, min(64, triton.next_power_of_2(H))), num_warps=4, num_stages=1)


def _dot_precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    """tl.dot's input_precision: exact fp32 ("ieee", no tensor cores) unless TF32 is allowed.
    bf16/fp16 operands always take the tensor cores; they get "ieee" so that one compiled kernel
    serves both settings."""
    return "tf32" if allow_tf32 and dtype == torch.float32 else "ieee"


def _vocab_step(h: torch.Tensor) -> int:
    """Vocab splits and chunks are multiples of every config's BLOCK_V."""
    if _on_gpu(h):
        return max(t.BLOCK_V for t in _gpu_tiles(h.dtype))
    return _interpreter_tile(h.shape[1]).BLOCK_V


def _launch(kernel, h: torch.Tensor, grid, args, precision: str) -> None:
    """``kernel[grid(BLOCK_N, BLOCK_V)](*args)``: autotuned over the GPU tiles on a GPU, with the
    interpreter's one tile on CPU."""
    if _on_gpu(h):
        with device_guard(h):
            tuned(kernel, _gpu_tiles(h.dtype), _TUNE_KEY)[lambda meta: grid(meta["BLOCK_N"], meta["BLOCK_V"])](
                *args, DOT_PRECISION=precision, UPCAST=False
            )
    else:
        t = _interpreter_tile(h.shape[1])
        kernel[grid(t.BLOCK_N, t.BLOCK_V)](*args, DOT_PRECISION=precision, UPCAST=True, **t.meta())


def _triton_forward(h, w, b, labels, inv_t, ignore_index, with_ent, precision):
    """h and w share one dtype (fp32, bf16 or fp16); b is fp32 [V]."""
    N, H = h.shape
    V = w.shape[0]
    dev = h.device
    step = _vocab_step(h)
    v_blocks = triton.cdiv(V, step)
    # Split the vocabulary over programs so that few tokens still fill the GPU (about 4 programs
    # per SM at the default tile); the interpreter uses 2 splits so the tests cover the combine step.
    if _on_gpu(h):
        sms = _sm_count(dev)
        n_blocks = triton.cdiv(N, _gpu_tiles(h.dtype)[0].BLOCK_N)
        splits = max(1, min(v_blocks, triton.cdiv(4 * sms, max(n_blocks, 1))))
    else:
        splits = min(2, v_blocks)
    v_split = triton.cdiv(v_blocks, splits) * step
    splits = triton.cdiv(V, v_split)
    part = torch.empty(4, splits, max(N, 1), device=dev, dtype=torch.float32)
    if N > 0:
        _launch(
            _logprobs_fwd_kernel,
            h,
            lambda block_n, _: (triton.cdiv(N, block_n), splits),
            (h, w, b, labels, part[0], part[1], part[2], part[3], N, V, H, v_split, h.stride(0), w.stride(0), inv_t),
            precision,
        )
    m_s, s0_s, s1_s, zl_s = part[:, :, :N]
    lse, ent = merge_splits(m_s, s0_s, s1_s, with_ent)
    valid = labels != ignore_index
    lp = torch.where(valid, (zl_s.sum(0) - lse).clamp_(max=0.0), 0.0)
    ent = torch.where(valid, ent, 0.0) if with_ent else torch.zeros_like(lse)
    return lp, lse, ent


def merge_splits(m_s, s0_s, s1_s, with_ent):
    """Per-split [S, N] running max, sum exp(z - m) and sum exp(z - m) z -> (lse [N], entropy [N]
    clamped to >= 0, or None without ``with_ent``)."""
    m = m_s.amax(dim=0)
    scale = torch.exp(m_s - m)  # a split of only -inf logits (m_s = -inf, sums 0) weighs 0
    s0 = (s0_s * scale).sum(0)
    lse = m + s0.log()
    if not with_ent:
        return lse, None
    s1 = (s1_s * scale).sum(0)
    return lse, (lse - s1 / s0).clamp_(min=0.0)


# torch.mm(a, b, out_dtype=torch.float32): a bf16/fp16 GEMM with an fp32 result (cuBLAS accumulates
# in fp32 either way); the overload came with pytorch#150812 (torch 2.8) and works on CUDA only.
# Ran on an H100 (torch 2.11); on machines without a GPU the tests exercise the CPU fallback below.
_MM_OUT_DTYPE = "dtype" in torch.ops.aten.mm.overloads()
# torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc): the same GEMM adding into an fp32 acc in
# its epilogue (cuBLAS beta = 1), so no fp32 product the size of acc is written and read back. The
# overload came with the one above, but until pytorch#167931 (torch 2.10) it refused an fp32 acc for
# 16-bit operands, hence the version floor. Liger's fused linear cross entropy accumulates its fp32
# d_W this way (torch >= 2.8 there).
_ADDMM_OUT_DTYPE = (
    _MM_OUT_DTYPE
    and "dtype_out" in torch.ops.aten.addmm.overloads()
    and tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2]) >= (2, 10)
)


def _add_mm_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool = False) -> None:
    """acc (fp32) += a @ b (``first``: acc = a @ b, acc's old values unread), with a and b in the
    GEMM dtype; the GEMM itself accumulates in fp32."""
    if a.dtype == torch.float32:
        torch.mm(a, b, out=acc) if first else acc.addmm_(a, b)
    elif a.is_cuda and _ADDMM_OUT_DTYPE:
        if first:
            torch.mm(a, b, torch.float32, out=acc)
        else:
            torch.addmm(acc, a, b, torch.float32, out=acc)
    elif a.is_cuda and _MM_OUT_DTYPE:
        r = torch.mm(a, b, out_dtype=torch.float32)
        acc.copy_(r) if first else acc.add_(r)
    else:  # CPU (the interpreter's tests) or an older torch: this chunk's product is rounded once
        r = torch.mm(a, b)
        acc.copy_(r) if first else acc.add_(r)


def _triton_backward(h, w, b, labels, lse, ent, g_lp, g_ent, inv_t, need_w, need_b, chunk_bytes, precision):
    """d_hidden [N, H] fp32, d_weight [V, H] in w's dtype or None, d_bias [V] fp32 or None.

    d_logits is stored in the inputs' dtype, one vocab chunk at a time, and both gradient GEMMs take
    it with h or w as operands in that dtype (tensor cores for bf16/fp16) with fp32 accumulation:
    d_hidden accumulates over the chunks in fp32; each chunk's rows of d_weight come from one GEMM
    over all tokens, rounded once to w's dtype."""
    N, H = h.shape
    V = w.shape[0]
    dev = h.device
    d_h = torch.zeros(N, H, device=dev, dtype=torch.float32)
    d_w = (torch.empty if N else torch.zeros)(V, H, device=dev, dtype=w.dtype) if need_w else None
    d_b = torch.zeros(V, device=dev, dtype=torch.float32) if need_b else None
    if N == 0:
        return d_h, d_w, d_b
    step = _vocab_step(h)
    vc = max(step, (chunk_bytes // (h.element_size() * N)) // step * step)
    vc = min(vc, triton.cdiv(V, step) * step)
    dz = torch.empty(N, vc, device=dev, dtype=h.dtype)
    for v0 in range(0, V, vc):
        v1 = min(v0 + vc, V)
        _launch(
            _logprobs_bwd_dlogits_kernel,
            h,
            lambda block_n, block_v: (triton.cdiv(N, block_n), triton.cdiv(v1 - v0, block_v)),
            (h, w, b, labels, lse, ent, g_lp, g_ent, dz, N, H, v0, v1, h.stride(0), w.stride(0), dz.stride(0), inv_t),
            precision,
        )
        d = dz[:, : v1 - v0]
        if not d.is_cuda and not d.is_contiguous():
            # A narrower last chunk leaves unwritten columns after each row. torch's bf16 GEMM on
            # CPUs with AMX / AVX512-BF16 reads past K into them (NaN there gives 0 * NaN = NaN in
            # d_hidden: measured, torch 2.13); cuBLAS keeps to the leading dimension.
            d = d.contiguous()
        _add_mm_fp32(d_h, d, w[v0:v1])
        if need_w:
            torch.mm(d.t(), h, out=d_w[v0:v1])
        if need_b:
            torch.sum(d, dim=0, dtype=torch.float32, out=d_b[v0:v1])
    return d_h, d_w, d_b


def _gpu_variants() -> list[Variant]:
    """Every compilation a GPU launch of this module can ask for (see ``Variant``)."""
    out = []
    for dtype, precisions in (("fp32", ("ieee", "tf32")), ("bf16", ("ieee",)), ("fp16", ("ieee",))):
        tiles = _gpu_tiles(getattr(torch, {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]))
        for kernel, pointers in (
            (
                _logprobs_fwd_kernel,
                dict(
                    h_ptr=dtype,
                    w_ptr=dtype,
                    b_ptr="fp32",
                    labels_ptr="i64",
                    m_ptr="fp32",
                    s0_ptr="fp32",
                    s1_ptr="fp32",
                    zl_ptr="fp32",
                ),
            ),
            (
                _logprobs_bwd_dlogits_kernel,
                dict(
                    h_ptr=dtype,
                    w_ptr=dtype,
                    b_ptr="fp32",
                    labels_ptr="i64",
                    lse_ptr="fp32",
                    ent_ptr="fp32",
                    glp_ptr="fp32",
                    gent_ptr="fp32",
                    dz_ptr=dtype,
                ),
            ),
        ):
            for precision in precisions:
                for t in tiles:
                    out.append(
                        Variant.of(
                            kernel,
                            dtype,
                            pointers,
                            floats=("inv_t",),
                            aligned=("H", "stride_hn", "stride_wv", "stride_dzn"),
                            constexprs=dict(
                                DOT_PRECISION=precision,
                                UPCAST=False,
                                BLOCK_N=t.BLOCK_N,
                                BLOCK_V=t.BLOCK_V,
                                BLOCK_H=t.BLOCK_H,
                            ),
                            num_warps=t.num_warps,
                            num_stages=t.num_stages,
                            tensor_cores=dtype != "fp32" or precision == "tf32",
                        )
                    )
    return out


# ----------------------------------------------------------------------------------------------
# Autograd (the chunked torch path, the fast CPU path, is in _logprobs_torch.py)
# ----------------------------------------------------------------------------------------------
class _FusedLogprobs(torch.autograd.Function):
    # Both passes run with autocast off: the kernel picks its own compute dtype from its inputs, and
    # a caller's autocast region (a bf16 training loop) would otherwise send the torch path's chunk
    # products to bf16 behind its back (and its fp32 buffers would refuse their bf16 results).
    @staticmethod
    def forward(
        ctx, hidden, weight, bias, labels, inv_t, ignore_index, with_ent, backend, chunk_bytes, precision, keep
    ):
        kept = shifts = None
        with torch.autocast(hidden.device.type, enabled=False):
            if backend == "triton":
                lp, lse, ent = _triton_forward(hidden, weight, bias, labels, inv_t, ignore_index, with_ent, precision)
            else:
                lp, lse, ent, kept, shifts = _torch_forward(
                    hidden, weight, bias, labels, inv_t, ignore_index, with_ent, chunk_bytes, keep
                )
        ctx.save_for_backward(hidden, weight, bias, labels, lse, ent, kept, shifts)
        ctx.inv_t, ctx.ignore_index, ctx.with_ent = inv_t, ignore_index, with_ent
        ctx.backend, ctx.chunk_bytes, ctx.precision = backend, chunk_bytes, precision
        ctx.device_type = hidden.device.type
        # An output that does not reach the loss gets None (not zeros), so e.g. an entropy kept only
        # for logging adds no work to the backward.
        ctx.set_materialize_grads(False)
        if not with_ent:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        with torch.autocast(ctx.device_type, enabled=False):
            return _FusedLogprobs._backward(ctx, g_lp, g_ent)

    @staticmethod
    def _backward(ctx, g_lp, g_ent):
        none = (None,) * 11
        hidden, weight, bias, labels, lse, ent, kept, shifts = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if not (need_h or need_w or need_b):
            return none
        valid = labels != ctx.ignore_index
        cd = lse.dtype
        if g_lp is None and (g_ent is None or not ctx.with_ent):
            return none
        g_lp = torch.zeros_like(lse) if g_lp is None else torch.where(valid, g_lp.to(cd), 0.0)
        if ctx.with_ent and g_ent is not None:
            g_ent = torch.where(valid, g_ent.to(cd), 0.0)
        else:
            g_ent = None
        if ctx.backend == "triton":
            # the kernel always takes the entropy's terms: zeros add nothing
            g_ent = torch.zeros_like(lse) if g_ent is None else g_ent.contiguous()
            d_h, d_w, d_b = _triton_backward(
                hidden,
                weight,
                bias,
                labels,
                lse,
                ent,
                g_lp.contiguous(),
                g_ent,
                ctx.inv_t,
                need_w,
                need_b,
                ctx.chunk_bytes,
                ctx.precision,
            )
        else:
            safe = torch.where(valid, labels, torch.zeros_like(labels))
            d_h, d_w, d_b = _torch_backward(
                hidden,
                weight,
                bias,
                safe,
                lse,
                ent,
                g_lp,
                g_ent,
                ctx.inv_t,
                need_w,
                need_b,
                ctx.chunk_bytes,
                kept,
                shifts,
            )
        return (
            d_h.to(hidden.dtype) if need_h else None,
            d_w.to(weight.dtype) if need_w else None,
            d_b.to(bias.dtype) if need_b else None,
        ) + none[3:]


# ----------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------
def keeps_logits(N: int, V: int, h: torch.Tensor, w: torch.Tensor, b, keep_bytes: int) -> bool:
    """Whether the torch path keeps the ``[N, V]`` logits of ``h`` x ``w`` under ``keep_bytes``."""
    itemsize = torch.finfo(compute_dtype(h, w, b)).bits // 8  # the dtype the torch path computes in
    return keep_bytes > 0 and N * V * itemsize <= keep_bytes


def _cublas_is_faster(backend: str, h: torch.Tensor, gemm_dtype: torch.dtype, allow_tf32: bool) -> bool:
    """``auto`` on a GPU with exact fp32 (no TF32): the torch path, whose chunked GEMMs are cuBLAS's.
    Triton's exact-fp32 ``tl.dot`` runs on the CUDA cores at about half cuBLAS's fp32 rate
    (benchmarks/bench_fused_logprobs.py on a GPU; the figures: benchmarks/README.md, "On a GPU").
    bf16 / fp16, and fp32 with TF32, keep the kernels; ``backend="triton"`` asks for them."""
    return requested_backend(backend) == "auto" and _on_gpu(h) and gemm_dtype == torch.float32 and not allow_tf32


def _check_inputs(hidden, weight, labels, temperature, bias):
    if not isinstance(hidden, torch.Tensor) or hidden.dim() < 1:
        raise ValueError("hidden must be a tensor [..., H]")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be [V, H], got shape {tuple(getattr(weight, 'shape', ()))}")
    if hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden [..., H={hidden.shape[-1]}] does not match weight [V, H={weight.shape[1]}]")
    if weight.shape[0] < 1:
        raise ValueError("weight must have at least one vocab row")
    if not isinstance(labels, torch.Tensor) or labels.shape != hidden.shape[:-1]:
        raise ValueError(
            f"labels must have shape {tuple(hidden.shape[:-1])} (hidden without its last "
            f"dim), got {tuple(getattr(labels, 'shape', ()))}"
        )
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor, got {labels.dtype}")
    if not hidden.is_floating_point() or not weight.is_floating_point():
        raise ValueError(f"hidden and weight must be floating point, got {hidden.dtype}, {weight.dtype}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"bias must be [V={weight.shape[0]}], got {tuple(bias.shape)}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    devs = {t.device for t in (hidden, weight, labels, bias) if t is not None}
    if len(devs) != 1:
        raise ValueError(f"hidden, weight, labels and bias must be on one device, got {devs}")


def fused_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    bias: torch.Tensor | None = None,
    return_entropy: bool = False,
    ignore_index: int = -100,
    backend: str = "auto",
    chunk_bytes: int | None = None,
    allow_tf32: bool | None = None,
    keep_bytes: int | None = None,
):
    """Log-probs (and entropies) of ``labels`` under ``softmax((hidden @ weight.T + bias) / T)``.

    Args:
        hidden: ``[..., H]`` hidden states (fp32, bf16, fp16 or fp64).
        weight: ``[V, H]`` lm_head weight.
        labels: ``[...]`` integer token ids in ``[0, V)``, or ``ignore_index``.
        temperature: divides the logits (sampling temperature), > 0.
        bias: optional ``[V]`` lm_head bias; ``-inf`` entries mask tokens out.
        return_entropy: also return the entropy ``[...]`` of each token's distribution.
        backend: ``"auto" | "triton" | "torch"`` (see ``fastcrit_kernels._dispatch``); fp64 inputs
            always take the torch path.
        chunk_bytes: bytes of logits one chunk may hold (default: 64 MiB on CPU, 512 MiB on GPU).
        allow_tf32: fp32 inputs on the Triton path: TF32 tensor cores for the logits GEMM instead of
            exact fp32 (default: ``FASTCRIT_KERNELS_ALLOW_TF32=1``, else off). bf16/fp16 inputs
            always use the tensor cores; the torch GEMMs follow torch's own TF32 setting.
        keep_bytes: the torch path keeps all the logits from the forward for the backward when they
            fit in this many bytes (``N x V`` in the compute dtype) and a gradient will be taken:
            three GEMMs, as the unfused path, and the logits' memory once (not its two or three
            ``[N, V]`` tensors). Above it, or 0, the backward recomputes each chunk's logits: four
            GEMMs and O(N x chunk) memory. Default: 4 GiB on CPU (Qwen2.5's vocabulary at 4k
            tokens in fp32 is 2.3 GiB), 0 on a GPU (there the memory is what the kernel saves).

    Returns:
        ``logp [...]`` fp32 (fp64 for fp64 inputs), 0 where ignored; with ``return_entropy`` a pair
        ``(logp, entropy)``. Differentiable in ``hidden``, ``weight`` and ``bias``. A label outside
        ``[0, V)`` raises on CPU; on a GPU the check would cost a device sync on every call, so it
        runs only with ``FASTCRIT_KERNELS_VALIDATE=1`` and such a label otherwise gives NaN.
    """
    _check_inputs(hidden, weight, labels, temperature, bias)
    which = resolve_backend(backend, hidden, weight, bias)
    lead = hidden.shape[:-1]
    H = hidden.shape[-1]
    V = weight.shape[0]
    h2 = hidden.reshape(-1, H)
    if h2.stride(-1) != 1:
        h2 = h2.contiguous()
    w2 = weight if weight.stride(-1) == 1 else weight.contiguous()
    lab = labels.reshape(-1).to(torch.int64)
    bad = (lab != ignore_index) & ((lab < 0) | (lab >= V))
    if check_on_host(lab):
        if bool(bad.any()):
            first = int(lab[bad][0])
            raise ValueError(f"labels must lie in [0, V={V}) or equal ignore_index={ignore_index}; got {first}")
        bad = None
    if chunk_bytes is None:
        chunk_bytes = GPU_CHUNK_BYTES if hidden.is_cuda else CPU_CHUNK_BYTES
    if allow_tf32 is None:
        allow_tf32 = os.environ.get("FASTCRIT_KERNELS_ALLOW_TF32", "0") not in ("", "0")
    if keep_bytes is None:
        keep_bytes = GPU_KEEP_BYTES if hidden.is_cuda else CPU_KEEP_BYTES
    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias)
    )  # a no-grad pass (reference, old log-probs) keeps nothing
    precision = None
    if which == "triton":
        # One dtype for both GEMM operands (a mixed pair is promoted, copying the smaller side) and
        # an fp32 bias (zeros without one): fewer kernel variants, each one compile-checked.
        gd = torch.promote_types(h2.dtype, w2.dtype)
        h2, w2 = h2.to(gd), w2.to(gd)
        if _on_gpu(h2) and not _gemm_aligned(h2, w2):
            which = "torch"
    if which == "triton" and _cublas_is_faster(backend, h2, gd, bool(allow_tf32)):
        which = "torch"
    if which == "triton":
        bias = torch.zeros(V, device=w2.device) if bias is None else bias.float().contiguous()
        lab = lab.contiguous()
        precision = _dot_precision(gd, bool(allow_tf32))
    lp, ent = _FusedLogprobs.apply(
        h2,
        w2,
        bias,
        lab,
        1.0 / float(temperature),
        int(ignore_index),
        bool(return_entropy),
        which,
        int(chunk_bytes),
        precision,
        wants_grad and keeps_logits(h2.shape[0], V, h2, w2, bias, int(keep_bytes)),
    )
    if bad is not None:  # unchecked on the GPU: an out-of-range label gives NaN, not a wrong number
        lp = torch.where(bad, float("nan"), lp)
    lp = lp.reshape(lead)
    if return_entropy:
        return lp, ent.reshape(lead)
    return lp
