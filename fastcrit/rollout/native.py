"""The native rollout engine: batched sampling with a KV cache on any Hugging Face causal LM.

One ``generate`` call works in chunks of at most ``max_batch`` samples. In a chunk the distinct
prompts are left-padded and prefilled once (position ids count real tokens only, so padding changes
nothing), the cache and the last logits are then repeated ``n`` times, and all samples decode
together one token per step. Rows that hit a stop token are dropped from the batch (cache included)
once they make up ``compact_fraction`` of it, so finished samples stop costing compute.

Sampling follows SGLang: a temperature below ``fastcrit.types.GREEDY_BELOW`` (1e-6) is greedy;
otherwise top-k and top-p are applied to the sorted softmax(logits / T) (top-p on the cumulative
mass of the unfiltered distribution, as SGLang's torch sampler does) and a token is drawn from what
is left. Sampling stops at ``fastcrit.models.hf.eos_token_ids`` (tokenizer, config and generation
config), the set the SGLang engine sends as stop ids, and at ``params.stop_token_ids``. The
returned log-prob is log_softmax(logits / T) at the drawn token, before top-k / top-p, scored at
T = 1 when greedy; the trainer reproduces it with one forward pass over prompt + response
(tests/rollout check 1e-4 in fp32).

What seeding does and does not cover: with ``params.seed`` set, the same engine (same weights,
dtype, device and ``max_batch``) returns the same samples for the same prompts. Changing
``max_batch``, the prompt set or the device changes which random numbers each sample draws.
"""
from __future__ import annotations

import os
from typing import Iterable

import torch

from fastcrit.types import Rollout, SamplingParams, is_greedy


