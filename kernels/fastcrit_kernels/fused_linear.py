"""Hidden states straight to a scalar RL loss, never materialising the [B, T, V] logits.

Two ways to the same values (verl semantics, exactly those of the unfused path "full logits ->
log_softmax -> gather -> loss"):

Grad in forward (the default whenever a gradient is wanted). The upstream gradient of every
token's log-prob and entropy is known inside the forward: PPO/GRPO's per-token loss (clipped
surrogate, dual clip, KL penalty of every kind, entropy bonus) depends on that token alone, and
every ``agg`` mode is ``sum_bt m L f_b`` with row factors f that depend on the mask only
(``agg_row_factors``). So the forward runs over chunks of tokens; per chunk:

    z  = (h W^T + b) / T                      GEMM 1: [n, H] x [H, V], the chunk's logits only
    log p, log p(label), entropy              one fused log-softmax over the [n, V] buffer
    g_lp, g_ent = dL/dlogp, dL/dentropy       per token, from the loss terms (no [n, V] work)
    dz = g_lp (onehot - p) - g_ent p (log p + H), all / T       in the same buffer
    d_hidden[chunk] = dz W                    GEMM 2
    d_W += dz^T h ,  d_b += sum dz            GEMM 3

That is three [N, H] x [H, V]-sized products for forward + backward, as for the unfused path,
whose memory for the logits is replaced by one [n, V] chunk (``chunk_bytes``). The gradients are
kept until ``backward``, which multiplies them by the upstream scalar: any linear use of the loss
(scaling, summing with other losses) is exact. Departures: double backward is not supported, nor
is calling backward twice through the same graph (``retain_graph``); the gradients of
hidden, weight and bias are held from the forward on (a loss computed for logging only should be
computed under ``torch.no_grad()`` or with ``grad_in_forward=False``); only tokens with
``mask != 0`` are computed at all (padding costs nothing).

PACS: a token's upstream gradient ``c_i m_t`` depends, through its sequence's log-ratio sum, the
group advantage (RLOO / GRPO) and the BCE, on every token of its group, so it is known only after
the logits of the whole group have been through the softmax. Chunks therefore hold whole groups:
where a group's tokens fit the chunk (``chunk_bytes``), its scores, hence c, are known before the
gradient GEMMs of that chunk, from the same buffer: three products. A group larger than one chunk
takes two passes over its tokens in chunks (logits and log-probs; then logits again, d_logits and
the gradient GEMMs): four products for those tokens. (d_hidden alone could be formed in the first
pass as c_i (u_t W) with u_t = onehot - p; d_W = sum_t c_i u_t^T h_t needs c inside the sum, so
its u_t would have to be kept or recomputed: recomputed here.)

Recompute (``grad_in_forward=False``, or no gradient wanted): ``fused_logprobs`` (vocab chunks,
online log-sum-exp, the logits recomputed in its backward: four products) and then the element-wise
losses of this package on the [B, T] log-probs; an ordinary autograd graph. For PPO it does not
sync with the host on a GPU (PACS's syncs once, as ``pacs_loss`` does); the grad-in-forward path
syncs once per call (the number of valid tokens, and for PACS the group sizes, decide the chunks).

On a GPU (backend ``triton``) the GEMMs are torch's (cuBLAS, following torch's own TF32 setting;
``FASTCRIT_KERNELS_ALLOW_TF32`` reaches the recompute path only) and the element-wise work is two
Triton kernels per chunk: softmax statistics over vocab splits, and d_logits written in place (fp32)
or into a bf16/fp16 buffer that feeds both gradient GEMMs with fp32 accumulation. bf16/fp16
weights: the logits GEMM needs ``torch.mm(..., out_dtype=torch.float32)`` (torch >= 2.8), else
the recompute path is taken; d_W accumulates over token chunks in fp32 ([V, H] fp32, twice the
weight's size) and is rounded once. This GPU path ran on an H100 (torch 2.11, triton 3.6): the
tests pass there, and its times are beside ``GPU_CHUNK_BYTES_16BIT`` below; its kernels are also
compile-checked for sm_80 / sm_90a, and its launches tested under the Triton interpreter, where the
bf16/fp16 products go through fp32 copies instead of ``out_dtype``. Masked tokens may hold any label
(padding).
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from fastcrit_kernels import _fused_linear_torch as tp
from fastcrit_kernels._dispatch import Variant, check_on_host, device_guard, jit, resolve_backend, tl, triton
from fastcrit_kernels.advantages import ESTIMATORS
from fastcrit_kernels.kl import KL_KINDS, _kl_torch, kl_penalty
from fastcrit_kernels.logprobs import _MM_OUT_DTYPE, _add_mm_fp32, fused_logprobs, merge_splits
from fastcrit_kernels.pacs import WEIGHT_MODES, _pacs_group_torch, pacs_inputs, pacs_loss
from fastcrit_kernels.ppo import (agg_row_factors, aggregate_loss, check_policy_inputs, ppo_policy_loss,
                                  ppo_sums_and_grad)

_IGNORE = -100
# Bytes of logits one chunk may hold on the grad-in-forward path (its tokens: as many as fit, at
# least one). The GEMMs of a chunk get slower as it gets thinner: measured on 2 CPU cores at
# V = 151936, H = 896, the logits GEMM of 220-token chunks (128 MiB) took ~1.25x, of 441-token ones
# (256 MiB) ~1.08x the time of one 2048-token GEMM, and the d_hidden GEMM ~1.12x / ~1.05x; d_W's
# GEMM did not care. 256 MiB is ~220 MB more than the recompute path's peak (which is mostly d_W,
# 545 MB at this shape), a quarter of the unfused path's. GPU, fp32: as fused_logprobs' chunks
# (512 MiB: 1.08x three plain GEMMs on an H100 at N 16384, H 896, V 151936). GPU, bf16 / fp16: 2 GiB
# of fp32 logits plus 16-bit d_logits, about 2350 tokens at that vocabulary. Each chunk adds its
# products to the fp32 d_W through a separate fp32 GEMM result (block by block), so thin chunks
# pay that pass many times: on the H100, bf16, forward + backward took 61.4 ms at 512 MiB, 37.1 ms
# at 2 GiB (peak 3.3 GB) and 32.5 ms at 8 GiB (10.1 GB); the recompute path 40.1 ms (0.9 GB), the
# unfused loss 62.2 ms (38 GB), three plain bf16 GEMMs 18.7 ms (benchmarks/gpu_check.sh).
CPU_CHUNK_BYTES = 256 * 1024 * 1024
GPU_CHUNK_BYTES = 512 * 1024 * 1024
GPU_CHUNK_BYTES_16BIT = 2 * 1024 * 1024 * 1024
_W_BLOCK_GPU = 8192  # vocab rows per d_W GEMM where bf16/fp16 products are added to an fp32 d_W


# ----------------------------------------------------------------------------------------------
# Triton kernels: the element-wise work on one chunk's logits (the GEMMs are torch's)
# ----------------------------------------------------------------------------------------------
@jit
def _chunk_stats_kernel(
    z_ptr,  # [n, V] fp32 raw logits h @ W^T of the chunk's tokens, row stride stride_zn
    b_ptr,  # [V] fp32 bias (zeros for a layer without one)
    m_ptr,  # [S, n] fp32 out: per vocab split s, the max m of the scaled logits z = (raw + b) * inv_t
    s0_ptr,  # [S, n] fp32 out: sum exp(z - m)
    s1_ptr,  # [S, n] fp32 out: sum exp(z - m) z   (the entropy's term)
    n,
    V,
    V_SPLIT,
    stride_zn,
    inv_t,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    base = z_ptr + row.to(tl.int64) * stride_zn  # int64: n * V passes 2**31
    v_lo = split * V_SPLIT
    v_hi = tl.minimum(v_lo + V_SPLIT, V)
    m = tl.full((), float("-inf"), tl.float32)
    s0 = tl.zeros((), tl.float32)
    s1 = tl.zeros((), tl.float32)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        ok = cols < v_hi
        raw = tl.load(base + cols, mask=ok, other=0.0)
        b = tl.load(b_ptr + cols, mask=ok, other=0.0)
        z = tl.where(ok, (raw + b) * inv_t, float("-inf"))  # padded columns must not count
        m_new = tl.maximum(m, tl.max(z, axis=0))
        # all -inf so far (a bias of -inf): shift by 0, as exp(-inf - -inf) would be NaN
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        scale = tl.exp(m - shift)
        p = tl.exp(z - shift)
        s0 = s0 * scale + tl.sum(p, axis=0)
        s1 = s1 * scale + tl.sum(p * tl.where(p > 0.0, z, 0.0), axis=0)  # 0 * -inf is NaN
        m = m_new
    out = split.to(tl.int64) * n + row
    tl.store(m_ptr + out, m)
    tl.store(s0_ptr + out, s0)
    tl.store(s1_ptr + out, s1)


@jit
def _chunk_dlogits_kernel(
    z_ptr,  # [n, V] fp32 raw logits of the chunk's tokens, row stride stride_zn
    dz_ptr,  # [n, V] out: d loss / d raw logits (fp32: z_ptr itself; else the GEMM dtype), stride_dn
    b_ptr,  # [V] fp32 bias (zeros for a layer without one)
    labels_ptr,  # [n] int64 labels, in [0, V)
    lse_ptr,  # [n] fp32 log-sum-exp of the scaled logits
    ent_ptr,  # [n] fp32 entropy
    glp_ptr,  # [n] fp32 d loss / d logp
    gent_ptr,  # [n] fp32 d loss / d entropy (zeros when the loss has no entropy term)
    n,
    V,
    stride_zn,
    stride_dn,
    inv_t,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < n
    col_ok = cols < V
    ok = row_ok[:, None] & col_ok[None, :]
    r64 = rows.to(tl.int64)[:, None]  # int64: n * V passes 2**31
    raw = tl.load(z_ptr + r64 * stride_zn + cols[None, :], mask=ok, other=0.0)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0)
    labels = tl.load(labels_ptr + rows, mask=row_ok, other=-1).to(tl.int32)  # V < 2**31
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
    glp = tl.load(glp_ptr + rows, mask=row_ok, other=0.0)
    gent = tl.load(gent_ptr + rows, mask=row_ok, other=0.0)
    logp = (raw + b[None, :]) * inv_t - lse[:, None]
    p = tl.where(ok, tl.exp(logp), 0.0)
    # dH/dz = -p (log p + H), finite where p underflows; columns with p == 0 add nothing (their
    # log p may be -inf: flooring it keeps 0 * inf = NaN out)
    coef = glp[:, None] + gent[:, None] * (tl.where(p > 0.0, logp, 0.0) + ent[:, None])
    hit = cols[None, :] == labels[:, None]
    dz = (tl.where(hit, glp[:, None], 0.0) - p * coef) * inv_t
    tl.store(dz_ptr + r64 * stride_dn + cols[None, :], dz.to(dz_ptr.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
# GPU: one config each (memory-bound element-wise kernels, compile-checked in test_gpu_compile.py,
# speed not measured here). The interpreter: small blocks, 2 vocab splits so that tests cover the merge.
_STATS_GPU = dict(BLOCK_V=2048, num_warps=8)
_DLOGITS_GPU = dict(BLOCK_N=4, BLOCK_V=1024, num_warps=8)
_STATS_CPU = dict(BLOCK_V=64)
_DLOGITS_CPU = dict(BLOCK_N=4, BLOCK_V=64)


def _stats_triton(z, b, labels, inv_t):
    """z [n, V] fp32 raw logits -> (logp [n], entropy [n], lse [n]), fp32."""
    n, V = z.shape
    cfg = _STATS_GPU if z.is_cuda else _STATS_CPU
    v_blocks = triton.cdiv(V, cfg["BLOCK_V"])
    if z.is_cuda:  # about 4 programs per SM however few the tokens
        splits = max(1, min(v_blocks, triton.cdiv(4 * torch.cuda.get_device_properties(z.device)
                                                  .multi_processor_count, n)))
    else:
        splits = min(2, v_blocks)
    v_split = triton.cdiv(v_blocks, splits) * cfg["BLOCK_V"]
    splits = triton.cdiv(V, v_split)
    part = torch.empty(3, splits, n, device=z.device, dtype=torch.float32)
    with device_guard(z):
        _chunk_stats_kernel[(n, splits)](z, b, part[0], part[1], part[2], n, V, v_split, z.stride(0), inv_t,
                                         **cfg)
    lse, ent = merge_splits(part[0], part[1], part[2], True)
    rows = torch.arange(n, device=z.device)
    lp = ((z[rows, labels] + b[labels]) * inv_t - lse).clamp_(max=0.0)
    return lp, ent, lse


def _dlogits_triton(z, dz, b, labels, lse, ent, g_lp, g_ent, inv_t):
    n, V = z.shape
    cfg = _DLOGITS_GPU if z.is_cuda else _DLOGITS_CPU
    g_ent = torch.zeros_like(g_lp) if g_ent is None else g_ent.float().contiguous()
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(V, cfg["BLOCK_V"]))
    with device_guard(z):
        _chunk_dlogits_kernel[grid](z, dz, b, labels, lse, ent, g_lp.float().contiguous(), g_ent, n, V,
                                    z.stride(0), dz.stride(0), inv_t, **cfg)


def _gpu_variants() -> list[Variant]:
    """Every compilation a GPU launch of this module can ask for: the logits buffer is always fp32;
    d_logits is written in the GEMM dtype."""
    gpu = lambda cfg: {k: v for k, v in cfg.items() if k != "num_warps"}  # noqa: E731
    out = [Variant.of(_chunk_stats_kernel, "fp32", dict(z_ptr="fp32", b_ptr="fp32", m_ptr="fp32", s0_ptr="fp32",
                                                       s1_ptr="fp32"),
                      floats=("inv_t",), constexprs=gpu(_STATS_GPU), num_warps=_STATS_GPU["num_warps"])]
    for dt in ("fp32", "bf16", "fp16"):
        out.append(Variant.of(
            _chunk_dlogits_kernel, dt, dict(z_ptr="fp32", dz_ptr=dt, b_ptr="fp32", labels_ptr="i64",
                                            lse_ptr="fp32", ent_ptr="fp32", glp_ptr="fp32", gent_ptr="fp32"),
            floats=("inv_t",), constexprs=gpu(_DLOGITS_GPU), num_warps=_DLOGITS_GPU["num_warps"]))
    return out


# ----------------------------------------------------------------------------------------------
# The chunk loop: logits, softmax statistics, the loss's per-token gradient, the gradient GEMMs
# ----------------------------------------------------------------------------------------------
def _mm_fp32(a, b, out=None):
    """a @ b with an fp32 result: fp32 operands directly; bf16/fp16 ones on CUDA with fp32
    accumulation (``out_dtype``; the caller checked ``_MM_OUT_DTYPE``), on CPU (the interpreter's
    tests) through fp32 copies."""
    if a.dtype == torch.float32:
        return torch.mm(a, b, out=out)
    r = torch.mm(a, b, out_dtype=torch.float32) if a.is_cuda else torch.mm(a.float(), b.float())
    return r if out is None else out.copy_(r)


class _Chunks:
    """Runs segments of packed tokens through the three GEMMs, asking a head for the upstream
    gradient of each segment's log-probs (and entropies) between the softmax and the gradients."""

    def __init__(self, h, w, b, labels, inv_t, chunk, backend, need):
        n_tok, H = h.shape
        V = w.shape[0]
        self.w, self.labels, self.inv_t, self.backend = w, labels, inv_t, backend
        if backend == "triton":  # raw logits in fp32; the kernels add bias and temperature
            self.b = torch.zeros(V, device=w.device) if b is None else b.float().contiguous()
            self.h, acc = h, torch.float32
        else:
            acc = tp.compute_dtype(h, w, b)
            self.b, self.h = b, h.to(acc)
        need_h, need_w, need_b = need
        self.d_h = torch.empty(n_tok, H, dtype=acc, device=h.device) if need_h else None
        # the first chunk writes d_W, the others add to it (bf16/fp16 products on the Triton path are
        # added to zeros, block by block)
        self.overwrite = backend == "torch" or w.dtype == torch.float32
        self.wrote = False
        self.d_w = (torch.empty if self.overwrite else torch.zeros)(V, H, dtype=acc, device=h.device) \
            if need_w else None
        self.d_b = torch.zeros(V, dtype=acc, device=h.device) if need_b else None
        # one logits buffer for all chunks (fresh ones would cost page faults on CPU); none where
        # bf16/fp16 GEMMs return a fresh fp32 product (the CUDA caching allocator reuses it)
        fresh = backend == "triton" and w.dtype != torch.float32
        self.buf = None if fresh else torch.empty(min(chunk, n_tok), V, dtype=acc, device=h.device)
        self.chunk = chunk

    def forward(self, t0, t1):
        """Logits of tokens [t0, t1) and their log-probs -> (logp, state for ``backward``)."""
        h_c, lab = self.h[t0:t1], self.labels[t0:t1]
        z = None if self.buf is None else self.buf[: t1 - t0]
        if self.backend == "triton":
            z = _mm_fp32(h_c, self.w.t(), out=z)
            lp, ent, lse = _stats_triton(z, self.b, lab, self.inv_t)
            return lp, (z, lse, ent)
        tp.logits_(z, h_c, self.w, self.b, self.inv_t)
        return tp.logprobs_(z, lab), (z, None, None)

    def backward(self, t0, t1, state, g_lp, g_ent, with_ent):
        """d_logits of tokens [t0, t1) in place of their logits, then the gradient GEMMs; returns
        the tokens' entropies (None where not asked for on the torch path)."""
        z, lse, ent = state
        h_c, lab = self.h[t0:t1], self.labels[t0:t1]
        d_h = None if self.d_h is None else self.d_h[t0:t1]
        if self.backend == "torch":
            ent = tp.entropy_dlogits_(z, lab, g_lp.to(z.dtype), None if g_ent is None else g_ent.to(z.dtype),
                                      self.inv_t, with_ent=with_ent or g_ent is not None,
                                      floor_logp=self.b is not None)
            tp.grad_gemms_(z, h_c, self.w, d_h, self.d_w, self.d_b, first=not self.wrote)
            self.wrote = True
            return ent
        dz = z if self.w.dtype == torch.float32 else torch.empty(z.shape, dtype=self.w.dtype, device=z.device)
        _dlogits_triton(z, dz, self.b, lab, lse, ent, g_lp, g_ent, self.inv_t)
        del z, state
        if d_h is not None:
            _mm_fp32(dz, self.w, out=d_h)
        if self.d_w is not None:
            if self.overwrite and not self.wrote:
                torch.mm(dz.t(), h_c, out=self.d_w)
            elif dz.dtype == torch.float32:
                self.d_w.addmm_(dz.t(), h_c)
            else:  # vocab blocks: the fp32 products stay block-sized
                for v0 in range(0, self.w.shape[0], _W_BLOCK_GPU):
                    v1 = min(v0 + _W_BLOCK_GPU, self.w.shape[0])
                    _add_mm_fp32(self.d_w[v0:v1], dz[:, v0:v1].t(), h_c)
        if self.d_b is not None:
            self.d_b.add_(dz.sum(0, dtype=torch.float32))
        self.wrote = True
        return ent

    def run(self, segments, head, with_ent):
        """``segments``: (t0, t1, key) token ranges. ``head(key, logp)`` -> (g_lp, g_ent or None),
        the upstream gradients; with ``with_ent``, ``head.entropy(key, entropy)`` after them."""
        for t0, t1, key in segments:
            if t1 == t0:  # samples without a valid token still count in the loss
                empty = torch.zeros(0, device=self.h.device)
                head(key, empty)
                if with_ent:
                    head.entropy(key, empty)
                continue
            if t1 - t0 <= self.chunk:  # one pass: three GEMMs
                lp, state = self.forward(t0, t1)
                g_lp, g_ent = head(key, lp)
                ent = self.backward(t0, t1, state, g_lp, g_ent, with_ent)
                if with_ent:
                    head.entropy(key, ent)
                continue
            # two passes (a PACS group larger than a chunk): the log-probs, then the gradients
            parts = [(s, min(t1, s + self.chunk)) for s in range(t0, t1, self.chunk)]
            g_lp, g_ent = head(key, torch.cat([self.forward(s, e)[0] for s, e in parts]))
            ents = []
            for s, e in parts:
                state = self.forward(s, e)[1]
                ents.append(self.backward(s, e, state, g_lp[s - t0:e - t0],
                                          None if g_ent is None else g_ent[s - t0:e - t0], with_ent))
            if with_ent:
                head.entropy(key, torch.cat(ents))

    def grads(self, hidden, weight, bias, idx):
        """(d_hidden like hidden, d_weight [V, H], d_bias [V]) in the inputs' dtypes, or None each."""
        d_h = None
        if self.d_h is not None:
            d_h = torch.zeros(hidden.shape, dtype=hidden.dtype, device=hidden.device)
            d_h.view(-1, hidden.shape[-1])[idx] = self.d_h.to(hidden.dtype)
        if self.d_w is not None and not self.wrote:  # no chunk ran (no valid token)
            self.d_w.zero_()
        d_w = None if self.d_w is None else self.d_w.to(weight.dtype)
        d_b = None if self.d_b is None else self.d_b.to(bias.dtype)
        return d_h, d_w, d_b


