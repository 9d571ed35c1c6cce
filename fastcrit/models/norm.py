"""RMSNorm as one autograd function, for the models fastcrit trains on a CPU.

Hugging Face's RMSNorm (Qwen2, Qwen3, Llama, Mistral: the same ``forward``) is six eager ops whose
autograd graph keeps three [tokens, hidden] tensors and runs about ten element-wise passes forward
and backward. ``RMSNormFunction`` computes the same thing in fp32,

    y = w * x * r,   r = rsqrt(mean(x^2) + eps)   (one per token)

keeps x and r only, and takes its gradients in closed form:

    dw = sum over tokens of dy * x r,   dx = r (g - x r * mean(g * x r)),   g = dy * w

Why: fewer passes over fewer saved tensors, so a forward + backward takes well under half the
time of the six eager ops on a CPU, with the same values up to fp32 rounding
(tests/models/test_norm.py checks the values).

``patch_rms_norms`` points the ``forward`` of each such module of a model at it, for fp32 inputs
(any other dtype runs the module's own forward, which computes in fp32 and casts: that rounding is
kept as it is). On CUDA the trainer leaves the modules alone (Liger's kernels are there:
``fastcrit.models.liger``).
"""

from __future__ import annotations

import types

import torch

# Classes whose forward is `w * (x * rsqrt(mean(x^2) + eps))` in fp32, cast back (transformers 5.24
# modeling_qwen2 / qwen3 / llama / mistral); Gemma's (1 + w) and others are left as they are.
CLASSES = ("Qwen2RMSNorm", "Qwen3RMSNorm", "LlamaRMSNorm", "MistralRMSNorm")


class RMSNormFunction(torch.autograd.Function):
    """y = w * x * rsqrt(mean(x^2, -1) + eps) for fp32 x [..., H] and w [H]."""

    @staticmethod
    def forward(ctx, x, w, eps):
        r = torch.linalg.vecdot(x, x).div_(x.shape[-1]).add_(eps).rsqrt_().unsqueeze(-1)
        ctx.save_for_backward(x, w, r)
        return (x * r).mul_(w)

    @staticmethod
    def backward(ctx, dy):
        x, w, r = ctx.saved_tensors
        H = x.shape[-1]
        xr = x * r
        dw = torch.linalg.vecdot(dy.reshape(-1, H), xr.reshape(-1, H), dim=0) if ctx.needs_input_grad[1] else None
        dx = None
        if ctx.needs_input_grad[0]:
            g = dy * w
            m = torch.linalg.vecdot(g, xr).div_(H).unsqueeze(-1)
            dx = g.sub_(xr.mul_(m)).mul_(r)
        return dx, dw, None


def _forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    if hidden_states.dtype != torch.float32 or self.weight.dtype != torch.float32:
        return type(self).forward(self, hidden_states)
    return RMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon)


def patch_rms_norms(model: torch.nn.Module) -> int:
    """Route every RMSNorm module of ``model`` whose class is in CLASSES (with a 1-D ``weight`` and
    a ``variance_epsilon``) through ``RMSNormFunction`` for fp32 inputs; returns how many. Per
    instance: other models of the same class in the process are untouched."""
    n = 0
    for module in model.modules():
        w = getattr(module, "weight", None)
        if (
            type(module).__name__ in CLASSES
            and isinstance(w, torch.Tensor)
            and w.dim() == 1
            and isinstance(getattr(module, "variance_epsilon", None), (int, float))
        ):
            module.forward = types.MethodType(_forward, module)
            n += 1
    return n
