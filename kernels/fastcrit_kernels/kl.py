"""Per-token KL penalty between the policy and a reference policy, with verl's values and clamps.

``kl_penalty(logp, ref_logp, kind)`` for ``kind`` in:
- ``k1`` / ``kl``:          lp - ref
- ``abs``:                  |lp - ref|              (gradient 0 where lp == ref, as torch's abs)
- ``k2`` / ``mse``:         0.5 (lp - ref)^2
- ``k3`` / ``low_var_kl``:  d = clamp(ref - lp, -20, 20); kl = clamp(exp(d) - d - 1, -10, 10)
  (verl's clamps; Liger, TRL and unsloth compute k3 without them). Where a clamp is active the
  gradient is 0, exactly as torch's ``clamp`` backward (which passes the gradient on the closed
  interval, bounds included).
Values are computed in float32 and returned in the promoted input dtype. Gradients flow to both
``logp`` and ``ref_logp`` (the reference is usually detached; then nothing is computed for it).
verl's straight-through ``"k3+"`` variants are not provided.
"""

from __future__ import annotations

import torch

from fastcrit_kernels._dispatch import Variant, device_guard, jit, resolve_backend, tl, triton

KL_KINDS = {"k1": 1, "kl": 1, "abs": 2, "k2": 3, "mse": 3, "k3": 4, "low_var_kl": 4}
_BLOCK = 1024
_CHUNK = 1 << 18  # elements per chunk on the torch path: its temporaries stay chunk-sized


@jit
def _kl_term(lp, ref, KIND: tl.constexpr):
    """Value and derivative wrt lp of one KL kind, in float32 (derivative wrt ref is its negative)."""
    diff = lp - ref
    if KIND == 1:
        val = diff
        dval = tl.full(diff.shape, 1.0, tl.float32)
    elif KIND == 2:
        val = tl.abs(diff)
        dval = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
    elif KIND == 3:
        val = 0.5 * diff * diff
        dval = diff
    else:
        raw = ref - lp
        d = tl.minimum(tl.maximum(raw, -20.0), 20.0)
        e = tl.exp(d)
        k = e - d - 1.0
        val = tl.minimum(tl.maximum(k, -10.0), 10.0)
        live = (raw >= -20.0) & (raw <= 20.0) & (k >= -10.0) & (k <= 10.0)
        dval = tl.where(live, 1.0 - e, 0.0)
    return val, dval


