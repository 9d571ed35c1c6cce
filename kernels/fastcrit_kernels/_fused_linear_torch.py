"""The torch path of the grad-in-forward losses (fused_linear.py): one token chunk's logits
``[n, V]`` live in one buffer, which becomes log p, then d loss / d logits, in place.

Why this shape of code (on CPU; the figures: docs/LOG.md): the element-wise work is memory-bound
and small next to the GEMMs if it touches the buffer few times. ATen's fused ``log_softmax``
written into its own input reads and writes the buffer once (a fresh output buffer costs several
times as much, in page faults). The rest (p = exp(log p), the entropy's row sums, d_logits) is one
pass over row blocks of ~2 MiB, which stay in cache, with one intra-op thread: with two, every
small op ends in a thread barrier, which on a loaded machine waits for a descheduled thread and
makes the pass many times slower. One thread gives up a few percent of the step on a quiet machine
for robustness on a shared one (and the same bits whatever the load). Token-major ``[n, V]`` is
what ATen's row-wise softmax is fast on; a vocab-major buffer makes it several times slower.
"""

from __future__ import annotations

import contextlib

import torch

_BLOCK_BYTES = 2 << 20  # logits per row block of the entropy / d_logits pass: a slice that stays in cache
_W_BLOCK = 8192  # vocab rows per GEMM block when the weight must be cast first (bf16/fp16 on CPU)


@contextlib.contextmanager
def _one_thread(t: torch.Tensor):
    """Torch's intra-op threads set to 1 for the block loop on CPU, restored after (see the module
    docstring: thread barriers of small ops). Process-wide while it lasts, as torch's setting is."""
    n = torch.get_num_threads()
    if t.is_cuda or n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def output_buffer(*shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised buffer that a GEMM will write, its pages already mapped on a CPU.

    A fresh large buffer is mapped page by page on first touch; when that touch is a two-thread
    GEMM's output, the threads fault on the same pages and stall each other, so a memset and then
    the GEMM take less time than the GEMM alone into fresh pages (the figures: docs/LOG.md). So on
    a CPU the buffer is zeroed first; on CUDA it is left empty."""
    if torch.device(device).type == "cpu":
        return torch.zeros(*shape, dtype=dtype, device=device)
    return torch.empty(*shape, dtype=dtype, device=device)


def compute_dtype(*tensors) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def block_rows(V: int, dtype: torch.dtype) -> int:
    return max(1, _BLOCK_BYTES // (V * torch.finfo(dtype).bits // 8))


def log_softmax_(z: torch.Tensor) -> torch.Tensor:
    """z [n, V] := log_softmax(z, dim=1), in place.

    ATen's kernel reads each row (max, then sum of exp) before writing it, element for element,
    so its output may alias its input; tests/kernels/test_fused_linear.py checks the result
    against ``torch.log_softmax`` on a buffer wider than a cache."""
    return torch.ops.aten._log_softmax.out(z, 1, False, out=z)


def logits_(z, h_c, w, b, inv_t):
    """z [n, V] (compute dtype) := (h_c @ w.T + b) * inv_t, bias and temperature inside the GEMM."""
    cd = z.dtype
    h_c = h_c.to(cd)
    if w.dtype == cd:
        if b is None:  # beta=0: z's old contents are ignored (NaN included)
            return torch.addmm(z, h_c, w.t(), beta=0.0, alpha=inv_t, out=z)
        return torch.addmm(b.to(cd) * inv_t, h_c, w.t(), alpha=inv_t, out=z)
    for v0 in range(0, w.shape[0], _W_BLOCK):  # cast the weight one block at a time
        v1 = min(v0 + _W_BLOCK, w.shape[0])
        wb = w[v0:v1].to(cd)
        if b is None:
            z[:, v0:v1] = torch.mm(h_c, wb.t()).mul_(inv_t)
        else:
            z[:, v0:v1] = torch.addmm(b[v0:v1].to(cd) * inv_t, h_c, wb.t(), alpha=inv_t)
    return z


def logprobs_(z, labels):
    """z [n, V] scaled logits := log p, in place; returns the labels' log-probs [n] (<= 0)."""
    log_softmax_(z)
    return z[torch.arange(z.shape[0], device=z.device), labels].clamp(max=0.0)


def entropy_dlogits_(z, labels, g_lp, g_ent, inv_t, *, with_ent: bool, floor_logp: bool):
    """z [n, V] := d loss / d raw logits, in place, from z = log p; returns the entropies [n] (or
    None without ``with_ent``). One pass over row blocks that stay in cache: p = exp(log p) into a
    block-sized buffer, H = -sum p log p, then

        dz_v = inv_t * (g_lp [v == label] - p_v (g_lp + g_ent (log p_v + H)))

    ``floor_logp``: logits may be -inf (a bias masking tokens); log p is floored at -1e4 so that
    p log p is 0, not 0 * -inf = NaN. exp(-1e4) is 0 in fp32 and fp64 alike: the floor changes
    log p only where p is exactly 0."""
    n, V = z.shape
    step = block_rows(V, z.dtype)
    c = (g_lp * -inv_t)[:, None]
    a = None if g_ent is None else (g_ent * -inv_t)[:, None]
    bare = a is None and not with_ent  # dz = c p: in place, no second block in the cache
    tmp = None if bare else torch.empty(min(step, n), V, dtype=z.dtype, device=z.device)
    ent = torch.empty(n, dtype=z.dtype, device=z.device) if with_ent else None
    with _one_thread(z):
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            logp = z[r0:r1]
            if bare:
                logp.exp_().mul_(c[r0:r1])
                continue
            p = tmp[: r1 - r0]
            if floor_logp:
                logp.clamp_(min=-1e4)
            torch.exp(logp, out=p)
            if with_ent:
                ent[r0:r1] = torch.linalg.vecdot(p, logp).neg_().clamp_(min=0.0)
            if a is None:
                torch.mul(p, c[r0:r1], out=logp)
            else:  # p * (a log p + c + a H), a = -inv_t g_ent, c = -inv_t g_lp
                logp.mul_(a[r0:r1]).add_(c[r0:r1] + a[r0:r1] * ent[r0:r1, None]).mul_(p)
    z[torch.arange(n, device=z.device), labels] += g_lp * inv_t
    return ent


def grad_gemms_(dz, h_c, w, d_h, d_w, d_b, first: bool):
    """d_h [n, H] := dz @ w; d_w [V, H] (+)= dz.T @ h_c; d_b [V] += dz.sum(0). Any may be None."""
    cd = dz.dtype
    h_c = h_c.to(cd)
    if w.dtype == cd:
        if d_h is not None:
            torch.mm(dz, w, out=d_h)
        if d_w is not None:
            if first:
                torch.mm(dz.t(), h_c, out=d_w)
            else:
                d_w.addmm_(dz.t(), h_c)
    else:
        if d_h is not None:
            d_h.zero_()
        for v0 in range(0, w.shape[0], _W_BLOCK):
            v1 = min(v0 + _W_BLOCK, w.shape[0])
            if d_h is not None:
                d_h.addmm_(dz[:, v0:v1], w[v0:v1].to(cd))
            if d_w is not None:
                if first:
                    torch.mm(dz[:, v0:v1].t(), h_c, out=d_w[v0:v1])
                else:
                    d_w[v0:v1].addmm_(dz[:, v0:v1].t(), h_c)
    if d_b is not None:
        d_b.add_(dz.sum(0))
