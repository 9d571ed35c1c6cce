"""The torch path of ``fused_logprobs``: the same online log-sum-exp and chunked backward as the
Triton kernels, over vocab chunks with plain torch ops (CPU, fp64, and any input the Triton path
does not take). See logprobs.py for the guarantees both paths share."""
from __future__ import annotations

import torch


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
        # rows whose logits so far are all -inf (a bias of -inf) shift by 0: -inf - -inf is NaN
        shift = torch.where(m_new == float("-inf"), 0.0, m_new)
        scale = torch.exp(m - shift)
        if with_ent:
            e = torch.sub(z, shift[:, None]).exp_()
            # p == 0 exactly where z = -inf; flooring z there keeps 0 * -inf = NaN out of sum p z
            s1.mul_(scale).add_(torch.linalg.vecdot(e, z.clamp_(min=torch.finfo(cd).min)))
        else:
            e = z.sub_(shift[:, None]).exp_()  # in place: z is not needed any more
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
            # dz = (onehot g_lp - p (g_lp + g_ent (logp + H))) / T: finite where p underflows to 0.
            # The floor changes logp only where p == 0 (exp(-1e4) is 0 in fp64 too), and keeps
            # 0 * inf = NaN out of p * coef where a logit is -inf.
            dz = torch.exp(logp)
            coef = logp.clamp_(min=-1e4).add_(ent[:, None]).mul_(g_ent[:, None]).add_(g_lp[:, None])
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
