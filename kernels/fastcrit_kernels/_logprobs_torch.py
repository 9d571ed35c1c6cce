"""The torch path of ``fused_logprobs``: the same online log-sum-exp and chunked backward as the
Triton kernels, over vocab chunks with plain torch ops (CPU, fp64, and any input the Triton path
does not take). See logprobs.py for the guarantees both paths share.

Each chunk's logits are held vocab-major, ``[chunk, N]`` (``W_c @ h^T``): on a CPU that product
runs closer to the GEMM peak than the token-major ``h @ W_c^T`` (the figures: docs/LOG.md), and the
two backward products take either layout at the same rate. The per-token reductions then run down
the columns, which ATen vectorises along the contiguous token dimension.

On a CPU the element-wise work, not the flops, is what the chunking adds: a fresh buffer for every
chunk's logits is mapped and faulted in page by page by the kernel, a visible share of a forward +
backward, and passes over a whole chunk (max, shift, exp, sum; exp, scale) each stream it through
memory. So one buffer serves every chunk, and the passes run over row blocks that stay in cache
(as in _fused_linear_torch.py, with one intra-op thread). On CUDA each pass is one kernel over the
chunk.

When the forward keeps the logits for the backward and no entropy is asked for, it keeps
``exp(z - shift)`` instead, with ``shift`` the running max each row block was scaled by (one
``[N]`` vector per block): the backward's ``d_z = -p g / T`` is then that buffer times one factor
per token, ``exp(shift - lse) * (-g / T)``: one pass, where recomputing ``p`` from the logits takes
a subtraction and an exp as well. The factor is at most 1 (``lse`` is at least every shift), so
it cannot overflow, and where ``exp(z - shift)`` underflows ``p`` is smaller still.
"""

from __future__ import annotations

import torch

from fastcrit_kernels._fused_linear_torch import _one_thread, block_rows, compute_dtype, output_buffer


