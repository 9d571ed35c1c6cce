"""Log-probabilities of the labels straight from hidden states and the lm_head, never holding
the full ``[tokens, V]`` logits.

    logp[n]    = log_softmax((hidden[n] @ weight.T + bias) / temperature)[labels[n]]
    entropy[n] = -sum_v p[n, v] log p[n, v]   (same distribution)

Both are computed with an online log-sum-exp over vocab chunks (Triton) or token chunks (torch), and
the backward recomputes the logits chunk by chunk, so the extra memory is O(tokens x chunk) instead
of O(tokens x V). Guarantees and departures:

- Log-probs are clamped to <= 0 and entropies to >= 0 (rounding can otherwise give +1e-7 for a
  token with probability ~1; some fused kernels in the wild return positive log-probs).
- Padded vocab columns enter the log-sum-exp as -inf, never as 0.
- The entropy gradient is computed from the logits, ``dH/dz_v = -p_v (z_v - lse + H)``, which is
  finite where ``p_v`` underflows to 0 (the ``p log p`` form gives NaN there).
- Labels equal to ``ignore_index`` give log-prob 0, entropy 0 and no gradient. Any other label
  outside ``[0, V)`` is an error.
- Computation is in fp32 (fp64 when the inputs are fp64); outputs are fp32 (fp64 for fp64 inputs);
  gradients come back in the dtype of each input. With bf16/fp16 inputs the torch path upcasts the
  whole weight to fp32 once per call (O(V x H) memory, never O(tokens x V)).
- The Triton backward computes d_logits tile by tile in a kernel and leaves the two matmuls
  ``d_hidden += d_logits @ W_chunk`` and ``d_W_chunk = d_logits^T @ hidden`` to torch, one vocab
  chunk at a time.
- Cost: forward + backward is four [N, H] x [H, V]-sized products (logits, recomputed logits,
  d_hidden, d_W) against three for the unfused path, which keeps its logits. Where matmuls dominate
  (CPU) that is the price of the memory saving; see benchmarks/bench_fused_logprobs.py.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fastcrit_kernels._dispatch import resolve_backend, triton_interpreting

# Bytes of fp32 logits one chunk may hold. The torch path keeps two [chunk_tokens, V] buffers alive,
# the Triton backward one [tokens, chunk_vocab] buffer.
CPU_CHUNK_BYTES = 64 * 1024 * 1024
GPU_CHUNK_BYTES = 512 * 1024 * 1024


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _scaled_logits_tile(
    h_ptr,  # [N, H] hidden states, row stride stride_hn, unit column stride
    w_ptr,  # [V, H] lm_head weight, row stride stride_wv, unit column stride
    b_ptr,  # [V] bias (read only when HAS_BIAS)
    rows,  # [BLOCK_N] token rows of this tile, row_ok masks them
    row_ok,
    cols,  # [BLOCK_V] vocab columns of this tile, col_ok masks them
    col_ok,
    H,
    stride_hn,
    stride_wv,
    inv_t,
    HAS_BIAS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """(h[rows] @ w[cols].T + b[cols]) / T for one [BLOCK_N, BLOCK_V] tile, fp32 accumulation."""
    acc = tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
    for k0 in range(0, H, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        k_ok = ks < H
        h = tl.load(h_ptr + rows[:, None] * stride_hn + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols[:, None] * stride_wv + ks[None, :],
                    mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_FP32:
            acc = tl.dot(h.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(h, tl.trans(w), acc)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        acc += b[None, :]
    return acc * inv_t


@triton.jit
def _logprobs_fwd_kernel(
    h_ptr,  # [N, H] hidden states, row stride stride_hn, unit column stride
    w_ptr,  # [V, H] lm_head weight, row stride stride_wv, unit column stride
    b_ptr,  # [V] bias (read only when HAS_BIAS)
    labels_ptr,  # [N] int64 labels
    part_ptr,  # [4, S, N] fp32 out: per vocab split s, running max m, sum exp(z - m),
    #            sum exp(z - m) z (when WITH_ENT) and the label's logit (0 if not in the split)
    N,
    V,
    H,
    S,
    V_SPLIT,
    stride_hn,
    stride_wv,
    inv_t,
    HAS_BIAS: tl.constexpr,
    WITH_ENT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    labels = tl.load(labels_ptr + rows, mask=row_ok, other=-1)
    v_lo = pid_s * V_SPLIT
    v_hi = tl.minimum(v_lo + V_SPLIT, V)

    m = tl.full([BLOCK_N], float("-inf"), tl.float32)  # running max of z
    s0 = tl.zeros([BLOCK_N], tl.float32)  # running sum exp(z - m)
    s1 = tl.zeros([BLOCK_N], tl.float32)  # running sum exp(z - m) * z   (entropy)
    z_label = tl.zeros([BLOCK_N], tl.float32)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < v_hi
        z = _scaled_logits_tile(h_ptr, w_ptr, b_ptr, rows, row_ok, cols, col_ok, H, stride_hn,
                                stride_wv, inv_t, HAS_BIAS, DOT_FP32, BLOCK_N, BLOCK_V, BLOCK_H)
        # padded columns must not count: -inf, not 0
        z = tl.where(col_ok[None, :], z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, axis=1))
        scale = tl.exp(m - m_new)
        p = tl.exp(z - m_new[:, None])
        s0 = s0 * scale + tl.sum(p, axis=1)
        if WITH_ENT:
            s1 = s1 * scale + tl.sum(p * tl.where(col_ok[None, :], z, 0.0), axis=1)
        m = m_new
        hit = (cols[None, :] == labels[:, None]) & col_ok[None, :]
        z_label += tl.sum(tl.where(hit, z, 0.0), axis=1)

    base = part_ptr + pid_s * N + rows
    tl.store(base, m, mask=row_ok)
    tl.store(base + S * N, s0, mask=row_ok)
    tl.store(base + 2 * S * N, s1, mask=row_ok)
    tl.store(base + 3 * S * N, z_label, mask=row_ok)


@triton.jit
def _logprobs_bwd_dlogits_kernel(
    h_ptr,  # [N, H] hidden states, row stride stride_hn
    w_ptr,  # [V, H] lm_head weight, row stride stride_wv
    b_ptr,  # [V] bias (read only when HAS_BIAS)
    labels_ptr,  # [N] int64 labels
    lse_ptr,  # [N] fp32 log-sum-exp from the forward
    ent_ptr,  # [N] fp32 entropy from the forward (read only when WITH_ENT)
    glp_ptr,  # [N] fp32 upstream gradient of the log-probs, 0 on ignored rows
    gent_ptr,  # [N] fp32 upstream gradient of the entropy, 0 on ignored rows (WITH_ENT)
    dz_ptr,  # [N, Vc] fp32 out: d loss / d raw logits for vocab columns [v_start, v_end)
    N,
    H,
    v_start,
    v_end,
    stride_hn,
    stride_wv,
    stride_dzn,
    inv_t,
    HAS_BIAS: tl.constexpr,
    WITH_ENT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_v = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    local = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    cols = v_start + local
    col_ok = cols < v_end

    z = _scaled_logits_tile(h_ptr, w_ptr, b_ptr, rows, row_ok, cols, col_ok, H, stride_hn,
                            stride_wv, inv_t, HAS_BIAS, DOT_FP32, BLOCK_N, BLOCK_V, BLOCK_H)

    labels = tl.load(labels_ptr + rows, mask=row_ok, other=-1)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    glp = tl.load(glp_ptr + rows, mask=row_ok, other=0.0)
    logp = z - lse[:, None]
    p = tl.where(col_ok[None, :], tl.exp(logp), 0.0)
    coef = glp[:, None] + tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
    if WITH_ENT:
        ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
        gent = tl.load(gent_ptr + rows, mask=row_ok, other=0.0)
        # dH/dz = -p (z - lse + H): finite where p == 0 because logp stays finite
        coef += gent[:, None] * (logp + ent[:, None])
    hit = cols[None, :] == labels[:, None]
    dz = tl.where(hit, glp[:, None], 0.0) - p * coef
    dz = tl.where(col_ok[None, :], dz * inv_t, 0.0)
    tl.store(dz_ptr + rows[:, None] * stride_dzn + local[None, :], dz,
             mask=row_ok[:, None] & col_ok[None, :])


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _block_h(H: int) -> int:
    return max(16, min(64, triton.next_power_of_2(H)))


def _triton_forward(h, w, b, labels, inv_t, ignore_index, with_ent):
    N, H = h.shape
    V = w.shape[0]
    dev = h.device
    interp = triton_interpreting() and not h.is_cuda
    BLOCK_N = 16 if interp else 64
    BLOCK_V = 64 if interp else 128
    n_blocks = triton.cdiv(N, BLOCK_N)
    v_blocks = triton.cdiv(V, BLOCK_V)
    # Split the vocabulary over programs so that few tokens still fill the GPU (about 4 programs
    # per SM); the interpreter uses 2 splits so the tests cover the combine step.
    if h.is_cuda:
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        splits = max(1, min(v_blocks, triton.cdiv(4 * sms, max(n_blocks, 1))))
    else:
        splits = min(2, v_blocks)
    v_split = triton.cdiv(v_blocks, splits) * BLOCK_V
    splits = triton.cdiv(V, v_split)
    part = torch.empty(4, splits, max(N, 1), device=dev, dtype=torch.float32)
    if N > 0:
        _logprobs_fwd_kernel[(n_blocks, splits)](
            h, w, b if b is not None else h, labels, part,
            N, V, H, splits, v_split, h.stride(0), w.stride(0), inv_t,
            HAS_BIAS=b is not None, WITH_ENT=with_ent,
            DOT_FP32=interp or h.dtype != w.dtype or h.dtype not in (torch.bfloat16, torch.float16),
            BLOCK_N=BLOCK_N, BLOCK_V=BLOCK_V, BLOCK_H=_block_h(H), num_warps=4 if interp else 8,
        )
    part = part[:, :, :N]
    m_s, s0_s, s1_s, zl_s = part
    m = m_s.amax(dim=0)
    scale = torch.exp(m_s - m)
    s0 = (s0_s * scale).sum(0)
    lse = m + s0.log()
    valid = labels != ignore_index
    lp = torch.where(valid, (zl_s.sum(0) - lse).clamp_(max=0.0), 0.0)
    if with_ent:
        s1 = (s1_s * scale).sum(0)
        ent = torch.where(valid, (lse - s1 / s0).clamp_(min=0.0), 0.0)
    else:
        ent = torch.zeros_like(lse)
    return lp, lse, ent


def _triton_backward(h, w, b, labels, lse, ent, g_lp, g_ent, inv_t, need_w, need_b, chunk_bytes):
    """d_hidden [N, H] fp32, d_weight [V, H] fp32 or None, d_bias [V] fp32 or None."""
    N, H = h.shape
    V = w.shape[0]
    dev = h.device
    interp = triton_interpreting() and not h.is_cuda
    BLOCK_N = 16 if interp else 64
    BLOCK_V = 64 if interp else 128
    with_ent = g_ent is not None
    d_h = torch.zeros(N, H, device=dev, dtype=torch.float32)
    d_w = torch.zeros(V, H, device=dev, dtype=torch.float32) if need_w else None
    d_b = torch.zeros(V, device=dev, dtype=torch.float32) if need_b else None
    if N == 0:
        return d_h, d_w, d_b
    vc = max(BLOCK_V, (chunk_bytes // (4 * N)) // BLOCK_V * BLOCK_V)
    vc = min(vc, triton.cdiv(V, BLOCK_V) * BLOCK_V)
    dz = torch.empty(N, vc, device=dev, dtype=torch.float32)
    h32 = h.float()
    for v0 in range(0, V, vc):
        v1 = min(v0 + vc, V)
        grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(v1 - v0, BLOCK_V))
        _logprobs_bwd_dlogits_kernel[grid](
            h, w, b if b is not None else h, labels, lse, ent if with_ent else lse,
            g_lp, g_ent if with_ent else g_lp, dz,
            N, H, v0, v1, h.stride(0), w.stride(0), dz.stride(0), inv_t,
            HAS_BIAS=b is not None, WITH_ENT=with_ent,
            DOT_FP32=interp or h.dtype != w.dtype or h.dtype not in (torch.bfloat16, torch.float16),
            BLOCK_N=BLOCK_N, BLOCK_V=BLOCK_V, BLOCK_H=_block_h(H), num_warps=4 if interp else 8,
        )
        d = dz[:, : v1 - v0]
        d_h.addmm_(d, w[v0:v1].float())
        if need_w:
            torch.mm(d.t(), h32, out=d_w[v0:v1])
        if need_b:
            d_b[v0:v1] = d.sum(0)
    return d_h, d_w, d_b


# ----------------------------------------------------------------------------------------------
# Chunked torch path (the fast CPU path)
# ----------------------------------------------------------------------------------------------
# Chunks run over the vocabulary with all tokens at once: every weight row and every d_W row is
# touched exactly once per pass, and each matmul has the full token count as its inner or outer
# dimension. (Chunking over tokens instead re-streams the whole [V, H] d_W accumulator per chunk,
# which made the backward ~3x slower on CPU.)
def _compute_dtype(*tensors):
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) \
        else torch.float32


def _chunk_vocab(N: int, V: int, chunk_bytes: int) -> int:
    return max(1, min(V, chunk_bytes // (4 * max(N, 1))))


def _scaled_logits(h_c, w, b, v0, v1, inv_t, cd, shift=None):
    """[N, v1 - v0] ``(h_c @ w[v0:v1].T + b[v0:v1]) * inv_t - shift[:, None]`` in dtype ``cd``.

    Bias, temperature and shift ride in the matmul (addmm's ``input``/``alpha``), which saves full
    passes over the [N, chunk] buffer; those passes, not the flops, are what the chunking adds."""
    w_c = w[v0:v1].to(cd)
    if b is None and shift is None:
        z = torch.mm(h_c, w_c.t())
        if inv_t != 1.0:
            z.mul_(inv_t)
        return z, w_c
    if b is None:
        init = (-shift)[:, None].expand(h_c.shape[0], v1 - v0)
    elif shift is None:
        init = (b[v0:v1].to(cd) * inv_t)[None, :].expand(h_c.shape[0], v1 - v0)
    else:
        init = (b[v0:v1].to(cd) * inv_t)[None, :] - shift[:, None]
    return torch.addmm(init, h_c, w_c.t(), alpha=inv_t), w_c


def _label_slot(labels, v0, v1):
    """Rows whose label lies in [v0, v1) and the label's column inside the chunk."""
    rows = ((labels >= v0) & (labels < v1)).nonzero().squeeze(1)
    return rows, labels[rows] - v0


def _torch_forward(h, w, b, labels, inv_t, ignore_index, with_ent, chunk_bytes):
    N, _ = h.shape
    V = w.shape[0]
    cd = _compute_dtype(h, w, b)
    dev = h.device
    h_c = h.to(cd)
    m = torch.full((N,), float("-inf"), device=dev, dtype=cd)
    s0 = torch.zeros(N, device=dev, dtype=cd)
    s1 = torch.zeros(N, device=dev, dtype=cd)
    z_lab = torch.zeros(N, device=dev, dtype=cd)
    valid = labels != ignore_index
    vc = _chunk_vocab(N, V, chunk_bytes)
    for v0 in range(0, V, vc):
        v1 = min(v0 + vc, V)
        z, _ = _scaled_logits(h_c, w, b, v0, v1, inv_t, cd)
        rows, cols = _label_slot(labels, v0, v1)
        z_lab[rows] = z[rows, cols]
        m_new = torch.maximum(m, z.amax(dim=1))
        scale = torch.exp(m - m_new)
        if with_ent:
            e = torch.sub(z, m_new[:, None]).exp_()
            s1.mul_(scale).add_(torch.linalg.vecdot(e, z))
        else:
            e = z.sub_(m_new[:, None]).exp_()  # in place: z is not needed any more
        s0.mul_(scale).add_(e.sum(dim=1))
        m = m_new
        del z, e
    lse = m + s0.log()
    lp = torch.where(valid, (z_lab - lse).clamp_(max=0.0), 0.0)
    ent = torch.where(valid, (lse - s1 / s0).clamp_(min=0.0), 0.0) if with_ent else s1
    return lp, lse, ent


def _torch_backward(h, w, b, labels, lse, ent, g_lp, g_ent, inv_t, need_w, need_b, chunk_bytes):
    N, H = h.shape
    V = w.shape[0]
    cd = lse.dtype
    h_c = h.to(cd)
    d_h = torch.zeros(N, H, device=h.device, dtype=cd)
    d_w = torch.empty(V, H, device=h.device, dtype=cd) if need_w else None
    d_b = torch.empty(V, device=h.device, dtype=cd) if need_b else None
    g_lab = g_lp * inv_t
    vc = _chunk_vocab(N, V, chunk_bytes)
    for v0 in range(0, V, vc):
        v1 = min(v0 + vc, V)
        logp, w_c = _scaled_logits(h_c, w, b, v0, v1, inv_t, cd, shift=lse)
        if g_ent is not None:
            # dz = (onehot g_lp - p (g_lp + g_ent (logp + H))) / T: finite where p == 0
            dz = torch.exp(logp)
            coef = logp.add_(ent[:, None]).mul_(g_ent[:, None]).add_(g_lp[:, None])
            dz.mul_(coef).mul_(-inv_t)
            del coef
        else:
            dz = logp.exp_().mul_((-g_lab)[:, None])  # in place: -p g_lp / T
        del logp
        rows, cols = _label_slot(labels, v0, v1)
        dz[rows, cols] += g_lab[rows]
        d_h.addmm_(dz, w_c)
        if need_w:
            torch.mm(dz.t(), h_c, out=d_w[v0:v1])
        if need_b:
            torch.sum(dz, dim=0, out=d_b[v0:v1])
        del dz
    return d_h, d_w, d_b


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------
class _FusedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, inv_t, ignore_index, with_ent, backend, chunk_bytes):
        if backend == "triton":
            lp, lse, ent = _triton_forward(hidden, weight, bias, labels, inv_t, ignore_index, with_ent)
        else:
            lp, lse, ent = _torch_forward(hidden, weight, bias, labels, inv_t, ignore_index,
                                          with_ent, chunk_bytes)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, ent)
        ctx.inv_t, ctx.ignore_index, ctx.with_ent = inv_t, ignore_index, with_ent
        ctx.backend, ctx.chunk_bytes = backend, chunk_bytes
        # An output that does not reach the loss gets None (not zeros), so e.g. an entropy kept only
        # for logging adds no work to the backward.
        ctx.set_materialize_grads(False)
        if not with_ent:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, weight, bias, labels, lse, ent = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if not (need_h or need_w or need_b):
            return (None,) * 9
        valid = labels != ctx.ignore_index
        cd = lse.dtype
        if g_lp is None and (g_ent is None or not ctx.with_ent):
            return (None,) * 9
        g_lp = torch.zeros_like(lse) if g_lp is None else torch.where(valid, g_lp.to(cd), 0.0)
        if ctx.with_ent and g_ent is not None:
            g_ent = torch.where(valid, g_ent.to(cd), 0.0)
        else:
            g_ent = None
        safe = torch.where(valid, labels, torch.zeros_like(labels))
        if ctx.backend == "triton":
            d_h, d_w, d_b = _triton_backward(
                hidden, weight, bias, labels, lse, ent, g_lp.contiguous(),
                None if g_ent is None else g_ent.contiguous(), ctx.inv_t, need_w, need_b,
                ctx.chunk_bytes)
        else:
            d_h, d_w, d_b = _torch_backward(hidden, weight, bias, safe, lse, ent, g_lp, g_ent,
                                            ctx.inv_t, need_w, need_b, ctx.chunk_bytes)
        return (
            d_h.to(hidden.dtype) if need_h else None,
            d_w.to(weight.dtype) if need_w else None,
            d_b.to(bias.dtype) if need_b else None,
            None, None, None, None, None, None,
        )


