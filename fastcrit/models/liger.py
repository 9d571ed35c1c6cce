"""Liger-Kernel's model patches (RMSNorm, SwiGLU MLP, RoPE) on the models fastcrit trains, on CUDA.

Checked against liger-kernel 0.8.5, ``liger_kernel/transformers/monkey_patch.py``:
``apply_liger_kernel_to_qwen2`` (:1750) and ``apply_liger_kernel_to_llama`` (:259), each called with
``model=`` so that the already-built model's RMSNorm and MLP modules are patched too. Liger covers
more architectures (``MODEL_TYPE_TO_APPLY_LIGER_FN``, :3904); ``SUPPORTED`` lists the ones this
project has exercised, and any other architecture is left as it is.

What is NOT applied, and why: Liger's fused linear cross-entropy and cross-entropy patches replace
the causal LM's ``forward`` / loss, which fastcrit never calls. The policy runs the base model and
turns hidden states into log-probs (SFT's loss included) with ``fastcrit_kernels.fused_logprobs``,
which already never materialises the logits.

What the patches do beyond this model: Liger replaces the RoPE function and the RMSNorm / MLP
classes in the transformers modeling module of that architecture for the whole process, so every
model of that architecture built afterwards in the process (the reference, a critic, the native
engine's copy) runs Liger's kernels as well. That is why the trainer applies them only on CUDA:
on CPU the kernels run only under TRITON_INTERPRET, where RMSNorm and SwiGLU fail (docs/gpu.md).
"""

from __future__ import annotations

SUPPORTED = ("qwen2", "llama")  # config.model_type values
PATCHES = ("rope", "rms_norm", "swiglu")


def apply_liger(lm, *, rope: bool = True, rms_norm: bool = True, swiglu: bool = True) -> list[str]:
    """Patch the Hugging Face model ``lm`` (a causal LM, or any model whose ``config.model_type`` is
    supported) in place; returns the patches applied, ``[]`` for an architecture not in SUPPORTED.

    Raises ImportError when liger-kernel is not installed (it comes with ``fastcrit[gpu]``; set
    ``model.liger=false`` to train without it).
    """
    model_type = getattr(getattr(lm, "config", None), "model_type", None)
    if model_type not in SUPPORTED:
        return []
    try:
        from liger_kernel.transformers import monkey_patch
    except ImportError as exc:
        raise ImportError(
            "model.liger=true needs liger-kernel (pip install 'fastcrit[gpu]'), or set model.liger=false"
        ) from exc
    apply = {"qwen2": monkey_patch.apply_liger_kernel_to_qwen2, "llama": monkey_patch.apply_liger_kernel_to_llama}[
        model_type
    ]
    apply(rope=rope, rms_norm=rms_norm, swiglu=swiglu, cross_entropy=False, fused_linear_cross_entropy=False, model=lm)
    return [name for name, on in zip(PATCHES, (rope, rms_norm, swiglu)) if on]
