"""The Triton kernels of ``fused_logprobs`` (logprobs.py launches them and says what they
guarantee): the forward's online log-sum-exp over vocab splits, and the backward's d_logits for
one vocab chunk, both over ``_logits_tile``."""

from __future__ import annotations

from fastcrit_kernels._dispatch import jit, tl


@jit
def _logits_tile(
    h_rows,  # [BLOCK_N, 1] pointers to the first element of each token row of hidden [N, H]
    w_rows,  # [BLOCK_V, 1] pointers to the first element of each vocab row of weight [V, H]
    row_ok,  # [BLOCK_N] rows that exist
    col_ok,  # [BLOCK_V] vocab rows that exist
    H,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """h[rows] @ w[cols].T for one [BLOCK_N, BLOCK_V] tile: operands in the inputs' dtype, fp32
    accumulation. ``DOT_PRECISION`` matters for fp32 operands only ("ieee": exact, "tf32").
    ``UPCAST`` (the interpreter only) takes the operands to fp32 first: the interpreter's tl.dot
    multiplies the raw bits of bf16 operands (Triton 3.9)."""
    acc = tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
    for k0 in range(0, H, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        k_ok = ks < H
        h = tl.load(h_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if UPCAST:
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PRECISION)
    return acc


@jit
def _logprobs_fwd_kernel(
    h_ptr,  # [N, H] hidden states (fp32, bf16 or fp16), row stride stride_hn, unit column stride
    w_ptr,  # [V, H] lm_head weight, h's dtype, row stride stride_wv, unit column stride
    b_ptr,  # [V] fp32 bias (zeros for a layer without one)
    labels_ptr,  # [N] int64 labels
    m_ptr,  # [S, N] fp32 out: per vocab split s, the running max m of the scaled logits z
    s0_ptr,  # [S, N] fp32 out: sum exp(z - m)
    s1_ptr,  # [S, N] fp32 out: sum exp(z - m) z (the entropy's term)
    zl_ptr,  # [S, N] fp32 out: the label's logit (0 where the label lies in another split)
    N,
    V,
    H,
    V_SPLIT,
    stride_hn,
    stride_wv,
    inv_t,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * stride_hn  # int64: N * H may pass 2**31
    labels = tl.load(labels_ptr + rows, mask=row_ok, other=-1).to(tl.int32)  # V < 2**31
    v_lo = pid_s * V_SPLIT
    v_hi = tl.minimum(v_lo + V_SPLIT, V)

    m = tl.full([BLOCK_N], float("-inf"), tl.float32)  # running max of z
    s0 = tl.zeros([BLOCK_N], tl.float32)  # running sum exp(z - m)
    s1 = tl.zeros([BLOCK_N], tl.float32)  # running sum exp(z - m) * z   (entropy)
    z_label = tl.zeros([BLOCK_N], tl.float32)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < v_hi
        w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wv  # int64: V * H may pass 2**31
        acc = _logits_tile(h_rows, w_rows, row_ok, col_ok, H, DOT_PRECISION, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0)
        # padded columns must not count: -inf, not 0
        z = tl.where(col_ok[None, :], (acc + b[None, :]) * inv_t, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, axis=1))
        # A row whose logits so far are all -inf (a bias of -inf masking a whole tile) still has
        # m = -inf: shift it by 0, as exp(-inf - -inf) would put NaN in the sums.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        scale = tl.exp(m - shift)
        p = tl.exp(z - shift[:, None])
        s0 = s0 * scale + tl.sum(p, axis=1)
        # columns with p == 0 add nothing (where z = -inf, p * z would be 0 * -inf = NaN)
        s1 = s1 * scale + tl.sum(p * tl.where(p > 0.0, z, 0.0), axis=1)
        m = m_new
        # A tile never straddles a split's end (V_SPLIT is a multiple of BLOCK_V), so a label
        # matches in exactly one tile of one split; comparing tile-local indices saves registers.
        hit = tl.arange(0, BLOCK_V)[None, :] == (labels - v0)[:, None]
        z_label += tl.sum(tl.where(hit, z, 0.0), axis=1)

    out = pid_s.to(tl.int64) * N + rows
    tl.store(m_ptr + out, m, mask=row_ok)
    tl.store(s0_ptr + out, s0, mask=row_ok)
    tl.store(s1_ptr + out, s1, mask=row_ok)
    tl.store(zl_ptr + out, z_label, mask=row_ok)


@jit
def _logprobs_bwd_dlogits_kernel(
    h_ptr,  # [N, H] hidden states (fp32, bf16 or fp16), row stride stride_hn
    w_ptr,  # [V, H] lm_head weight, h's dtype, row stride stride_wv
    b_ptr,  # [V] fp32 bias (zeros for a layer without one)
    labels_ptr,  # [N] int64 labels
    lse_ptr,  # [N] fp32 log-sum-exp from the forward
    ent_ptr,  # [N] fp32 entropy from the forward (zeros when it was not asked for)
    glp_ptr,  # [N] fp32 upstream gradient of the log-probs, 0 on ignored rows
    gent_ptr,  # [N] fp32 upstream gradient of the entropy, 0 on ignored rows (zeros when none)
    dz_ptr,  # [N, Vc] out, h's dtype: d loss / d raw logits for vocab columns [v_start, v_end)
    N,
    H,
    v_start,
    v_end,
    stride_hn,
    stride_wv,
    stride_dzn,
    inv_t,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
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
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * stride_hn  # int64: N * H may pass 2**31
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wv  # int64: V * H may pass 2**31

    acc = _logits_tile(h_rows, w_rows, row_ok, col_ok, H, DOT_PRECISION, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0)
    z = (acc + b[None, :]) * inv_t

    labels = tl.load(labels_ptr + rows, mask=row_ok, other=-1).to(tl.int32)  # V < 2**31
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
    glp = tl.load(glp_ptr + rows, mask=row_ok, other=0.0)
    gent = tl.load(gent_ptr + rows, mask=row_ok, other=0.0)
    logp = z - lse[:, None]
    p = tl.where(col_ok[None, :], tl.exp(logp), 0.0)
    # dH/dz = -p (z - lse + H), from the logits: finite where p underflows to 0. Columns with
    # p == 0 add nothing; flooring their logp keeps 0 * inf = NaN out where z = -inf.
    coef = glp[:, None] + gent[:, None] * (tl.where(p > 0.0, logp, 0.0) + ent[:, None])
    hit = local[None, :] == (labels - v_start)[:, None]
    dz = tl.where(hit, glp[:, None], 0.0) - p * coef
    dz = tl.where(col_ok[None, :], dz * inv_t, 0.0)
    dz_rows = dz_ptr + rows.to(tl.int64)[:, None] * stride_dzn  # int64: N * Vc may pass 2**31
    tl.store(dz_rows + local[None, :], dz.to(dz_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
