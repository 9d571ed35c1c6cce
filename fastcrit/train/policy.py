"""FSDP2-wrapped causal LMs that turn (prompt, response) batches into response log-probs.

The forward goes hidden states -> fastcrit_kernels.fused_logprobs, so the [tokens, vocab] logits
are never materialised. The wrapper is the FSDP root: its forward unshards the root-level
parameters (embeddings, final norm, lm_head), so the fused kernel sees the full lm_head weight.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils.checkpoint
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DynamicCache

from fastcrit.models.logit_head import logit_scale
from fastcrit_kernels import fused_logprobs

IGNORE = -100


def graph_attention(module: nn.Module):
    """The attention backend for a forward that builds a graph: SDPA's math path where the module
    trains in bf16/fp16 on a CPU (``module.math_attention_for_grad``, set by wrap_trainable), else
    whatever SDPA picks. Why: torch's CPU flash-attention backward in bf16 is many times slower
    than its forward, a large share of a small model's update, while the math path's backward is
    matrix products: the update is faster and the gradients equal to bf16 rounding (the figures:
    docs/LOG.md). The backward follows the forward's path, so only the forward
    needs the context; fp32 and CUDA keep flash attention (fp32 on a CPU: the same time either way)."""
    if getattr(module, "math_attention_for_grad", False) and torch.is_grad_enabled():
        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


class CausalLMLogprobs(nn.Module):
    """Wraps a Hugging Face causal LM; ``forward`` returns fp32 log-probs of response tokens.

    A model whose logits are ``lm_head``'s output times a constant (Granite, Cohere, ...) has the
    constant folded into the temperature (``logit_scale``); one that transforms it otherwise (a
    ``tanh`` cap) is refused here with UnsupportedLogits naming the setting, since the fused
    kernel computes the log-probs from the hidden states and ``lm_head`` alone."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm
        self.logit_scale = logit_scale(lm)
        self.checkpointing = False  # set by checkpoint_layers

    @property
    def base(self) -> nn.Module:
        return getattr(self.lm, self.lm.base_model_prefix)

    def forward(
        self,
        input_ids,
        attention_mask,
        position_ids,
        responses,
        response_mask,
        temperature: float = 1.0,
        return_entropy: bool = False,
        packed_index: torch.Tensor | None = None,
        share_prompts: bool = False,
    ):
        """input_ids/attention_mask/position_ids [B, P+R]; responses/response_mask [B, R].

        Returns logp [B, R] (0 where response_mask is 0), and entropy [B, R] when asked.

        Packed (``packed_index`` given): input_ids/position_ids are [1, T], several sequences end
        to end with positions restarting at 0 and no padding, ``attention_mask`` is None (the
        model keeps the sequences apart from the position resets: a block-causal mask on CPU,
        flash-attn's varlen path on GPU); responses/response_mask are [N] and ``packed_index`` [N]
        the position of the hidden state that predicts each of them. Returns [N] (and [N]).

        ``share_prompts``: rows with the same prompt (a GRPO group's n samples) run their prompt
        once (``shared_prompt_hidden``); the same log-probs and gradients, up to rounding. Not in
        a forward that builds a graph under activation checkpointing (``checkpoint_layers``): the
        backward's recompute of a layer would write its keys into the shared cache a second time,
        so those rows run whole (forward-only passes still share).
        """
        if self.checkpointing and torch.is_grad_enabled():
            share_prompts = False
        with graph_attention(self):
            return self._forward(
                input_ids,
                attention_mask,
                position_ids,
                responses,
                response_mask,
                temperature,
                return_entropy,
                packed_index,
                share_prompts,
            )

    def _forward(
        self,
        input_ids,
        attention_mask,
        position_ids,
        responses,
        response_mask,
        temperature,
        return_entropy,
        packed_index,
        share_prompts,
    ):
        R = responses.shape[-1]
        hidden = None
        if packed_index is not None:
            hidden = self.base(
                input_ids=input_ids, attention_mask=None, position_ids=position_ids, use_cache=False
            ).last_hidden_state[0, packed_index]
        elif share_prompts:
            hidden = self.shared_prompt_hidden(input_ids, attention_mask, position_ids, R)
        if hidden is None:
            # logits at position t predict token t+1: the response tokens are predicted from
            # P-1 .. P+R-2, and the last position predicts nothing, so it is left out of the
            # forward (a causal model's other positions never see it)
            hidden = self.base(
                input_ids=input_ids[:, :-1],
                attention_mask=attention_mask[:, :-1],
                position_ids=position_ids[:, :-1],
                use_cache=False,
            ).last_hidden_state
            hidden = hidden[:, -R:]
        labels = responses.masked_fill(response_mask <= 0, IGNORE)
        head = self.lm.get_output_embeddings()
        out = fused_logprobs(
            hidden,
            head.weight,
            labels,
            temperature=temperature if self.logit_scale == 1.0 else temperature / self.logit_scale,
            bias=getattr(head, "bias", None),
            return_entropy=return_entropy,
            ignore_index=IGNORE,
        )
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
        sequence, since a prompt token never attends to what follows it.

        With SDPA attention, a prompt's short responses run end to end in one row of the second
        pass (``_pack_responses``; a block-causal mask), so the padding of a right-padded batch
        is mostly not run, which shortens the reference pass and the update when responses stop
        early (the same log-probs and gradients as the rows run one by one; the figures:
        docs/LOG.md)."""
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
            0, inverse, torch.arange(rows, device=inverse.device)
        )
        try:  # Transformers >= 4.56 sizes each layer's cache by the config (sliding windows)
            cache = DynamicCache(config=self.lm.config)
        except TypeError:
            cache = DynamicCache()
        arg = _cache_kwarg(type(self.base))
        first = self.base(
            input_ids=input_ids[rep, :P],
            attention_mask=attention_mask[rep, :P],
            position_ids=position_ids[rep, :P],
            use_cache=True,
            **{arg: cache},
        ).last_hidden_state
        plan = _pack_responses(attention_mask[:, P:], inverse, R - 1) if _packable(self.lm.config) else None
        if plan is not None:
            rest = self._packed_responses(input_ids, attention_mask, position_ids, R, cache, arg, inverse, plan)
        else:
            cache.batch_select_indices(inverse)  # each row its prompt's keys and values
            # response t predicts t+1; the last response token predicts nothing and is not run, but
            # for R = 1 it is (every rank runs the second forward, and an empty one would fail)
            end = -1 if R > 1 else None
            rest = self.base(
                input_ids=input_ids[:, P:end],
                attention_mask=attention_mask[:, :end],
                position_ids=position_ids[:, P:end],
                use_cache=True,
                **{arg: cache},
            ).last_hidden_state
        # the prompt's last position predicts the first response token
        return torch.cat([first[inverse, -1:], rest[:, : R - 1]], dim=1)

    def _packed_responses(self, input_ids, attention_mask, position_ids, R, cache, arg, inverse, plan):
        """The responses' second forward with short responses of one prompt end to end in one row
        (``_pack_responses``' plan): each segment reads its prompt's keys and its own earlier
        tokens (a block-causal 4D mask) at its own positions. Returns [B, R - 1, H] in row order;
        the places past a row's last run token hold another place's state (their labels are
        padding: no log-prob, no gradient)."""
        P = input_ids.shape[1] - R
        lead, row, col, src, seg = plan
        nb, C, dev = len(lead), R - 1, input_ids.device
        ids = torch.zeros(nb, C, dtype=input_ids.dtype, device=dev)
        pos = torch.zeros(nb, C, dtype=position_ids.dtype, device=dev)
        ids[row, col] = input_ids[:, P:-1][src]
        pos[row, col] = position_ids[:, P:-1][src]
        # a query reads its prompt's real tokens and its own segment up to itself; places after a
        # bin's last segment (seg -1) read the prompt only (an all-False row would give NaN)
        causal = torch.ones(C, C, dtype=torch.bool, device=dev).tril()
        own = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] >= 0) & causal
        prompt = attention_mask[lead, :P].bool()[:, None, :].expand(nb, C, P)
        mask = torch.cat([prompt, own], dim=2)[:, None]
        cache.batch_select_indices(inverse[lead])  # each bin its prompt's keys and values
        out = self.base(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{arg: cache}
        ).last_hidden_state
        index = torch.zeros(input_ids.shape[0], C, dtype=torch.long, device=dev)
        index[src] = row * C + col
        return out.reshape(nb * C, -1)[index]


def _packable(config) -> bool:
    """Whether responses may be packed end to end in the shared-prompt pass: SDPA attention (it
    takes a custom boolean 4D mask; flash-attention kernels take none, eager ones an additive one)
    over full-attention layers only (a sliding window would need its own mask)."""
    kinds = getattr(config, "layer_types", None) or ["full_attention"]
    # a window set and not switched off (Mistral sets one and has no switch; Qwen2 has the switch)
    window = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    return (
        getattr(config, "_attn_implementation", None) == "sdpa"
        and all(k == "full_attention" for k in kinds)
        and not window
    )


def _pack_responses(resp_mask: torch.Tensor, inverse: torch.Tensor, C: int):
    """A plan to run the responses' tokens 0 .. L-2 (``resp_mask`` [B, R] right-padded, C = R - 1
    places a row) in fewer rows: a prompt's responses first-fit, longest first, into rows of C
    places. None when that saves no row (or there is nothing to run). Else (lead [nb]: a row of each
    packed row's prompt; row, col: each run token's packed place; src: its (row, position) in the
    batch; seg [nb, C]: a segment id per place, -1 past the last segment)."""
    lengths = resp_mask.sum(1)
    R = resp_mask.shape[1]
    if not torch.equal(resp_mask.bool(), torch.arange(R, device=resp_mask.device) < lengths[:, None]):
        return None  # not right-padded: run the rows as they are
    runs = (lengths - 1).clamp(min=0, max=C).tolist()
    B = len(runs)
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(inverse.tolist()):
        if runs[i] > 0:
            groups.setdefault(g, []).append(i)
    bins: list[list[int]] = []  # rows of each packed row
    free: list[int] = []
    for rows in groups.values():
        mine: list[int] = []
        for i in sorted(rows, key=lambda r: -runs[r]):
            b = next((b for b in mine if free[b] >= runs[i]), None)
            if b is None:
                b = len(bins)
                bins.append([])
                free.append(C)
                mine.append(b)
            bins[b].append(i)
            free[b] -= runs[i]
    if not bins or len(bins) >= B:
        return None
    row, col, sr, sc = [], [], [], []
    for b, members in enumerate(bins):
        off = 0
        for i in members:
            n = runs[i]
            row += [b] * n
            col += range(off, off + n)
            sr += [i] * n
            sc += range(n)
            off += n
    dev = resp_mask.device
    t = functools.partial(torch.tensor, dtype=torch.long, device=dev)
    row, col, sr = t(row), t(col), t(sr)
    seg = torch.full((len(bins), C), -1, dtype=torch.long, device=dev)
    seg[row, col] = sr  # a segment is named by its row
    return t([m[0] for m in bins]), row, col, (sr, t(sc)), seg


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


def decoder_layers(module: nn.Module) -> nn.ModuleList:
    """The decoder layers of a wrapped model (``module.base.layers``): FSDP2's units and the
    checkpointed blocks."""
    layers = getattr(module.base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(module.lm).__name__}: no decoder `layers` to shard or checkpoint")
    return layers


def _passes_cache(kwargs: dict) -> bool:
    """Whether a decoder layer's call carries a KV cache (Transformers 5.x ``cache``, earlier
    ``past_key_values``): the shared-prompt passes, which checkpointed and compiled layers run plain."""
    return kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None


def checkpoint_layers(module: nn.Module) -> None:
    """Activation checkpointing per decoder layer (``trainer.gradient_checkpointing``): a forward
    that builds a graph keeps only each layer's input, and the backward runs the layer again
    (torch.utils.checkpoint, non-reentrant) just before its own backward. The same loss and
    gradients (the recompute is the same arithmetic; dropout, if any, replays its RNG state), one
    more forward of the layers in time, and activations of one layer instead of all of them.

    ``forward`` is wrapped rather than ``__call__``, so module hooks stay outside the checkpoint:
    FSDP2's pre-forward all-gather runs once per forward, and its pre-backward hook has the layer's
    weights gathered again by the time the recompute reads them. Forwards without gradients run
    the layer as it is. A call that passes a KV cache runs as it is too: the recompute would write
    the cache a second time (``CausalLMLogprobs`` runs whole rows under checkpointing instead).
    Call before ``shard``."""
    for layer in decoder_layers(module):
        if getattr(layer, "_fastcrit_checkpointed", False):
            continue
        plain = layer.forward

        def forward(*args, _plain=plain, **kwargs):
            if not torch.is_grad_enabled() or _passes_cache(kwargs):
                return _plain(*args, **kwargs)
            return torch.utils.checkpoint.checkpoint(_plain, *args, use_reentrant=False, **kwargs)

        layer.forward = forward
        layer._fastcrit_checkpointed = True
    module.checkpointing = True


def compile_layers(module: nn.Module, backend: str = "inductor") -> None:
    """``trainer.compile``: each decoder layer's ``forward`` through ``torch.compile`` (Inductor by
    default; CPU and CUDA), with dynamic shapes, so rows and sequence lengths change without a new
    graph. Only the layers: they are the same code, so one layer's graphs serve all of them, and
    the rest of the forward (masks, the prompt-sharing cache gathers, the fused log-prob kernel)
    stays eager, where its data-dependent shapes and Python loops would break graphs. A layer still
    gets a graph per kind of call (with and without gradients, a 4D mask or none, one row or
    more); ``compile_stats`` counts them.

    A call with a KV cache (the shared-prompt passes, ``shared_prompt_hidden``) runs the layer
    eager: Hugging Face's cache hands each layer its own slot by the layer's index, so a compiled
    layer would be guarded on that index and on the slot's state, a graph per layer and per pass,
    past torch's recompile limit (8) for any real depth.

    ``forward`` is wrapped rather than ``__call__``, as in ``checkpoint_layers``: FSDP2's hooks stay
    outside the graph. Call before ``checkpoint_layers`` (the checkpoint then recomputes the
    compiled layer) and before ``shard``. The same log-probs and gradients as eager to fp32
    rounding (tests/train/test_compile.py)."""
    for layer in decoder_layers(module):
        if getattr(layer, "_fastcrit_compiled", False):
            continue
        plain = layer.forward
        graph = torch.compile(plain, dynamic=True, backend=backend)

        def forward(*args, _plain=plain, _graph=graph, **kwargs):
            return _plain(*args, **kwargs) if _passes_cache(kwargs) else _graph(*args, **kwargs)

        layer.forward = forward
        layer._fastcrit_compiled = True
    module.compiled = True


def compile_stats() -> dict[str, float]:
    """This process's ``torch.compile`` work so far: ``compile/graphs`` (frames compiled, the
    first of each kind of call and every recompile), ``compile/recompiles`` and ``compile/time_s``
    (the wall time those compilations took; it is also inside the phase that triggered them, as
    the first step's ``time/update_s``). From torch's own compilation records; {} where this torch
    keeps none."""
    try:
        from torch._dynamo.utils import get_compilation_metrics

        records = list(get_compilation_metrics())
    except (ImportError, AttributeError):
        return {}
    return {
        "compile/graphs": float(len(records)),
        "compile/recompiles": float(sum(1 for r in records if getattr(r, "recompile_reason", None))),
        "compile/time_s": float(sum(getattr(r, "entire_frame_compile_time_s", None) or 0.0 for r in records)),
    }


def shard(
    module: CausalLMLogprobs, world_size: int, device: torch.device, param_dtype: torch.dtype | None = None
) -> CausalLMLogprobs:
    """fully_shard every decoder layer, then the wrapper (the root)."""
    mesh = init_device_mesh(device.type, (world_size,))
    mp = (
        MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        if param_dtype
        else MixedPrecisionPolicy()
    )
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)
    return module


def _named(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Parameters and persistent buffers by Hugging Face name (what a Hugging Face checkpoint
    holds), in the model's order."""
    persistent = set(module.lm.state_dict().keys())
    return list(module.lm.named_parameters()) + [(n, b) for n, b in module.lm.named_buffers() if n in persistent]


def load_from_rank0(module: nn.Module, full: dict[str, torch.Tensor] | None, device: torch.device) -> None:
    """Give every rank's FSDP2 shards rank 0's weights: ``full`` is rank 0's state dict taken
    before sharding (None elsewhere). A rank whose module was built on the meta device gets
    storage first (``to_empty``); then torch's state-dict loader broadcasts each full tensor from
    rank 0 and keeps each rank's piece, and the buffers (rotary frequencies, which no state dict
    holds) are broadcast too. A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(t.is_meta for t in [*module.parameters(), *module.buffers()]):
        module.to_empty(device=device)
    set_model_state_dict(
        module,
        full if full is not None else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    with torch.no_grad():
        for b in module.buffers():
            dist.broadcast(b, src=0)


def full_named_tensors(module: CausalLMLogprobs) -> Iterator[tuple[str, torch.Tensor]]:
    """Full (unsharded) parameters and persistent buffers by Hugging Face name, in their own
    dtype, one all-gather per tensor. A collective: every rank must iterate it to the end."""
    for name, t in _named(module):
        if isinstance(t, DTensor):
            t = t.full_tensor()
        yield name, t.detach()


def _row_shard(t: torch.Tensor) -> bool:
    """An FSDP2 parameter: a DTensor sharded on dim 0 over a 1-D mesh."""
    return isinstance(t, DTensor) and t.device_mesh.ndim == 1 and len(t.placements) == 1 and t.placements[0].is_shard(0)


def gathered_buckets(
    module: nn.Module, dtype: torch.dtype | None, bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Full parameters and persistent buffers by Hugging Face name, cast to ``dtype`` (None: their
    own), in buckets of about ``bucket_bytes`` of full tensors (a tensor larger than that is a
    bucket of its own): ONE all-gather per bucket, in ``dtype``, instead of one per tensor in
    fp32. A collective: every rank must iterate it to the end.

    FSDP2 shards a parameter on dim 0 in ``torch.chunk`` pieces (ceil(rows / world) rows each,
    the last ranks' fewer or none). Each rank casts its pieces of the bucket into one flat buffer,
    each piece in a slot of ceil(rows / world) rows (zeros past its own), and
    ``all_gather_into_tensor`` puts the ranks' buffers end to end; a full tensor is then its
    slots, rank by rank, cut to its rows (one copy). Peak: about twice the bucket, plus the
    rank's flat piece. The generator builds a bucket only when the previous one was consumed."""
    if bucket_bytes < 1:
        raise ValueError(f"gathered_buckets: bucket_bytes={bucket_bytes} must be >= 1")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    out_size = None if dtype is None else dtype.itemsize
    for name, t in _named(module):
        nbytes = t.numel() * (out_size or t.element_size())
        if bucket and size + nbytes > bucket_bytes:
            yield _gather_bucket(bucket, dtype)
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield _gather_bucket(bucket, dtype)


def _gather_bucket(bucket: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None) -> list[tuple[str, torch.Tensor]]:
    sharded = [(n, t) for n, t in bucket if _row_shard(t) and t.device_mesh.size() > 1]
    full: dict[str, torch.Tensor] = {}
    # one flat buffer per (output dtype, mesh): a single one in practice (FSDP2 shards one model
    # over one mesh, and syncs and saves pass a dtype); otherwise one all-gather each
    groups: dict[tuple, list[tuple[str, torch.Tensor]]] = {}
    for n, t in sharded:
        groups.setdefault((dtype or t.dtype, id(t.device_mesh)), []).append((n, t))
    for (out_dtype, _), members in groups.items():
        full.update(_gather_flat(members, out_dtype))
    out = []
    for name, t in bucket:
        if name in full:
            out.append((name, full[name]))
            continue
        if isinstance(t, DTensor):  # a world of one, or a placement FSDP2 does not make
            t = t.full_tensor()
        t = t.detach()
        out.append((name, t if dtype is None or t.dtype == dtype else t.to(dtype)))
    return out


def _gather_flat(sharded: list[tuple[str, torch.Tensor]], out_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Full tensors of FSDP2 row shards on one mesh, in ``out_dtype``: one all-gather."""
    full: dict[str, torch.Tensor] = {}
    if sharded:
        mesh = sharded[0][1].device_mesh
        world, group = mesh.size(), mesh.get_group()
        slots = []  # (name, full shape, rows per slot, elements per slot, offset)
        offset = 0
        for name, t in sharded:
            rows = t.shape[0]
            per = -(-rows // world)  # torch.chunk's piece: ceil(rows / world)
            inner = math.prod(t.shape[1:])  # from the shape: indexing a DTensor would be a collective
            slots.append((name, t.shape, per, per * inner, offset))
            offset += per * inner
        device = sharded[0][1].to_local().device
        send = torch.zeros(offset, dtype=out_dtype, device=device)
        for (_, t), (_, _, _, _, off) in zip(sharded, slots):
            local = t.to_local().detach().reshape(-1)
            send[off : off + local.numel()].copy_(local)
        recv = torch.empty(world * offset, dtype=out_dtype, device=device)
        _all_gather_flat(recv, send, group)
        recv = recv.view(world, offset)
        del send
        for name, shape, per, elems, off in slots:
            # [world, per * inner] -> [world * per, ...] -> the first rows: one copy
            full[name] = recv[:, off : off + elems].reshape(world * per, *shape[1:])[: shape[0]]
        del recv
    return full


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    """The ranks' ``inp`` end to end into ``out``: ``all_gather_single`` (torch 2.13 renamed
    ``all_gather_into_tensor`` to it; the old name warns there), the old name where it is all
    there is."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def gathered_tensors(
    module: nn.Module, dtype: torch.dtype | None, bucket_bytes: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """``gathered_buckets`` one tensor at a time (the same collectives)."""
    for bucket in gathered_buckets(module, dtype, bucket_bytes):
        yield from bucket
