"""The gated SiLU MLP as one autograd function, for the models fastcrit trains on a CPU.

Hugging Face's MLP (Qwen2, Qwen3, Llama, Mistral: the same ``forward``) is

    y = down(silu(g) * u),   g = gate(x),   u = up(x)

in four eager ops whose autograd graph keeps four [tokens, intermediate] tensors per layer (g,
silu(g), u and their product) and whose backward allocates four more. ``SwiGLUFunction`` computes
the same thing in fp32, keeps x, g and u only, and in the backward recomputes silu(g) and the
product block by block (rows that stay in cache), writing the gradients into the storage of the
tensors it no longer needs:

    dh = dy @ W_down                        (the one new [tokens, intermediate] buffer)
    h = silu(g) * u                         -> into u's storage, for  dW_down = dy^T h
    du = dh * silu(g)                       -> into dh's storage
    dg = dh * u * s (1 + g - silu(g)),  s = sigmoid(g)   -> into g's storage
    dx = dg @ W_gate + du @ W_up,   dW_gate = dg^T x,   dW_up = du^T x

So its saved tensors are read once and overwritten: a second backward through the same graph
(``retain_graph=True``) stops with autograd's error about a tensor modified in place, never with
wrong gradients. Without gradients (the frozen reference, log-prob passes) the forward computes
silu(g) * u in g's storage, block by block.

Why: it keeps fewer and smaller tensors than the Hugging Face MLP's autograd graph, so a CPU
update peaks lower at the same speed (reproduce with benchmarks/bench_trl.py ``--setting large``,
taking turns with the unpatched MLP); its gradients equal Hugging Face's in fp32 up to rounding
(tests/models/test_mlp.py checks a whole model's).

``patch_swiglu_mlps`` points the ``forward`` of each such module at it, for fp32 inputs when the
three projections are plain bias-free ``nn.Linear``\\s and the activation is SiLU (any other dtype,
a bias, an adapter-wrapped projection or another activation runs the module's own forward). On
CUDA the trainer leaves the modules alone (Liger's kernels are there: ``fastcrit.models.liger``).
"""

from __future__ import annotations

import types

import torch

# Classes whose forward is `down_proj(act_fn(gate_proj(x)) * up_proj(x))` (transformers 5.24
# modeling_qwen2 / qwen3 / llama / mistral).
CLASSES = ("Qwen2MLP", "Qwen3MLP", "LlamaMLP", "MistralMLP")
# Activation modules that are SiLU: transformers' ACT2FN["silu"] and ACT2FN["swish"].
_SILU = ("SiLUActivation", "SiLU")
_BLOCK_BYTES = 384 << 10  # one [rows, intermediate] block of the element-wise passes (a few stay in cache)

_silu_out = torch.ops.aten.silu.out


def _rows(intermediate: int) -> int:
    return max(1, _BLOCK_BYTES // (4 * max(intermediate, 1)))


def _gated_(g: torch.Tensor, u: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out := silu(g) * u, block by block (``out`` may be ``g``)."""
    b = _rows(g.shape[1])
    for r0 in range(0, g.shape[0], b):
        _silu_out(g[r0 : r0 + b], out=out[r0 : r0 + b]).mul_(u[r0 : r0 + b])
    return out


class SwiGLUFunction(torch.autograd.Function):
    """down(silu(x @ W_gate^T) * (x @ W_up^T)) for fp32 x [..., H] and bias-free weights
    W_gate, W_up [I, H], W_down [H, I]."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down):
        x2 = x.reshape(-1, x.shape[-1])
        g, u = x2 @ w_gate.t(), x2 @ w_up.t()
        y = _gated_(g, u, torch.empty_like(g)) @ w_down.t()
        ctx.save_for_backward(x2, g, u, w_gate, w_up, w_down)
        return y.view(*x.shape[:-1], w_down.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, g, u, w_gate, w_up, w_down = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        dh = dy2 @ w_down
        b = max(1, min(_rows(g.shape[1]), g.shape[0]))
        sig, silu, t = (g.new_empty(b, g.shape[1]) for _ in range(3))
        for r0 in range(0, g.shape[0], b):
            gb, ub, db = g[r0 : r0 + b], u[r0 : r0 + b], dh[r0 : r0 + b]
            n = gb.shape[0]
            s, f, tb = sig[:n], silu[:n], t[:n]
            torch.sigmoid(gb, out=s)
            torch.mul(gb, s, out=f)
            torch.mul(db, ub, out=tb)  # dh * u
            ub.mul_(f)  # u := h
            db.mul_(f)  # dh := du
            gb.sub_(f).add_(1).mul_(s).mul_(tb)  # g := dg
        dg, h, du = g, u, dh
        need = ctx.needs_input_grad
        dx = torch.addmm(dg @ w_gate, du, w_up).view(*dy.shape[:-1], x2.shape[1]) if need[0] else None
        return (
            dx,
            dg.t() @ x2 if need[1] else None,
            du.t() @ x2 if need[2] else None,
            dy2.t() @ h if need[3] else None,
        )


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    ws = (self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)
    if x.dtype != torch.float32 or any(w.dtype != torch.float32 for w in ws):
        return type(self).forward(self, x)
    if torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in ws)):
        return SwiGLUFunction.apply(x, *ws)
    x2 = x.reshape(-1, x.shape[-1])
    g = x2 @ ws[0].t()
    return (_gated_(g, x2 @ ws[1].t(), g) @ ws[2].t()).view(*x.shape[:-1], ws[2].shape[0])


def _fusable(module: torch.nn.Module) -> bool:
    if type(module).__name__ not in CLASSES or type(getattr(module, "act_fn", None)).__name__ not in _SILU:
        return False
    projs = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return all(type(p) is torch.nn.Linear and p.bias is None for p in projs)


def patch_swiglu_mlps(model: torch.nn.Module) -> int:
    """Route every gated MLP of ``model`` whose class is in CLASSES (SiLU activation, three plain
    bias-free ``nn.Linear`` projections) through ``SwiGLUFunction`` for fp32 inputs; returns how
    many. Per instance: other models of the same class in the process are untouched."""
    n = 0
    for module in model.modules():
        if _fusable(module):
            module.forward = types.MethodType(_forward, module)
            n += 1
    return n