@jit
def _kl_fwd_kernel(
    lp_ptr,  # [N] logp, any float dtype
    ref_ptr,  # [N] ref_logp
    out_ptr,  # [N] kl, output dtype
    N,
    KIND: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    lp = tl.load(lp_ptr + offs, mask=m, other=0.0).to(tl.float32)
    ref = tl.load(ref_ptr + offs, mask=m, other=0.0).to(tl.float32)
    val, _ = _kl_term(lp, ref, KIND)
    tl.store(out_ptr + offs, val.to(out_ptr.dtype.element_ty), mask=m)


@jit(do_not_specialize=("write_lp", "write_ref"))
def _kl_bwd_kernel(
    lp_ptr,  # [N] logp
    ref_ptr,  # [N] ref_logp
    go_ptr,  # [N] upstream gradient
    glp_ptr,  # [N] gradient wrt logp (written if write_lp)
    gref_ptr,  # [N] gradient wrt ref_logp (written if write_ref)
    N,
    write_lp,  # run-time flags: a uniform branch costs nothing here, and keeps 4 variants, not 12
    write_ref,
    KIND: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    lp = tl.load(lp_ptr + offs, mask=m, other=0.0).to(tl.float32)
    ref = tl.load(ref_ptr + offs, mask=m, other=0.0).to(tl.float32)
    go = tl.load(go_ptr + offs, mask=m, other=0.0).to(tl.float32)
    _, dval = _kl_term(lp, ref, KIND)
    g = go * dval
    if write_lp:
        tl.store(glp_ptr + offs, g.to(glp_ptr.dtype.element_ty), mask=m)
    if write_ref:
        tl.store(gref_ptr + offs, (-g).to(gref_ptr.dtype.element_ty), mask=m)


def _kl_torch(lp: torch.Tensor, ref: torch.Tensor, code: int, with_grad: bool):
    """Float32 value (and derivative wrt lp) of one KL kind on one chunk, vectorised torch."""
    diff = lp.float() - ref.float()  # a fresh buffer
    if code == 1:
        return diff, (torch.ones_like(diff) if with_grad else None)
    if code == 2:
        return diff.abs(), (torch.sign(diff) if with_grad else None)
    if code == 3:
        return (diff * diff).mul_(0.5), (diff if with_grad else None)
    live = (diff >= -20.0) & (diff <= 20.0) if with_grad else None
    d = diff.neg_().clamp_(-20.0, 20.0)
    e = torch.exp(d)
    k = d.neg_().add_(e).sub_(1.0)  # exp(d) - d - 1, in d's buffer
    if not with_grad:
        return k.clamp_(-10.0, 10.0), None
    live &= (k >= -10.0) & (k <= 10.0)
    return k.clamp_(-10.0, 10.0), e.neg_().add_(1.0).mul_(live)


def _chunks(n: int):
    for i in range(0, n, _CHUNK):
        yield slice(i, min(n, i + _CHUNK))


def _grid(n: int):
    return (triton.cdiv(max(n, 1), _BLOCK),)


class _KLPenalty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, ref_logp, code, backend):
        out_dtype = torch.promote_types(logp.dtype, ref_logp.dtype)
        lp, ref = logp.contiguous(), ref_logp.contiguous()
        if backend == "triton":
            out = torch.empty(lp.shape, dtype=out_dtype, device=lp.device)
            n = lp.numel()
            if n:
                with device_guard(lp):
                    _kl_fwd_kernel[_grid(n)](lp, ref, out, n, KIND=code, BLOCK=_BLOCK)
        else:
            out = torch.empty(lp.shape, dtype=out_dtype, device=lp.device)
            o, a, b = out.view(-1), lp.view(-1), ref.view(-1)
            for c in _chunks(o.numel()):
                o[c] = _kl_torch(a[c], b[c], code, False)[0]
        ctx.save_for_backward(lp, ref)
        ctx.code, ctx.backend = code, backend
        return out

    @staticmethod
    def backward(ctx, grad_out):
        lp, ref = ctx.saved_tensors
        need_lp, need_ref = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        go = grad_out.contiguous()
        if ctx.backend == "triton":
            glp = torch.empty_like(lp) if need_lp else None
            gref = torch.empty_like(ref) if need_ref else None
            n = lp.numel()
            if n:
                with device_guard(lp):
                    _kl_bwd_kernel[_grid(n)](
                        lp,
                        ref,
                        go,
                        glp if need_lp else lp,
                        gref if need_ref else ref,
                        n,
                        int(need_lp),
                        int(need_ref),
                        KIND=ctx.code,
                        BLOCK=_BLOCK,
                    )
        else:
            glp = torch.empty_like(lp) if need_lp else None
            gref = torch.empty_like(ref) if need_ref else None
            a, b, gf = lp.view(-1), ref.view(-1), go.view(-1)
            for c in _chunks(a.numel()):
                g = _kl_torch(a[c], b[c], ctx.code, True)[1].mul_(gf[c])
                if need_lp:
                    glp.view(-1)[c] = g
                if need_ref:
                    gref.view(-1)[c] = g.neg_()
        return glp, gref, None, None


def _gpu_variants() -> list[Variant]:
    """Every compilation a GPU launch of this module can ask for, with logp, ref_logp and the
    upstream gradient in one dtype (mixed dtypes compile the same code with other load types)."""
    out = []
    for dt in ("fp32", "bf16", "fp16"):
        for kind in sorted(set(KL_KINDS.values())):
            out.append(
                Variant.of(
                    _kl_fwd_kernel,
                    dt,
                    dict(lp_ptr=dt, ref_ptr=dt, out_ptr=dt),
                    constexprs=dict(KIND=kind, BLOCK=_BLOCK),
                )
            )
            out.append(
                Variant.of(
                    _kl_bwd_kernel,
                    dt,
                    dict(lp_ptr=dt, ref_ptr=dt, go_ptr=dt, glp_ptr=dt, gref_ptr=dt),
                    constexprs=dict(KIND=kind, BLOCK=_BLOCK),
                )
            )
    return out


def kl_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "low_var_kl", *, backend: str = "auto"
) -> torch.Tensor:
    """Per-token KL estimate between policy and reference log-probs (verl ``kl_penalty``).

    Args:
        logp: [...] log-probs of the sampled tokens under the policy (float).
        ref_logp: [...] the same tokens under the reference policy; same shape as ``logp``.
        kind: ``k1``/``kl``, ``abs``, ``k2``/``mse`` or ``k3``/``low_var_kl`` (see module docstring).
        backend: ``auto`` | ``triton`` | ``torch``.
    Returns:
        [...] per-token KL in the promoted dtype of the inputs; no masking is applied (aggregate
        with ``aggregate_loss`` and a response mask).
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kind must be one of {sorted(KL_KINDS)}, got {kind!r}")
    for name, t in (("logp", logp), ("ref_logp", ref_logp)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor")
    if logp.shape != ref_logp.shape:
        raise ValueError(f"ref_logp shape {tuple(ref_logp.shape)} != logp shape {tuple(logp.shape)}")
    if logp.device != ref_logp.device:
        raise ValueError("logp and ref_logp must be on the same device")
    chosen = resolve_backend(backend, logp, ref_logp)
    return _KLPenalty.apply(logp, ref_logp, KL_KINDS[kind], chosen)
