"""FSDP2-wrapped causal LMs that turn (prompt, response) batches into response log-probs.

The forward goes hidden states -> fastcrit_kernels.fused_logprobs, so the [tokens, vocab] logits
are never materialised. The wrapper is the FSDP root: its forward unshards the root-level
parameters (embeddings, final norm, lm_head), so the fused kernel sees the full lm_head weight.
"""
from __future__ import annotations

from typing import Iterator

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from fastcrit_kernels import fused_logprobs

IGNORE = -100


class CausalLMLogprobs(nn.Module):
    """Wraps a Hugging Face causal LM; ``forward`` returns fp32 log-probs of response tokens."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    @property
    def base(self) -> nn.Module:
        return getattr(self.lm, self.lm.base_model_prefix)

    def forward(self, input_ids, attention_mask, position_ids, responses, response_mask,
                temperature: float = 1.0, return_entropy: bool = False,
                packed_index: torch.Tensor | None = None):
        """input_ids/attention_mask/position_ids [B, P+R]; responses/response_mask [B, R].

        Returns logp [B, R] (0 where response_mask is 0), and entropy [B, R] when asked.

        Packed (``packed_index`` given): input_ids/position_ids are [1, T], several sequences end
        to end with positions restarting at 0 and no padding, ``attention_mask`` is None (the
        model keeps the sequences apart from the position resets: a block-causal mask on CPU,
        flash-attn's varlen path on GPU); responses/response_mask are [N] and ``packed_index`` [N]
        the position of the hidden state that predicts each of them. Returns [N] (and [N]).
        """
        if packed_index is not None:
            hidden = self.base(input_ids=input_ids, attention_mask=None, position_ids=position_ids,
                               use_cache=False).last_hidden_state[0, packed_index]
        else:
            R = responses.shape[1]
            hidden = self.base(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids, use_cache=False).last_hidden_state
            # logits at position t predict token t+1: the response tokens are predicted from P-1 .. P+R-2
            hidden = hidden[:, -R - 1:-1]
        labels = responses.masked_fill(response_mask <= 0, IGNORE)
        head = self.lm.get_output_embeddings()
        out = fused_logprobs(hidden, head.weight, labels, temperature=temperature,
                             bias=getattr(head, "bias", None), return_entropy=return_entropy,
                             ignore_index=IGNORE)
        # FSDP2 warns about (and mishandles in-place ops on) view outputs of the root module: the
        # kernel's [N] -> [B, R] reshape is a view, so hand back owning tensors ([B, R] is small).
        return tuple(t.clone() for t in out) if return_entropy else out.clone()


def shard(module: CausalLMLogprobs, world_size: int, device: torch.device,
          param_dtype: torch.dtype | None = None) -> CausalLMLogprobs:
    """fully_shard every decoder layer, then the wrapper (the root)."""
    mesh = init_device_mesh(device.type, (world_size,))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else MixedPrecisionPolicy()
    layers = getattr(module.base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(module.lm).__name__}: no decoder `layers` to shard")
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)
    return module


def full_named_tensors(module: CausalLMLogprobs) -> Iterator[tuple[str, torch.Tensor]]:
    """Full (unsharded) parameters and persistent buffers by Hugging Face name (what a Hugging
    Face checkpoint holds). A collective: every rank must iterate it to the end."""
    persistent = set(module.lm.state_dict().keys())
    named = list(module.lm.named_parameters()) + [
        (n, b) for n, b in module.lm.named_buffers() if n in persistent]
    for name, t in named:
        if isinstance(t, DTensor):
            t = t.full_tensor()
        yield name, t.detach()