# ----------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------
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
        raise ValueError(f"labels must have shape {tuple(hidden.shape[:-1])} (hidden without its last "
                         f"dim), got {tuple(getattr(labels, 'shape', ()))}")
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
):
    """Log-probs (and entropies) of ``labels`` under ``softmax((hidden @ weight.T + bias) / T)``.

    Args:
        hidden: ``[..., H]`` hidden states (fp32, bf16, fp16 or fp64).
        weight: ``[V, H]`` lm_head weight.
        labels: ``[...]`` integer token ids in ``[0, V)``, or ``ignore_index``.
        temperature: divides the logits (sampling temperature), > 0.
        bias: optional ``[V]`` lm_head bias.
        return_entropy: also return the entropy ``[...]`` of each token's distribution.
        backend: ``"auto" | "triton" | "torch"`` (see ``fastcrit_kernels._dispatch``).
        chunk_bytes: bytes of fp32 logits one chunk may hold (default: 64 MiB on CPU, 512 MiB on GPU).

    Returns:
        ``logp [...]`` fp32 (fp64 for fp64 inputs), 0 where ignored; with ``return_entropy`` a pair
        ``(logp, entropy)``. Differentiable in ``hidden``, ``weight`` and ``bias``.
    """
    _check_inputs(hidden, weight, labels, temperature, bias)
    which = resolve_backend(backend, hidden, weight)
    lead = hidden.shape[:-1]
    H = hidden.shape[-1]
    V = weight.shape[0]
    h2 = hidden.reshape(-1, H)
    if h2.stride(-1) != 1:
        h2 = h2.contiguous()
    w2 = weight if weight.stride(-1) == 1 else weight.contiguous()
    lab = labels.reshape(-1).to(torch.int64)
    bad = (lab != ignore_index) & ((lab < 0) | (lab >= V))
    if bool(bad.any()):
        first = int(lab[bad][0])
        raise ValueError(f"labels must lie in [0, V={V}) or equal ignore_index={ignore_index}; got {first}")
    if chunk_bytes is None:
        chunk_bytes = GPU_CHUNK_BYTES if hidden.is_cuda else CPU_CHUNK_BYTES
    if which == "triton":
        lab = lab.contiguous()
        if bias is not None:
            bias = bias.contiguous()
    lp, ent = _FusedLogprobs.apply(h2, w2, bias, lab, 1.0 / float(temperature), int(ignore_index),
                                   bool(return_entropy), which, int(chunk_bytes))
    lp = lp.reshape(lead)
    if return_entropy:
        return lp, ent.reshape(lead)
    return lp


# ----------------------------------------------------------------------------------------------
# Reference (plain torch, full logits): the oracle for tests and the "naive" baseline of benchmarks
# ----------------------------------------------------------------------------------------------
def logprobs_reference(hidden, weight, labels, *, temperature=1.0, bias=None, return_entropy=False,
                       ignore_index=-100, dtype=torch.float64):
    """Full ``[..., V]`` logits in ``dtype`` -> log_softmax -> gather. Differentiable by autograd."""
    logits = hidden.to(dtype) @ weight.to(dtype).t()
    if bias is not None:
        logits = logits + bias.to(dtype)
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    valid = labels != ignore_index
    safe = torch.where(valid, labels, torch.zeros_like(labels)).long()
    lp = logp_all.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    lp = torch.where(valid, lp, torch.zeros_like(lp))
    if not return_entropy:
        return lp
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return lp, torch.where(valid, ent, torch.zeros_like(ent))