def _chunk_tokens(chunk_bytes, V, h):
    """Tokens per chunk at most: the fp32 (fp64) logits buffer, plus a bf16/fp16 d_logits one on a GPU."""
    per_token = V * (8 if h.dtype == torch.float64 else 4)
    if h.is_cuda and h.dtype in (torch.bfloat16, torch.float16):
        per_token += V * 2
    if chunk_bytes is None:
        chunk_bytes = CPU_CHUNK_BYTES if not h.is_cuda else \
            GPU_CHUNK_BYTES_16BIT if h.dtype in (torch.bfloat16, torch.float16) else GPU_CHUNK_BYTES
    return max(1, int(chunk_bytes) // per_token)


def _even_chunks(n_tok, chunk):
    """[(t0, t1, slice)] covering n_tok tokens in chunks of at most ``chunk``, all of about one
    size (no thin last chunk: a thin GEMM is a slow one)."""
    if n_tok == 0:
        return []
    size = -(-n_tok // -(-n_tok // chunk))
    return [(t0, min(n_tok, t0 + size), slice(t0, min(n_tok, t0 + size))) for t0 in range(0, n_tok, size)]


class _GradInForward(torch.autograd.Function):
    """A loss whose gradients were computed in its forward (by ``compute``); backward scales them
    by the upstream scalar, in place: the buffers are handed over, not copied."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, compute):
        loss, stats, grads = compute(*ctx.needs_input_grad[:3])
        ctx.grads = grads  # not save_for_backward: backward hands these very buffers to autograd
        ctx.mark_non_differentiable(stats)
        return loss, stats

    @staticmethod
    @once_differentiable
    def backward(ctx, g_loss, _g_stats):
        grads, ctx.grads = ctx.grads, None
        if grads is None:
            raise RuntimeError("the grad-in-forward fused loss hands its gradients over on the first backward; "
                               "for retain_graph or a second backward use grad_in_forward=False")
        one = not g_loss.is_cuda and float(g_loss) == 1.0  # on a GPU the check would sync
        return tuple(d if d is None or one else d.mul_(g_loss.to(d.dtype)) for d in grads) + (None,)


def _pack(mask, order=None):
    """Flat indices [n] of the tokens with mask != 0 (rows in ``order`` if given) and their rows."""
    B, T = mask.shape
    keep = mask != 0
    if order is None:
        idx = keep.reshape(-1).nonzero().squeeze(1)
    else:
        idx = (order[:, None] * T + torch.arange(T, device=mask.device))[keep[order]]
    return idx, torch.div(idx, max(T, 1), rounding_mode="floor")


def _check_labels(lab, V):
    """Labels of the valid tokens, which must lie in [0, V): checked on CPU (the error of
    ``fused_logprobs``); on a GPU only with FASTCRIT_KERNELS_VALIDATE=1, else clamped and flagged
    (the loss becomes NaN). Returns (safe labels, bad flags or None)."""
    bad = (lab < 0) | (lab >= V)
    if check_on_host(lab):
        if bool(bad.any()):
            raise ValueError(f"labels must lie in [0, V={V}) or equal ignore_index={_IGNORE}; "
                             f"got {int(lab[bad][0])}")
        return lab.contiguous(), None
    return lab.clamp(0, V - 1).contiguous(), bad


def _grad_path(grad_in_forward, hidden, weight, bias, backend):
    """(backend, hidden [N, H], weight) for the grad-in-forward path, or None for the recompute one:
    asked for, or no gradient wanted, or bf16/fp16 on a GPU without fp32-output GEMMs."""
    wanted = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if not (wanted if grad_in_forward is None else grad_in_forward):
        return None
    which = resolve_backend(backend, hidden, weight, bias)
    h2 = hidden.reshape(-1, hidden.shape[-1])
    if which == "triton":  # one GEMM dtype, as fused_logprobs
        gd = torch.promote_types(h2.dtype, weight.dtype)
        if gd != torch.float32 and h2.is_cuda and not _MM_OUT_DTYPE:
            return None
        h2, weight = h2.to(gd), weight.to(gd)
    return which, h2, weight.contiguous()


def _flag_nan(loss, *flags):
    """NaN where an unchecked input (a GPU call) was bad: not a wrong number."""
    for f in flags:
        if f is not None:
            loss = torch.where(f.any(), float("nan"), loss)
    return loss


# ----------------------------------------------------------------------------------------------
# PPO / GRPO
# ----------------------------------------------------------------------------------------------
class _PPOHead:
    """Per-token upstream gradients of PPO/GRPO and the loss's partial sums, one chunk at a time:
    the policy term by ``ppo_policy_loss``'s own pass (tokens as rows, their agg factors as the
    row factors), the KL by ``kl_penalty``'s torch math, the entropy term linear."""

    def __init__(self, tok, *, clip, kl_coef, kl_kind, entropy_coef, backend):
        self.tok, self.clip, self.backend = tok, clip, backend
        self.kl_coef, self.kl_code, self.ent_coef = kl_coef, KL_KINDS[kl_kind], entropy_coef
        # pg_loss, entropy agg, kl agg, m [clipped], m [lower], -m d
        self.sums = torch.zeros(6, dtype=torch.float32, device=tok["m"].device)

    def __call__(self, sl, lp):
        t = {k: v[sl] for k, v in self.tok.items() if v is not None}
        lp, w = lp.float(), t["m"] * t["f"]
        col = lambda x: x[:, None].contiguous()  # noqa: E731
        sums, g = ppo_sums_and_grad(col(lp), col(t["old"]), col(t["adv"]), col(t["m"]), t["f"].contiguous(),
                                    *self.clip, self.backend, True)
        self.sums[0] += sums[0]
        self.sums[3:] += sums[1:]
        g_lp = g[:, 0]
        if "ref" in t:
            kl, dkl = _kl_torch(lp, t["ref"], self.kl_code, self.kl_coef != 0.0)
            self.sums[2] += (kl * w).sum()
            if self.kl_coef != 0.0:
                g_lp = g_lp + (self.kl_coef * w) * dkl
        return g_lp, (w * -self.ent_coef if self.ent_coef != 0.0 else None)

    def entropy(self, sl, ent):
        self.sums[1] += (ent.float() * self.tok["m"][sl] * self.tok["f"][sl]).sum()


def fused_linear_ppo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "low_var_kl",
    entropy_coef: float = 0.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    agg: str = "token-mean",
    agg_scale: float | None = None,
    temperature: float = 1.0,
    bias: torch.Tensor | None = None,
    grad_in_forward: bool | None = None,
    chunk_bytes: int | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO/GRPO actor loss from hidden states (verl ``dp_actor`` composition).

        loss = agg(L_clip(logp, old_logp, A), mask)
               - entropy_coef * agg(entropy, mask)
               + kl_coef * agg(kl_penalty(logp, ref_logp, kl_kind), mask)

    Args:
        hidden: [B, T, H] final hidden states of the response tokens' predecessors.
        weight: [V, H] lm_head; labels: [B, T] sampled token ids (any value where mask == 0).
        old_logp: [B, T] rollout log-probs; advantages: [B, T] or [B]; mask: [B, T] response mask.
        ref_logp: [B, T] reference log-probs, needed when ``kl_coef != 0``.
        kl_kind, clip_low, clip_high, clip_c, agg, agg_scale: as ``kl_penalty`` / ``ppo_policy_loss``.
            A per-token weight w > 0 of the policy term (truncated importance sampling) enters
            as advantages * w, [B, T] (for w > 0 that is the weighted loss, clip fractions unchanged).
        temperature, bias: as ``fused_logprobs``; backend: ``auto`` | ``triton`` | ``torch``.
        grad_in_forward: compute the gradients in the forward (three GEMMs; see the module
            docstring); default: whenever a gradient is wanted. False: the recompute path.
        chunk_bytes: logits per chunk on the grad-in-forward path (default ``CPU_CHUNK_BYTES``,
            256 MiB; on a GPU ``GPU_CHUNK_BYTES``, 512 MiB, for fp32 and ``GPU_CHUNK_BYTES_16BIT``,
            2 GiB, for bf16 / fp16); the recompute path takes ``fused_logprobs``'.
    Returns:
        (loss scalar fp32, stats of detached scalars: ``pg_loss``, ``entropy`` (agg of the
        entropy), ``kl`` (agg of the KL; only with ``ref_logp``), ``clipfrac``, ``clipfrac_lower``,
        ``approx_kl``).
    """
    lab, B, T = _masked_labels(hidden, labels, mask)
    _check_bt("old_logp", old_logp, B, T)
    if kl_kind not in KL_KINDS:
        raise ValueError(f"kl_kind must be one of {sorted(KL_KINDS)}, got {kl_kind!r}")
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef != 0 needs ref_logp [B, T]")
    if ref_logp is not None:
        _check_bt("ref_logp", ref_logp, B, T)
    path = _grad_path(grad_in_forward, hidden, weight, bias, backend)
    if path is None:
        return _ppo_recompute(hidden, weight, lab, old_logp, advantages, mask, ref_logp, kl_coef, kl_kind,
                              entropy_coef, clip_low, clip_high, clip_c, agg, agg_scale, temperature,
                              bias, backend)
    check_policy_inputs(old_logp, old_logp, advantages, mask, clip_low, clip_high, clip_c)
    which, h2, w2 = path
    idx, row = _pack(mask)
    rowf = agg_row_factors(mask, agg, agg_scale)[row]
    pick = lambda x: None if x is None else x.reshape(-1)[idx]  # noqa: E731
    m = pick(mask).to(torch.float32)
    tok = dict(old=pick(old_logp), adv=advantages[row] if advantages.dim() == 1 else pick(advantages),
               m=m, f=rowf, ref=pick(ref_logp))
    safe, bad = _check_labels(lab.reshape(-1)[idx], w2.shape[0])
    chunk = _chunk_tokens(chunk_bytes, w2.shape[0], h2)
    segments = _even_chunks(idx.numel(), chunk)
    head = _PPOHead(tok, clip=(clip_low, clip_high, clip_c), kl_coef=kl_coef, kl_kind=kl_kind,
                    entropy_coef=entropy_coef, backend=which)

    def compute(need_h, need_w, need_b):
        run = _Chunks(h2[idx], w2, bias, safe, 1.0 / float(temperature), chunk, which, (need_h, need_w, need_b))
        run.run(segments, head, with_ent=True)
        s = head.sums  # pg_loss, entropy agg, kl agg, then m [clipped], m [lower], -m d
        loss = s[0] - entropy_coef * s[1] if entropy_coef != 0.0 else s[0].clone()
        if kl_coef != 0.0:
            loss = loss + kl_coef * s[2]
        n_valid = m.sum()
        frac = torch.where(n_valid > 0, s[3:] / torch.clamp(n_valid, min=1e-30), torch.zeros_like(s[3:]))
        return _flag_nan(loss, bad), torch.cat([s[:3], frac]), run.grads(hidden, weight, bias, idx)

    loss, st = _GradInForward.apply(hidden, weight, bias, compute)
    stats = {"pg_loss": st[0], "entropy": st[1]}
    if ref_logp is not None:
        stats["kl"] = st[2]
    stats.update(clipfrac=st[3], clipfrac_lower=st[4], approx_kl=st[5])
    return loss, stats


def _ppo_recompute(hidden, weight, lab, old_logp, advantages, mask, ref_logp, kl_coef, kl_kind, entropy_coef,
                   clip_low, clip_high, clip_c, agg, agg_scale, temperature, bias, backend):
    """fused_logprobs (logits recomputed in its backward), then the [B, T] losses."""
    logp, ent = fused_logprobs(hidden, weight, lab, temperature=temperature, bias=bias,
                               return_entropy=True, ignore_index=_IGNORE, backend=backend)
    logp = logp.float()
    pg_loss, pstats = ppo_policy_loss(logp, old_logp, advantages, mask, clip_low=clip_low,
                                      clip_high=clip_high, clip_c=clip_c, agg=agg,
                                      agg_scale=agg_scale, backend=backend)
    loss = pg_loss
    if entropy_coef != 0.0:
        ent_agg = aggregate_loss(ent.float(), mask, agg, agg_scale)
        loss = loss - entropy_coef * ent_agg
    else:
        with torch.no_grad():
            ent_agg = aggregate_loss(ent.float(), mask, agg, agg_scale)
    stats = {"pg_loss": pg_loss.detach(), "entropy": ent_agg.detach()}
    if ref_logp is not None:
        kl_agg = aggregate_loss(kl_penalty(logp, ref_logp.to(logp.dtype), kl_kind, backend=backend),
                                mask, agg, agg_scale)
        if kl_coef != 0.0:
            loss = loss + kl_coef * kl_agg
        stats["kl"] = kl_agg.detach()
    stats.update(pstats)
    return loss, stats


# ----------------------------------------------------------------------------------------------
# PACS
# ----------------------------------------------------------------------------------------------
class _PACSHead:
    """Per-group upstream gradients c_i m_t and the loss's partial sums of PACS, whole groups at a
    time (``pacs_loss``'s torch math on the segment's samples)."""

    def __init__(self, tok, rows, *, beta, method, est, norm_by_std, eps, wmode, B):
        self.tok, self.rows, self.B = tok, rows, B
        self.opts = (beta, method, est, norm_by_std, eps, wmode)
        dev = tok["m"].device
        self.loss = torch.zeros((), dtype=torch.float32, device=dev)
        self.sums = torch.zeros(3, dtype=torch.float32, device=dev)  # r, A, [A > 0] == y

    def __call__(self, key, lp):
        (p0, p1, t0, t1, g0, n_groups) = key
        beta, method, est, norm_by_std, eps, wmode = self.opts
        m, old, loc = self.tok["m"][t0:t1], self.tok["old"][t0:t1], self.tok["pos"][t0:t1] - p0
        x = lp.float() if method == "2" else lp.float() - old
        rsum = torch.zeros(p1 - p0, dtype=torch.float32, device=m.device).index_add_(0, loc, m * x)
        cnt = self.rows["cnt"][p0:p1]
        if method == "1":
            inv_len = torch.ones_like(cnt)
        else:
            inv_len = torch.where(cnt > 0, 1.0 / torch.clamp(cnt, min=1e-30), torch.zeros_like(cnt))
        r = beta * rsum * inv_len
        y = self.rows["y"][p0:p1]
        adv, per, dr = _pacs_group_torch(r, y, self.rows["inv"][p0:p1] - g0, n_groups, est, norm_by_std, eps,
                                         wmode, self.B)
        self.loss += per.sum()
        self.sums += torch.stack([r.sum(), adv.sum(), ((adv > 0).float() == y).float().sum()])
        return (beta * dr * inv_len)[loc] * m, None


def _pacs_segments(inv_sorted, n_sorted, chunk):
    """Whole groups packed into segments of at most ``chunk`` tokens (a larger group alone), from
    the samples' group ids and valid-token counts in group order: [(t0, t1, key)] with key
    (p0, p1, t0, t1, first group id, number of groups), p a sample range in group order."""
    inv_l, n_l = inv_sorted.tolist(), n_sorted.tolist()
    segs = []  # [p0, p1, t0, t1]
    p0 = t0 = 0
    while p0 < len(inv_l):
        p1 = p0
        while p1 < len(inv_l) and inv_l[p1] == inv_l[p0]:
            p1 += 1
        n = sum(n_l[p0:p1])
        if segs and segs[-1][1] == p0 and segs[-1][3] - segs[-1][2] + n <= chunk:
            segs[-1][1], segs[-1][3] = p1, segs[-1][3] + n
        else:
            segs.append([p0, p1, t0, t0 + n])
        p0, t0 = p1, t0 + n
    return [(t0, t1, (p0, p1, t0, t1, inv_l[p0], inv_l[p1 - 1] - inv_l[p0] + 1)) for p0, p1, t0, t1 in segs]


def fused_linear_pacs_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    old_logp: torch.Tensor,
    scores: torch.Tensor,
    mask: torch.Tensor,
    index,
    *,
    beta: float = 1.0,
    reward_method: str = "1",
    estimator: str = "rloo",
    weight_mode: str | None = None,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    temperature: float = 1.0,
    bias: torch.Tensor | None = None,
    grad_in_forward: bool | None = None,
    chunk_bytes: int | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PACS loss from hidden states: ``pacs_loss(fused_logprobs(hidden, weight, labels), ...)``.

    Args:
        hidden: [B, T, H]; weight: [V, H]; labels, old_logp, mask: [B, T]; scores: [B] 0/1 labels;
        index: [B] group id per sample. The rest as ``pacs_loss`` and ``fused_logprobs``.
        grad_in_forward, chunk_bytes: as ``fused_linear_ppo_loss``. Chunks hold whole groups:
            a group with more valid tokens than one chunk holds takes two passes (four GEMMs).
    Returns:
        (loss scalar fp32, stats of ``pacs_loss``: ``reward_mean``, ``advantage_mean``, ``accuracy``).
    """
    lab, B, T = _masked_labels(hidden, labels, mask)
    _check_bt("old_logp", old_logp, B, T)
    path = _grad_path(grad_in_forward, hidden, weight, bias, backend)
    if path is None:
        logp = fused_logprobs(hidden, weight, lab, temperature=temperature, bias=bias,
                              ignore_index=_IGNORE, backend=backend)
        return pacs_loss(logp.float(), old_logp, scores, mask, index, beta=beta,
                         reward_method=reward_method, estimator=estimator, weight_mode=weight_mode,
                         norm_by_std=norm_by_std, eps=eps, backend=backend)
    which, h2, w2 = path
    y, not_01, inv, _ = pacs_inputs(B, scores, index, reward_method, estimator, weight_mode, mask.device)
    order = torch.argsort(inv, stable=True)  # samples by group
    idx, row = _pack(mask, order)
    pos = torch.empty_like(order)
    pos[order] = torch.arange(B, device=order.device)
    mf = mask.to(torch.float32)
    rows = dict(y=y[order], inv=inv[order], cnt=mf.sum(-1)[order])
    tok = dict(m=mf.reshape(-1)[idx], old=old_logp.reshape(-1)[idx].float(), pos=pos[row])
    safe, bad = _check_labels(lab.reshape(-1)[idx], w2.shape[0])
    chunk = _chunk_tokens(chunk_bytes, w2.shape[0], h2)
    segments = _pacs_segments(rows["inv"], (mask != 0)[order].sum(-1), chunk)
    head = _PACSHead(tok, rows, beta=float(beta), method=str(reward_method), est=ESTIMATORS[estimator],
                     norm_by_std=bool(norm_by_std), eps=float(eps), wmode=WEIGHT_MODES[weight_mode], B=B)

    def compute(need_h, need_w, need_b):
        run = _Chunks(h2[idx], w2, bias, safe, 1.0 / float(temperature), chunk, which, (need_h, need_w, need_b))
        run.run(segments, head, with_ent=False)
        return _flag_nan(head.loss.clone(), not_01, bad), head.sums / B, run.grads(hidden, weight, bias, idx)

    loss, st = _GradInForward.apply(hidden, weight, bias, compute)
    return loss, {"reward_mean": st[0], "advantage_mean": st[1], "accuracy": st[2]}


# ----------------------------------------------------------------------------------------------
# Shared checks
# ----------------------------------------------------------------------------------------------
def _check_bt(name, t, B, T):
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != (B, T):
        raise ValueError(f"{name} must have shape [B={B}, T={T}], got {tuple(getattr(t, 'shape', ()))}")


def _masked_labels(hidden, labels, mask):
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
        raise ValueError(f"hidden must be [B, T, H], got {tuple(getattr(hidden, 'shape', ()))}")
    B, T, _ = hidden.shape
    _check_bt("labels", labels, B, T)
    _check_bt("mask", mask, B, T)
    keep = mask.bool() if mask.dtype == torch.bool else mask != 0
    return torch.where(keep, labels.long(), torch.full_like(labels, _IGNORE, dtype=torch.long)), B, T
