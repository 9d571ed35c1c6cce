"""The chunk machinery of the grad-in-forward losses in ``fused_linear.py``: how many tokens a
chunk of logits holds, the two Triton kernels that do a chunk's element-wise work on a GPU (softmax
statistics over vocab splits; d_logits written in place), the per-chunk GEMMs with fp32
accumulation, and the autograd function that holds the gradients made in the forward until
``backward`` scales them by the upstream gradient. ``fused_linear.py``'s docstring says what is
computed and why; the PPO and PACS heads there decide each chunk's upstream gradient.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from fastcrit_kernels import _fused_linear_torch as tp
from fastcrit_kernels._dispatch import Variant, check_on_host, device_guard, jit, resolve_backend, tl, triton
from fastcrit_kernels.logprobs import _ADDMM_OUT_DTYPE, _MM_OUT_DTYPE, _add_mm_fp32, merge_splits

_IGNORE = -100
# Bytes of logits one chunk may hold on the grad-in-forward path (its tokens: as many as fit, at
# least one). The GEMMs of a chunk get slower as it gets thinner, so a chunk is as large as the
# memory it adds allows. CPU: at V = 151936, H = 896 512 MiB holds ~880 tokens, where the three
# GEMMs of a chunk run about as fast as unchunked ones (half as many passes over d_W as 256 MiB
# chunks make) and the peak stays a third of the unfused path's. GPU, fp32: as fused_logprobs'
# chunks (512 MiB; close to three plain GEMMs' time).
# GPU, bf16 / fp16: 2 GiB of fp32 logits plus 16-bit d_logits, about 2350 tokens at that vocabulary.
# Each chunk reads and writes the whole fp32 d_W (V x H x 8 bytes), so thin chunks pay that pass many
# times: large chunks keep it rare at a few GB of peak. From torch 2.10 the add is the GEMM's own
# epilogue (``_add_mm_fp32``); older torch adds a separate fp32 product, block by block, which makes
# thin chunks dearer still. Reproduce with benchmarks/bench_ppo.py (``--lm-chunks``;
# on a GPU through benchmarks/gpu_check.sh); the latest figures: benchmarks/README.md, "On a GPU"
# (the 512 MiB bf16 run: docs/LOG.md).
CPU_CHUNK_BYTES = 512 * 1024 * 1024
GPU_CHUNK_BYTES = 512 * 1024 * 1024
GPU_CHUNK_BYTES_16BIT = 2 * 1024 * 1024 * 1024
_W_BLOCK_GPU = 8192  # vocab rows per d_W GEMM where bf16/fp16 products are added to an fp32 d_W (torch < 2.10)


# ----------------------------------------------------------------------------------------------
# Triton kernels: the element-wise work on one chunk's logits (the GEMMs are torch's)
# ----------------------------------------------------------------------------------------------
@jit
def _chunk_stats_kernel(
    z_ptr,  # [n, V] raw logits h @ W^T of the chunk's tokens (fp32, or the GEMM's 16-bit), stride stride_zn
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
        raw = tl.load(base + cols, mask=ok, other=0.0).to(tl.float32)
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
    z_ptr,  # [n, V] raw logits of the chunk's tokens (fp32, or the GEMM's 16-bit), row stride stride_zn
    dz_ptr,  # [n, V] out: d loss / d raw logits in the GEMM dtype (z_ptr itself where the dtypes agree)
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
    raw = tl.load(z_ptr + r64 * stride_zn + cols[None, :], mask=ok, other=0.0).to(tl.float32)
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
        splits = max(
            1, min(v_blocks, triton.cdiv(4 * torch.cuda.get_device_properties(z.device).multi_processor_count, n))
        )
    else:
        splits = min(2, v_blocks)
    v_split = triton.cdiv(v_blocks, splits) * cfg["BLOCK_V"]
    splits = triton.cdiv(V, v_split)
    part = torch.empty(3, splits, n, device=z.device, dtype=torch.float32)
    with device_guard(z):
        _chunk_stats_kernel[(n, splits)](z, b, part[0], part[1], part[2], n, V, v_split, z.stride(0), inv_t, **cfg)
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
        _chunk_dlogits_kernel[grid](
            z, dz, b, labels, lse, ent, g_lp.float().contiguous(), g_ent, n, V, z.stride(0), dz.stride(0), inv_t, **cfg
        )


def _gpu_variants() -> list[Variant]:
    """Every compilation a GPU launch of this module can ask for: logits in fp32 (d_logits in the
    GEMM dtype), or in the 16-bit GEMM dtype itself (``logits_dtype``; d_logits written in place)."""
    gpu = lambda cfg: {k: v for k, v in cfg.items() if k != "num_warps"}
    out = []
    for zt in ("fp32", "bf16", "fp16"):
        out.append(
            Variant.of(
                _chunk_stats_kernel,
                zt,
                dict(z_ptr=zt, b_ptr="fp32", m_ptr="fp32", s0_ptr="fp32", s1_ptr="fp32"),
                floats=("inv_t",),
                constexprs=gpu(_STATS_GPU),
                num_warps=_STATS_GPU["num_warps"],
            )
        )
    pairs = [("fp32", dt) for dt in ("fp32", "bf16", "fp16")] + [("bf16", "bf16"), ("fp16", "fp16")]
    for zt, dt in pairs:
        out.append(
            Variant.of(
                _chunk_dlogits_kernel,
                dt,
                dict(
                    z_ptr=zt,
                    dz_ptr=dt,
                    b_ptr="fp32",
                    labels_ptr="i64",
                    lse_ptr="fp32",
                    ent_ptr="fp32",
                    glp_ptr="fp32",
                    gent_ptr="fp32",
                ),
                floats=("inv_t",),
                constexprs=gpu(_DLOGITS_GPU),
                num_warps=_DLOGITS_GPU["num_warps"],
            )
        )
    return out


# ----------------------------------------------------------------------------------------------
# The chunk loop: logits, softmax statistics, the loss's per-token gradient, the gradient GEMMs
# ----------------------------------------------------------------------------------------------
def _mm_fp32(a, b, out=None):
    """a @ b with an fp32 result: fp32 operands directly; bf16/fp16 ones on CUDA with fp32
    accumulation (``out_dtype``, written straight into ``out``; the caller checked
    ``_MM_OUT_DTYPE``), on CPU (the interpreter's tests) through fp32 copies."""
    if a.dtype == torch.float32:
        return torch.mm(a, b, out=out)
    if a.is_cuda:
        return torch.mm(a, b, torch.float32) if out is None else torch.mm(a, b, torch.float32, out=out)
    r = torch.mm(a.float(), b.float())
    return r if out is None else out.copy_(r)


class _Chunks:
    """Runs segments of packed tokens through the three GEMMs, asking a head for the upstream
    gradient of each segment's log-probs (and entropies) between the softmax and the gradients."""

    def __init__(self, h, w, b, labels, inv_t, chunk, backend, need, logits16=False):
        n_tok, H = h.shape
        V = w.shape[0]
        self.w, self.labels, self.inv_t, self.backend = w, labels, inv_t, backend
        # Triton: raw logits in fp32, or (``logits16``) as the 16-bit GEMM writes them, d_logits
        # then in place; the kernels add bias and temperature
        self.logits16 = logits16
        if backend == "triton":
            self.b = torch.zeros(V, device=w.device) if b is None else b.float().contiguous()
            self.h, acc = h, torch.float32
        else:
            acc = tp.compute_dtype(h, w, b)
            self.b, self.h = b, h.to(acc)
        need_h, need_w, need_b = need
        self.d_h = torch.empty(n_tok, H, dtype=acc, device=h.device) if need_h else None
        # the first chunk writes d_W, the others add to it (bf16/fp16 products on the Triton path:
        # through addmm's fp32 epilogue on CUDA, else added to zeros block by block)
        self.overwrite = backend == "torch" or w.dtype == torch.float32 or (w.is_cuda and _ADDMM_OUT_DTYPE)
        self.wrote = False
        self.d_w = (
            (tp.output_buffer if self.overwrite else torch.zeros)(V, H, dtype=acc, device=h.device) if need_w else None
        )
        self.d_b = torch.zeros(V, dtype=acc, device=h.device) if need_b else None
        # one logits buffer for all chunks (fresh ones would cost page faults on CPU); none where
        # bf16/fp16 GEMMs return a fresh fp32 product (the CUDA caching allocator reuses it)
        fresh = backend == "triton" and w.dtype != torch.float32 and not logits16
        z_dtype = w.dtype if logits16 else acc
        self.buf = None if fresh else tp.output_buffer(min(chunk, n_tok), V, dtype=z_dtype, device=h.device)
        self.chunk = chunk

    def forward(self, t0, t1):
        """Logits of tokens [t0, t1) and their log-probs -> (logp, state for ``backward``)."""
        h_c, lab = self.h[t0:t1], self.labels[t0:t1]
        z = None if self.buf is None else self.buf[: t1 - t0]
        if self.backend == "triton":
            z = torch.mm(h_c, self.w.t(), out=z) if self.logits16 else _mm_fp32(h_c, self.w.t(), out=z)
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
            ent = tp.entropy_dlogits_(
                z,
                lab,
                g_lp.to(z.dtype),
                None if g_ent is None else g_ent.to(z.dtype),
                self.inv_t,
                with_ent=with_ent or g_ent is not None,
                floor_logp=self.b is not None,
            )
            tp.grad_gemms_(z, h_c, self.w, d_h, self.d_w, self.d_b, first=not self.wrote)
            self.wrote = True
            return ent
        dz = z if z.dtype == self.w.dtype else torch.empty(z.shape, dtype=self.w.dtype, device=z.device)
        _dlogits_triton(z, dz, self.b, lab, lse, ent, g_lp, g_ent, self.inv_t)
        del z, state
        if d_h is not None:
            _mm_fp32(dz, self.w, out=d_h)
        if self.d_w is not None:
            if self.overwrite:
                _add_mm_fp32(self.d_w, dz.t(), h_c, first=not self.wrote)
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
                ents.append(
                    self.backward(
                        s, e, state, g_lp[s - t0 : e - t0], None if g_ent is None else g_ent[s - t0 : e - t0], with_ent
                    )
                )
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


def _chunk_tokens(chunk_bytes, V, h, logits16=False):
    """Tokens per chunk at most: the fp32 (fp64) logits buffer, plus a bf16/fp16 d_logits one on a
    GPU; with ``logits16``, one 16-bit buffer for both."""
    per_token = V * (8 if h.dtype == torch.float64 else 4)
    if logits16:
        per_token = V * 2
    elif h.is_cuda and h.dtype in (torch.bfloat16, torch.float16):
        per_token += V * 2
    if chunk_bytes is None:
        chunk_bytes = (
            CPU_CHUNK_BYTES
            if not h.is_cuda
            else GPU_CHUNK_BYTES_16BIT
            if h.dtype in (torch.bfloat16, torch.float16)
            else GPU_CHUNK_BYTES
        )
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
        # autocast off: the chunk products choose their own precision (a caller's bf16 region
        # would otherwise take the plain torch.mm of mixed inputs down to bf16)
        with torch.autocast(hidden.device.type, enabled=False):
            loss, stats, grads = compute(*ctx.needs_input_grad[:3])
        ctx.grads = grads  # not save_for_backward: backward hands these very buffers to autograd
        ctx.mark_non_differentiable(stats)
        return loss, stats

    @staticmethod
    @once_differentiable
    def backward(ctx, g_loss, _g_stats):
        grads, ctx.grads = ctx.grads, None
        if grads is None:
            raise RuntimeError(
                "the grad-in-forward fused loss hands its gradients over on the first backward; "
                "for retain_graph or a second backward use grad_in_forward=False"
            )
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
            raise ValueError(f"labels must lie in [0, V={V}) or equal ignore_index={_IGNORE}; got {int(lab[bad][0])}")
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


def _logits16(logits_dtype, path) -> bool:
    """Whether the grad-in-forward chunks (``path``, from ``_grad_path``; None: the recompute path,
    which keeps fp32) keep the GEMM's 16-bit logits. The value is checked on every path; asking for
    it where the GEMM does not run in that dtype on the Triton backend is refused, not ignored."""
    if logits_dtype is not None and logits_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(
            f"logits_dtype must be None (fp32 logits), torch.bfloat16 or torch.float16; got {logits_dtype!r}"
        )
    if logits_dtype is None or path is None:
        return False
    which, _, w2 = path
    if which != "triton" or w2.dtype != logits_dtype:
        raise ValueError(
            f"logits_dtype={logits_dtype} keeps the logits GEMM's own output, so it needs {logits_dtype} "
            f"operands on the triton backend; got {w2.dtype} operands on the {which} backend"
        )
    return True


def _flag_nan(loss, *flags):
    """NaN where an unchecked input (a GPU call) was bad: not a wrong number."""
    for f in flags:
        if f is not None:
            loss = torch.where(f.any(), float("nan"), loss)
    return loss