class NativeEngine:
    """Engine protocol (fastcrit.rollout.base.Engine) on a plain torch / transformers model.

    ``model`` is a model spec or directory (see fastcrit.models.hf), loaded in ``dtype`` (default
    float32), or an already loaded ``PreTrainedModel``, which the engine then uses as is (no copy;
    it is moved to ``device`` and cast only when ``dtype`` is given; ``sleep`` frees its weights).
    ``tokenizer`` is only read for its EOS and pad ids; it is loaded from the model directory when
    not given.
    """

    def __init__(self, model, tokenizer=None, *, dtype: str | torch.dtype | None = None,
                 device: str | torch.device = "cpu", max_batch: int = 256,
                 attn_implementation: str | None = None, compact_fraction: float = 0.25):
        from fastcrit.models.hf import eos_token_ids, load_model, load_tokenizer, parse_dtype

        if max_batch < 1:
            raise ValueError(f"NativeEngine: max_batch={max_batch} must be >= 1")
        if not 0.0 < compact_fraction <= 1.0:
            raise ValueError(f"NativeEngine: compact_fraction={compact_fraction} must be in (0, 1]")
        self.device = torch.device(device)
        if isinstance(model, (str, os.PathLike)):
            if tokenizer is None:
                tokenizer = load_tokenizer(model)
            model = load_model(model, dtype=dtype or "float32", device=self.device,
                               attn_implementation=attn_implementation)
        else:
            model = model.to(device=self.device) if dtype is None else model.to(self.device, parse_dtype(dtype))
        self.model = model.eval()  # generate() runs under inference_mode, so no autograd state is kept
        self.max_batch = max_batch
        self.compact_fraction = compact_fraction
        self.vocab_size = int(self.model.config.vocab_size)
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)

        # The same stop set as the SGLang engine: tokenizer, model config and generation config.
        self.eos_token_ids = eos_token_ids(tokenizer, self.model.config,
                                           getattr(self.model, "generation_config", None))
        if not self.eos_token_ids:
            raise ValueError("NativeEngine: neither the tokenizer nor the model's config or generation config "
                             "names an EOS token")
        pad = tokenizer.pad_token_id if tokenizer is not None else None
        if pad is None:
            pad = getattr(self.model.config, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        self._asleep = False
        self._closed = False
        self._shapes: dict[int, tuple] = {}  # while asleep: id(weight) -> (weight, its shape)
        self._unloaded: set[int] = set()  # since wake: ids of the weights without values yet

    # ------------------------------------------------------------------ Engine protocol

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        self._check_usable("generate")
        self._validate(prompts, params)
        if not prompts:
            return []
        stop_ids = torch.tensor(sorted(set(self.eos_token_ids) | {int(t) for t in params.stop_token_ids}),
                                dtype=torch.long, device=self.device)
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(int(params.seed))
        # Similar lengths share a chunk, so left padding stays short.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        per_chunk = max(1, self.max_batch // params.n)
        by_prompt: list[list[Rollout] | None] = [None] * len(prompts)
        with torch.inference_mode():
            for start in range(0, len(order), per_chunk):
                idx = order[start:start + per_chunk]
                for i, rollouts in zip(idx, self._generate_chunk(idx, [prompts[i] for i in idx], params,
                                                                 stop_ids, gen)):
                    by_prompt[i] = rollouts
        return [r for group in by_prompt for r in group]

    def sleep(self) -> None:
        """Free the weights' memory (no KV cache outlives a generate call, so the weights are all
        the engine holds), as SGLang's ``release_memory_occupation`` does: every parameter's storage
        is dropped, on any device (on CUDA the allocator's cache is emptied too). ``held_bytes()``
        goes to the buffers' few bytes (e.g. rotary frequencies, which are kept).

        Like SGLang, the values are not kept anywhere: after ``wake`` the weights must be loaded
        again (``load_weights`` with every parameter) before ``generate``, which refuses until then.
        """
        self._check_open("sleep")
        if self._asleep:
            return
        for p in self.model.parameters():  # tied weights are one Parameter: freed once
            self._shapes[id(p)] = (p, p.shape)
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self._asleep = True

    def wake(self) -> None:
        """Allocate the weights' memory again, uninitialised: load every weight before generating."""
        self._check_open("wake")
        if not self._asleep:
            return
        for p, shape in self._shapes.values():
            p.data = torch.empty(shape, dtype=p.dtype, device=p.device)
        self._unloaded = set(self._shapes)
        self._shapes = {}
        self._asleep = False

    def held_bytes(self) -> int:
        """Bytes of the engine's weights and buffers (each storage counted once)."""
        if self.model is None:
            return 0
        seen = {}
        for t in [*self.model.parameters(), *self.model.buffers()]:
            seen[(t.device, t.untyped_storage().data_ptr())] = t.untyped_storage().nbytes()
        return sum(seen.values())

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy full tensors into the model by Hugging Face name (any subset; call once per bucket).

        Values are cast to the engine's dtype. Tied weights share storage, so either name updates
        both. A sharded DTensor (FSDP2) is refused with a TypeError: gathering it is a collective,
        which stays in train/ (fastcrit.train.policy.full_named_tensors hands full tensors, and
        fastcrit.train.colocate.sync_weights feeds them here). A DTensor, an unknown name or a wrong
        shape raises before anything of that tensor is copied; tensors earlier in the same call
        are already loaded by then.
        """
        self._check_open("load_weights")
        if self._asleep:
            raise RuntimeError("NativeEngine.load_weights: the engine is asleep; call wake() first")
        targets = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, tensor in named_tensors:
                key = _strip_wrappers(name)
                if key not in targets:
                    raise KeyError(f"load_weights: the model has no weight named {name!r}")
                dst = targets[key]
                if hasattr(tensor, "full_tensor"):  # a DTensor, told apart without torch.distributed
                    raise TypeError(f"load_weights: {name!r} is a sharded DTensor; the engine takes full "
                                    "tensors (gather them in train/, e.g. with "
                                    "fastcrit.train.policy.full_named_tensors, on every rank)")
                if tuple(tensor.shape) != tuple(dst.shape):
                    raise ValueError(f"load_weights: {name!r} has shape {tuple(tensor.shape)}, "
                                     f"the model expects {tuple(dst.shape)}")
                dst.data.copy_(tensor.detach().to(device=dst.device, dtype=dst.dtype))
                self._unloaded.discard(id(dst))

    def close(self) -> None:
        self.model = None
        self._shapes, self._unloaded = {}, set()
        self._closed = True

    # ------------------------------------------------------------------ internals

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"NativeEngine.{what}: the engine is closed")

    def _check_usable(self, what: str) -> None:
        self._check_open(what)
        if self._asleep:
            raise RuntimeError(f"NativeEngine.{what}: the engine is asleep; call wake() first")
        if self._unloaded:
            names = [n for n, p in self.model.named_parameters() if id(p) in self._unloaded]
            raise RuntimeError(f"NativeEngine.{what}: wake() gave the weights' memory back without their values; "
                               f"load every weight first (load_weights), {len(names)} missing, e.g. {names[:3]}")

    def _validate(self, prompts: list[list[int]], params: SamplingParams) -> None:
        if params.n < 1:
            raise ValueError(f"SamplingParams.n={params.n} must be >= 1")
        if params.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens={params.max_new_tokens} must be >= 1")
        if params.temperature < 0:
            raise ValueError(f"SamplingParams.temperature={params.temperature} must be >= 0")
        if not 0.0 < params.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p={params.top_p} must be in (0, 1]")
        if params.top_k == 0 or params.top_k < -1:
            raise ValueError(f"SamplingParams.top_k={params.top_k} must be -1 (off) or >= 1")
        for t in params.stop_token_ids:
            if not 0 <= int(t) < self.vocab_size:
                raise ValueError(f"SamplingParams.stop_token_ids: {t} is outside the vocabulary [0, {self.vocab_size})")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; a prompt needs at least one token")
            lo, hi = min(p), max(p)
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(f"prompt {i} holds token id {lo if lo < 0 else hi}, outside the vocabulary "
                                 f"[0, {self.vocab_size})")
            if self.max_positions and len(p) + params.max_new_tokens > self.max_positions:
                raise ValueError(f"prompt {i}: {len(p)} tokens + max_new_tokens={params.max_new_tokens} exceed "
                                 f"the model's max_position_embeddings={self.max_positions}")

    def _forward(self, input_ids, attention_mask, position_ids, cache):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def _generate_chunk(self, indices: list[int], prompts: list[list[int]], params: SamplingParams,
                        stop_ids: torch.Tensor, gen: torch.Generator | None) -> list[list[Rollout]]:
        from transformers import DynamicCache

        dev, n, max_new = self.device, params.n, params.max_new_tokens
        num, plen = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((num, plen), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((num, plen), dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, plen - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[r, plen - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(1) - 1).clamp(min=0)

        cache = DynamicCache(config=self.model.config)
        logits = self._forward(ids, mask, pos, cache)  # [num, V]: one prefill per distinct prompt
        next_pos = mask.sum(1)  # [num] position of the first generated token
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            mask = mask.repeat_interleave(n, dim=0)
            next_pos = next_pos.repeat_interleave(n, dim=0)

        total = num * n
        out_tokens = torch.full((total, max_new), self.pad_token_id, dtype=torch.long, device=dev)
        out_logps = torch.zeros((total, max_new), dtype=torch.float32, device=dev)
        out_len = torch.full((total,), max_new, dtype=torch.long, device=dev)
        stopped = torch.zeros(total, dtype=torch.bool, device=dev)
        rows = torch.arange(total, device=dev)  # original sample index of each live row
        done = torch.zeros(total, dtype=torch.bool, device=dev)  # live rows that already stopped

        for step in range(max_new):
            tok, logp = sample(logits, params, gen)
            live = ~done
            out_tokens[rows[live], step] = tok[live]
            out_logps[rows[live], step] = logp[live]
            hit = live & torch.isin(tok, stop_ids)
            if bool(hit.any()):
                out_len[rows[hit]] = step + 1
                stopped[rows[hit]] = True
                done = done | hit
            if step == max_new - 1 or bool(done.all()):
                break
            ndone = int(done.sum())
            if ndone and ndone >= self.compact_fraction * done.numel():
                keep = (~done).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                rows, tok, mask, next_pos = rows[keep], tok[keep], mask[keep], next_pos[keep]
                done = done[keep]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            logits = self._forward(tok[:, None], mask, next_pos[:, None], cache)
            next_pos = next_pos + 1

        tokens, logps = out_tokens.tolist(), out_logps.tolist()
        lengths, stops = out_len.tolist(), stopped.tolist()
        result = []
        for r, (i, p) in enumerate(zip(indices, prompts)):
            group = []
            for s in range(r * n, r * n + n):
                k = lengths[s]
                group.append(Rollout(prompt_index=i, prompt_ids=list(p), output_ids=tokens[s][:k],
                                     logprobs=logps[s][:k], finish_reason="stop" if stops[s] else "length"))
            result.append(group)
        return result


def sample(logits: torch.Tensor, params: SamplingParams,
           gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits`` [b, V] (fp32); return (tokens [b], log-probs [b]).

    The log-prob is log_softmax(logits / T) at the token before any top-k / top-p filtering
    (T = 1 when greedy, see fastcrit.types.is_greedy).
    """
    if is_greedy(params.temperature):
        tok = logits.argmax(dim=-1)
        return tok, torch.log_softmax(logits, dim=-1).gather(1, tok[:, None]).squeeze(1)
    logp_all = torch.log_softmax(logits / params.temperature, dim=-1)
    vocab = logits.shape[-1]
    if params.top_p >= 1.0 and (params.top_k < 0 or params.top_k >= vocab):
        probs = logp_all.exp()
        tok = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    else:
        probs_sorted, order = logp_all.exp().sort(dim=-1, descending=True)
        if params.top_p < 1.0:
            cum = probs_sorted.cumsum(dim=-1)
            probs_sorted = probs_sorted.masked_fill(cum - probs_sorted > params.top_p, 0.0)
        if 0 < params.top_k < vocab:
            probs_sorted[:, params.top_k:] = 0.0
        choice = torch.multinomial(probs_sorted, 1, generator=gen)
        tok = order.gather(1, choice).squeeze(1)
    return tok, logp_all.gather(1, tok[:, None]).squeeze(1)


def _strip_wrappers(name: str) -> str:
    # Names as a wrapped trainer model may report them; the engine's model is the bare HF model.
    for prefix in ("_orig_mod.", "module.", "_fsdp_wrapped_module."):
        name = name.replace(prefix, "")
    return name
