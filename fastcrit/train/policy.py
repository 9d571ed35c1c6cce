"""FSDP2-wrapped causal LMs that turn (prompt, response) batches into response log-probs.

The forward goes hidden states -> fastcrit_kernels.fused_logprobs, so the [tokens, vocab] logits
are never materialised. The wrapper is the FSDP root: its forward unshards the root-level
parameters (embeddings, final norm, lm_head), so the fused kernel sees the full lm_head weight.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DynamicCache

from fastcrit_kernels import fused_logprobs

IGNORE = -100


def graph_attention(module: nn.Module):
    """The attention backend for a forward that builds a graph: SDPA's math path where the module
    trains in bf16/fp16 on a CPU (``module.math_attention_for_grad``, set by wrap_trainable), else
    whatever SDPA picks. torch's CPU flash-attention backward in bf16 took 85 ms per layer where its
    forward took 7 (13.4M-parameter model, 32 rows of 88 tokens, one thread; 26% of an update), and
    the math path's backward is matrix products: that update 1.0-1.1 s instead of 1.2-1.8 s, the
    gradients equal to bf16 rounding. The backward follows the forward's path, so only the forward
    needs the context; fp32 and CUDA keep flash attention (fp32 on a CPU: the same time either way)."""
    if getattr(module, "math_attention_for_grad", False) and torch.is_grad_enabled():
        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


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
                packed_index: torch.Tensor | None = None, share_prompts: bool = False):
        """input_ids/attention_mask/position_ids [B, P+R]; responses/response_mask [B, R].

        Returns logp [B, R] (0 where response_mask is 0), and entropy [B, R] when asked.

        Packed (``packed_index`` given): input_ids/position_ids are [1, T], several sequences end
        to end with positions restarting at 0 and no padding, ``attention_mask`` is None (the
        model keeps the sequences apart from the position resets: a block-causal mask on CPU,
        flash-attn's varlen path on GPU); responses/response_mask are [N] and ``packed_index`` [N]
        the position of the hidden state that predicts each of them. Returns [N] (and [N]).

        ``share_prompts``: rows with the same prompt (a GRPO group's n samples) run their prompt
        once (``shared_prompt_hidden``); the same log-probs and gradients, up to rounding.
        """
        with graph_attention(self):
            return self._forward(input_ids, attention_mask, position_ids, responses, response_mask, temperature,
                                 return_entropy, packed_index, share_prompts)

    def _forward(self, input_ids, attention_mask, position_ids, responses, response_mask, temperature,
                 return_entropy, packed_index, share_prompts):
        R = responses.shape[-1]
        hidden = None
        if packed_index is not None:
            hidden = self.base(input_ids=input_ids, attention_mask=None, position_ids=position_ids,
                               use_cache=False).last_hidden_state[0, packed_index]
        elif share_prompts:
            hidden = self.shared_prompt_hidden(input_ids, attention_mask, position_ids, R)
        if hidden is None:
            # logits at position t predict token t+1: the response tokens are predicted from
            # P-1 .. P+R-2, and the last position predicts nothing, so it is left out of the
            # forward (a causal model's other positions never see it)
            hidden = self.base(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                               position_ids=position_ids[:, :-1], use_cache=False).last_hidden_state
            hidden = hidden[:, -R:]
        labels = responses.masked_fill(response_mask <= 0, IGNORE)
        head = self.lm.get_output_embeddings()
        out = fused_logprobs(hidden, head.weight, labels, temperature=temperature,
                             bias=getattr(head, "bias", None), return_entropy=return_entropy,
                             ignore_index=IGNORE)
        # FSDP2 warns about (and mishandles in-place ops on) view outputs of the root module: the
        # kernel's [N] -> [B, R] reshape is a view, so hand back owning tensors ([B, R] is small).
        return tuple(t.clone() for t in out) if return_entropy else out.clone()

    def shared_prompt_hidden(self, input_ids, attention_mask, position_ids, R: int) -> torch.Tensor | None:
        """The hidden states that predict the R response tokens [B, R, H], each distinct prompt of
        the batch run once: a forward over the distinct prompts fills a KV cache, which is then
        indexed out to their rows (a differentiable gather: the gradients of a prompt's rows add
        up in its keys and values), and a second forward runs the responses against it. Rows
        [prompt | response], prompts left-padded, responses right-padded, as ``forward`` takes
        them. In one process, None when no two rows share a prompt (nothing to save: ``forward``
        runs them whole); across processes always the two passes, since FSDP's collectives need
        every rank to run the model as many times.

        Of a group of n samples with prompt length p and response length r, the layers see
        p + n (r - 1) tokens instead of n (p + r - 1); attention is the same (each response reads its own
        prompt's keys). Exact up to rounding: the prompt's keys and values are those of the whole
        sequence, since a prompt token never attends to what follows it."""
        P = input_ids.shape[1] - R
        if P <= 0 or not _attention_only(self.lm.config):
            return None
        rows = input_ids.shape[0]
        key = torch.cat([input_ids[:, :P], attention_mask[:, :P]], dim=1)
        _, inverse = torch.unique(key, dim=0, return_inverse=True)
        distinct = int(inverse.max()) + 1
        if distinct == rows and not (dist.is_initialized() and dist.get_world_size() > 1):
            return None
        # one row standing for each distinct prompt (identical rows: any one of them)
        rep = torch.empty(distinct, dtype=torch.long, device=inverse.device).scatter_(
            0, inverse, torch.arange(rows, device=inverse.device))
        try:  # Transformers >= 4.56 sizes each layer's cache by the config (sliding windows)
            cache = DynamicCache(config=self.lm.config)
        except TypeError:
            cache = DynamicCache()
        arg = _cache_kwarg(type(self.base))
        first = self.base(input_ids=input_ids[rep, :P], attention_mask=attention_mask[rep, :P],
                          position_ids=position_ids[rep, :P], use_cache=True, **{arg: cache}).last_hidden_state
        cache.batch_select_indices(inverse)  # each row its prompt's keys and values
        # response t predicts t+1; the last response token predicts nothing and is not run, but
        # for R = 1 it is (every rank runs the second forward, and an empty one would fail)
        end = -1 if R > 1 else None
        rest = self.base(input_ids=input_ids[:, P:end], attention_mask=attention_mask[:, :end],
                         position_ids=position_ids[:, P:end], use_cache=True, **{arg: cache}).last_hidden_state
        # the prompt's last position predicts the first response token
        return torch.cat([first[inverse, -1:], rest[:, :R - 1]], dim=1)


def _attention_only(config) -> bool:
    """Whether every layer is (full or sliding-window) attention, whose cache is keys and values a
    gather can hand to other rows; a recurrent layer's state (Mamba, linear attention) is not
    shared: such models run their rows whole."""
    kinds = getattr(config, "layer_types", None) or ["full_attention"]
    return all(k in ("full_attention", "sliding_attention") for k in kinds)


@functools.cache
def _cache_kwarg(model_class: type) -> str:
    """The name Hugging Face's model forward gives its KV cache argument: ``cache`` from
    Transformers 5.x (``past_key_values`` deprecated there), ``past_key_values`` before. Read once
    per model class."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


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