# Chunks run over the vocabulary with all tokens at once: every weight row and every d_W row is
# touched exactly once per pass, and each matmul has the full token count as its inner or outer
# dimension. (Chunking over tokens instead re-streams the whole [V, H] d_W accumulator per chunk,
# which makes the backward several times slower on CPU.)
def _chunk_vocab(N: int, V: int, chunk_bytes: int) -> int:
    return max(1, min(V, chunk_bytes // (4 * max(N, 1))))


class _Buffers:
    """One chunk's logits ``[vc, N]`` (and, for weights not in the compute dtype, its cast weight
    rows ``[vc, H]``), reused by every chunk; the last, narrower chunk takes the front of each."""

    def __init__(self, N: int, vc: int, w: torch.Tensor, cd: torch.dtype, logits: bool = True):
        self.N = N
        self.z = output_buffer(N * vc, device=w.device, dtype=cd) if logits else None
        self.w = None if w.dtype == cd else torch.empty(vc * w.shape[1], device=w.device, dtype=cd)

    def logits(self, width: int) -> torch.Tensor:
        return self.z[: self.N * width].view(width, self.N)

    def weight(self, w: torch.Tensor, v0: int, v1: int) -> torch.Tensor:
        if self.w is None:
            return w[v0:v1]
        return self.w[: (v1 - v0) * w.shape[1]].view(v1 - v0, w.shape[1]).copy_(w[v0:v1])


def _blocks(z: torch.Tensor):
    """Row (vocab) ranges of ``z`` [width, N] for an element-wise pass: blocks that stay in cache on
    a CPU, the whole chunk (one kernel per op) on a GPU."""
    width = z.shape[0]
    step = width if z.is_cuda else block_rows(z.shape[1], z.dtype)
    return [(r0, min(width, r0 + step)) for r0 in range(0, width, step)]


def _scaled_logits(h_c, w_c, b, v0, v1, inv_t, out, shift=None):
    """``out`` [v1 - v0, N] := ``(w_c @ h_c.T + b[v0:v1, None]) * inv_t - shift[None, :]``.

    Bias, temperature and shift ride in the matmul (addmm's ``input``/``alpha``), which saves full
    passes over the [chunk, N] buffer."""
    cd = out.dtype
    N = h_c.shape[0]
    if b is None and shift is None:
        return torch.addmm(out, w_c, h_c.t(), beta=0.0, alpha=inv_t, out=out)  # out's old contents ignored
    if b is None:
        init = (-shift)[None, :].expand(v1 - v0, N)
    elif shift is None:
        init = (b[v0:v1].to(cd) * inv_t)[:, None].expand(v1 - v0, N)
    else:
        init = (b[v0:v1].to(cd) * inv_t)[:, None] - shift[None, :]
    return torch.addmm(init, w_c, h_c.t(), alpha=inv_t, out=out)


def _label_slot(labels, v0, v1):
    """Tokens whose label lies in [v0, v1) and the label's row inside the chunk."""
    rows = ((labels >= v0) & (labels < v1)).nonzero().squeeze(1)
    return rows, labels[rows] - v0


def _torch_forward(h, w, b, labels, inv_t, ignore_index, with_ent, chunk_bytes, keep=False):
    """(logp, lse, entropy or sum p z, kept, shifts).

    With ``keep``, ``kept`` holds every chunk, chunk after chunk ([width, N] each, contiguous): the
    scaled logits with ``with_ent``, else ``exp(logit - shift)`` with ``shifts`` [blocks, N] the
    shift of each row block in order (see the module docstring). Without ``keep`` both are None and
    the backward recomputes the logits."""
    N, _ = h.shape
    V = w.shape[0]
    cd = compute_dtype(h, w, b)
    dev = h.device
    h_c = h.to(cd)
    m = torch.full((N,), float("-inf"), device=dev, dtype=cd)
    s0 = torch.zeros(N, device=dev, dtype=cd)
    s1 = torch.zeros(N, device=dev, dtype=cd)
    z_lab = torch.zeros(N, device=dev, dtype=cd)
    valid = labels != ignore_index
    vc = _chunk_vocab(N, V, chunk_bytes)
    buf = _Buffers(N, vc, w, cd, logits=not keep)
    kept = output_buffer(N * V, device=dev, dtype=cd) if keep else None
    exps = keep and not with_ent  # kept holds exp(z - shift), not z
    shifts = []
    tmp = None
    for v0 in range(0, V, vc):
        v1 = min(v0 + vc, V)
        out = kept[N * v0 : N * v1].view(v1 - v0, N) if keep else buf.logits(v1 - v0)
        z = _scaled_logits(h_c, buf.weight(w, v0, v1), b, v0, v1, inv_t, out)
        rows, cols = _label_slot(labels, v0, v1)
        z_lab[rows] = z[cols, rows]
        blocks = _blocks(z)
        if with_ent and tmp is None:
            tmp = torch.empty((blocks[0][1] - blocks[0][0]) * N, device=dev, dtype=cd)
        with _one_thread(z):
            for r0, r1 in blocks:
                zb = z[r0:r1]
                m_new = torch.maximum(m, zb.amax(dim=0))
                # tokens whose logits so far are all -inf (a bias of -inf) shift by 0: -inf - -inf is NaN
                shift = torch.where(m_new == float("-inf"), 0.0, m_new)
                scale = torch.exp(m - shift)
                if with_ent:  # z stays as it is (kept for the backward, or read again below)
                    e = torch.sub(zb, shift[None, :], out=tmp[: zb.numel()].view_as(zb)).exp_()
                    # p == 0 exactly where z = -inf; flooring z keeps 0 * -inf = NaN out of sum p z (a
                    # floored copy when z is kept: the backward needs its -inf, which makes p 0 there)
                    zf = zb.clamp(min=torch.finfo(cd).min) if keep else zb.clamp_(min=torch.finfo(cd).min)
                    s1.mul_(scale).add_(torch.linalg.vecdot(e, zf, dim=0))
                else:
                    e = zb.sub_(shift[None, :]).exp_()  # in place: the logit is not needed any more
                    if exps:
                        shifts.append(shift)
                s0.mul_(scale).add_(e.sum(dim=0))
                m = m_new
    lse = m + s0.log()
    lp = torch.where(valid, (z_lab - lse).clamp_(max=0.0), 0.0)
    ent = torch.where(valid, (lse - s1 / s0).clamp_(min=0.0), 0.0) if with_ent else s1
    return lp, lse, ent, kept, torch.stack(shifts) if exps else None


def _torch_backward(h, w, b, labels, lse, ent, g_lp, g_ent, inv_t, need_w, need_b, chunk_bytes, kept=None, shifts=None):
    """d_hidden, d_weight, d_bias. Each chunk's d_logits come from ``kept`` (the forward's, in the
    same chunks: exps with ``shifts``, else logits) when given, else from logits recomputed (one more
    [chunk, H] x [H, N] product)."""
    N, H = h.shape
    V = w.shape[0]
    cd = lse.dtype
    h_c = h.to(cd)
    d_h = torch.zeros(N, H, device=h.device, dtype=cd)
    d_w = output_buffer(V, H, device=h.device, dtype=cd) if need_w else None
    d_b = torch.empty(V, device=h.device, dtype=cd) if need_b else None
    g_lab = g_lp * inv_t
    c = -g_lab
    if g_ent is not None:
        a, g, e = g_ent[None, :], g_lp[None, :], ent[None, :]
    if shifts is not None:
        factors = torch.exp(shifts - lse).mul_(c)  # p = exp(z - shift) * exp(shift - lse); dz = -p g / T
    vc = _chunk_vocab(N, V, chunk_bytes)
    buf = _Buffers(N, vc, w, cd)
    tmp = None
    block = 0
    for v0 in range(0, V, vc):
        v1 = min(v0 + vc, V)
        w_c = buf.weight(w, v0, v1)
        if kept is None:
            dz = _scaled_logits(h_c, w_c, b, v0, v1, inv_t, buf.logits(v1 - v0), shift=lse)  # log p, then dz
            src = None
        else:  # dz is made block by block below, in cache; kept stays as it is (retain_graph reads it again)
            dz, src = buf.logits(v1 - v0), kept[N * v0 : N * v1].view(v1 - v0, N)
        blocks = _blocks(dz)
        if g_ent is not None and tmp is None:
            tmp = torch.empty((blocks[0][1] - blocks[0][0]) * N, device=h.device, dtype=cd)
        with _one_thread(dz):
            for r0, r1 in blocks:
                lb = dz[r0:r1]
                if shifts is not None:
                    torch.mul(src[r0:r1], factors[block][None, :], out=lb)
                    block += 1
                    continue
                if src is not None:
                    torch.sub(src[r0:r1], lse[None, :], out=lb)
                if g_ent is None:
                    lb.exp_().mul_(c[None, :])  # -p g_lp / T
                    continue
                # dz = (onehot g_lp - p (g_lp + g_ent (logp + H))) / T: finite where p underflows to 0.
                # The floor changes logp only where p == 0 (exp(-1e4) is 0 in fp64 too), and keeps
                # 0 * inf = NaN out of p * coef where a logit is -inf.
                p = torch.exp(lb, out=tmp[: lb.numel()].view_as(lb))
                lb.clamp_(min=-1e4).add_(e).mul_(a).add_(g).mul_(p).mul_(-inv_t)
        rows, cols = _label_slot(labels, v0, v1)
        dz[cols, rows] += g_lab[rows]
        d_h.addmm_(dz.t(), w_c)
        if need_w:
            torch.mm(dz, h_c, out=d_w[v0:v1])
        if need_b:
            torch.sum(dz, dim=1, out=d_b[v0:v1])
    return d_h, d_w, d_b
