"""The native rollout engine: batched sampling with a KV cache on any Hugging Face causal LM.

One ``generate`` call works in chunks of at most ``max_batch`` samples. In a chunk the distinct
prompts are left-padded and prefilled once (position ids count real tokens only, so padding changes
nothing), the cache and the last logits are then repeated ``n`` times, and all samples decode
together one token per step. Rows that hit a stop token are dropped from the batch (cache included)
once they make up ``compact_fraction`` of it, so finished samples stop costing compute. For
Llama-family decoders (Qwen2/3, Llama, Mistral without a window) the steps run on
``fastcrit.rollout.decode.StaticDecoder``: the model's own modules over a static KV cache, fused
q/k/v and gate/up weights, no per-step mask rebuilding; any other model (or
``static_decode=False``) runs Hugging Face's forward with a dynamic cache. Both give the same
samples (tested). A token is drawn by inverse-CDF sampling: one uniform number per row.

Sampling follows SGLang: a temperature below ``fastcrit.types.GREEDY_BELOW`` (1e-6) is greedy;
otherwise top-k and top-p are applied to the sorted softmax(logits / T) (top-p on the cumulative
mass of the unfiltered distribution, as SGLang's torch sampler does) and a token is drawn from what
is left. Sampling stops at ``fastcrit.models.hf.eos_token_ids`` (tokenizer, config and generation
config), the set the SGLang engine sends as stop ids, at ``params.stop_token_ids``, and at the
token whose decoded text (special tokens kept) completes one of ``params.stop`` (stop strings,
checked on the last ``4 * len + 8`` tokens of each live sample after every step). The returned
log-prob is log_softmax(logits / T) at the drawn token, before top-k / top-p, scored at T = 1 when
greedy; the trainer reproduces it with one forward pass over prompt + response (tests/rollout check
1e-4 in fp32). Penalties and ``logit_bias`` (``SamplingParams.shapes_logits``) change the logits
before all of this, so with them the log-probs are those of the penalised distribution, which a
forward pass does not reproduce: they are for serving (``fastcrit serve``), not for training.

What seeding does and does not cover: with ``params.seed`` set, sample ``k = i * n + j`` of a call
(prompt i, its j-th sample) draws its random numbers from ``seed + k`` alone (counter-based,
``sampling.uniforms``), as SGLang's ``sampling_seed = seed + k`` does. So the same prompt with the same
weights, dtype and device gives the same sample whatever else shares its batch, under any
``max_batch``, and split over calls or ranks with the seed moved by the offset (the trainer gives
each rank ``seed + first global sample index``). Batched forward passes of different shapes can
differ in the last float bits, which flips a token only when its draw falls that close to a
boundary of the distribution. Without a seed, one is drawn from torch's global generator.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable

import torch

from fastcrit.rollout.decode import StaticDecoder, fuse_weights, unsupported
from fastcrit.rollout.sampling import sample, uniforms
from fastcrit.types import Rollout, SamplingParams, is_greedy, scoring_temperature


class NativeEngine:
    """Engine protocol (fastcrit.rollout.base.Engine) on a plain torch / transformers model.

    ``model`` is a model spec or directory (see fastcrit.models.hf), loaded in ``dtype`` (default
    float32), or an already loaded ``PreTrainedModel``, which the engine then uses as is (no copy;
    it is moved to ``device`` and cast only when ``dtype`` is given; ``sleep`` frees its weights).
    ``tokenizer`` is only read for its EOS and pad ids; it is loaded from the model directory when
    not given. ``static_decode`` (default on): the lean decoder of fastcrit.rollout.decode where
    the architecture allows it. ``cuda_graph`` (CUDA only, default off): the decode step captured
    as a CUDA graph per chunk and replayed (the same tokens as eager decoding; its speed against
    HF ``generate``: docs/gpu.md). ``cpu_backup``: ``sleep``
    moves the weights to host memory and ``wake`` brings them back (SGLang's
    ``enable_weights_cpu_backup``), for a frozen model no trainer reloads (CTRL's proxy).
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device = "cpu",
        max_batch: int = 256,
        attn_implementation: str | None = None,
        compact_fraction: float = 0.25,
        static_decode: bool = True,
        cuda_graph: bool = False,
        cpu_backup: bool = False,
    ):
        from fastcrit.models.hf import eos_token_ids, load_model, load_tokenizer, parse_dtype

        if max_batch < 1:
            raise ValueError(f"NativeEngine: max_batch={max_batch} must be >= 1")
        if not 0.0 < compact_fraction <= 1.0:
            raise ValueError(f"NativeEngine: compact_fraction={compact_fraction} must be in (0, 1]")
        self.device = torch.device(device)
        if isinstance(model, (str, os.PathLike)):
            if tokenizer is None:
                tokenizer = load_tokenizer(model)
            model = load_model(
                model, dtype=dtype or "float32", device=self.device, attn_implementation=attn_implementation
            )
        else:
            model = model.to(device=self.device) if dtype is None else model.to(self.device, parse_dtype(dtype))
        self.model = model.eval()  # generate() runs under inference_mode, so no autograd state is kept
        self.max_batch = max_batch
        self.compact_fraction = compact_fraction
        self.vocab_size = int(self.model.config.vocab_size)
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        # The lean decode path (fastcrit.rollout.decode) where the architecture allows it; else, or
        # with static_decode=False, Hugging Face's forward with a dynamic cache.
        self.static_decode_off = "static_decode=False" if not static_decode else unsupported(self.model)
        self._fused: list | None = None  # the static decoder's fused weights, rebuilt when weights change
        # The decode step captured as a CUDA graph per generate chunk and replayed (fixed shapes, so
        # rows that stopped stay in the batch). Written against torch's API; ran on an H100.
        if cuda_graph and self.device.type != "cuda":
            raise ValueError(f"NativeEngine: cuda_graph=True needs a CUDA device, not {self.device}")
        if cuda_graph and self.static_decode_off:
            raise ValueError(
                f"NativeEngine: cuda_graph=True needs the static decoder, which is off: {self.static_decode_off}"
            )
        self.cuda_graph = cuda_graph

        # The same stop set as the SGLang engine: tokenizer, model config and generation config.
        self.eos_token_ids = eos_token_ids(tokenizer, self.model.config, getattr(self.model, "generation_config", None))
        if not self.eos_token_ids:
            raise ValueError(
                "NativeEngine: neither the tokenizer nor the model's config or generation config names an EOS token"
            )
        pad = tokenizer.pad_token_id if tokenizer is not None else None
        if pad is None:
            pad = getattr(self.model.config, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        self.tokenizer = tokenizer  # decodes samples for stop strings (params.stop)
        self._asleep = False
        self._closed = False
        self.cpu_backup = cpu_backup
        self._shapes: dict[int, tuple] = {}  # while asleep: id(weight) -> (weight, its shape, host copy)
        self._unloaded: set[int] = set()  # since wake: ids of the weights without values yet

    # ------------------------------------------------------------------ Engine protocol

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        *,
        on_step: Callable[[list[int], list[int]], None] | None = None,
    ) -> list[Rollout]:
        """The Engine protocol's generate. ``on_step`` (this engine only; ``fastcrit serve`` streams
        with it): after every decoding step, called with the sample indices ``k = i * n + j`` of
        the samples that drew a token in it and those tokens (a sample's stop token included), from
        the calling thread; what it raises stops the call."""
        self._check_usable("generate")
        self._validate(prompts, params)
        if not prompts:
            return []
        stop_ids = torch.tensor(
            sorted(set(self.eos_token_ids) | {int(t) for t in params.stop_token_ids}),
            dtype=torch.long,
            device=self.device,
        )
        # Sample k = i * n + j (prompt i of this call, its j-th sample) draws from seed + k alone.
        seed = params.seed
        if seed is None and not is_greedy(params.temperature):  # greedy draws nothing: leaves torch's RNG be
            seed = int(torch.randint(2**62, ()).item())
        # Similar lengths share a chunk, so left padding stays short.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        per_chunk = max(1, self.max_batch // params.n)
        by_prompt: list[list[Rollout] | None] = [None] * len(prompts)
        with torch.inference_mode():
            for start in range(0, len(order), per_chunk):
                idx = order[start : start + per_chunk]
                for i, rollouts in zip(
                    idx, self._generate_chunk(idx, [prompts[i] for i in idx], params, stop_ids, seed, on_step)
                ):
                    by_prompt[i] = rollouts
        return [r for group in by_prompt for r in group]

    def sleep(self) -> None:
        """Free the weights' memory (no KV cache outlives a generate call, so the weights are all
        the engine holds), as SGLang's ``release_memory_occupation`` does: every parameter's storage
        is dropped, on any device (on CUDA the allocator's cache is emptied too). ``held_bytes()``
        goes to the buffers' few bytes (e.g. rotary frequencies, which are kept).

        Like SGLang, the values are not kept anywhere unless ``cpu_backup``: after ``wake`` the
        weights must be loaded again (``load_weights`` with every parameter) before ``generate``,
        which refuses until then. With ``cpu_backup`` they are copied to (pinned, on CUDA) host
        memory first and ``wake`` restores them.
        """
        self._check_open("sleep")
        if self._asleep:
            return
        self._fused = None
        for p in self.model.parameters():  # tied weights are one Parameter: freed once
            host = None
            if self.cpu_backup:
                host = torch.empty(p.shape, dtype=p.dtype, pin_memory=p.is_cuda)
                host.copy_(p.data)
            self._shapes[id(p)] = (p, p.shape, host)
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self._asleep = True

    def wake(self) -> None:
        """Allocate the weights' memory again: uninitialised (load every weight before generating),
        or with their values from host memory under ``cpu_backup``."""
        self._check_open("wake")
        if not self._asleep:
            return
        for p, shape, host in self._shapes.values():
            p.data = torch.empty(shape, dtype=p.dtype, device=p.device)
            if host is not None:
                p.data.copy_(host)
        self._unloaded = {k for k, (_, _, host) in self._shapes.items() if host is None}
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
        self._fused = None
        targets = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, tensor in named_tensors:
                key = _strip_wrappers(name)
                if key not in targets:
                    raise KeyError(f"load_weights: the model has no weight named {name!r}")
                dst = targets[key]
                if hasattr(tensor, "full_tensor"):  # a DTensor, told apart without torch.distributed
                    raise TypeError(
                        f"load_weights: {name!r} is a sharded DTensor; the engine takes full "
                        "tensors (gather them in train/, e.g. with "
                        "fastcrit.train.policy.full_named_tensors, on every rank)"
                    )
                if tuple(tensor.shape) != tuple(dst.shape):
                    raise ValueError(
                        f"load_weights: {name!r} has shape {tuple(tensor.shape)}, the model expects {tuple(dst.shape)}"
                    )
                dst.data.copy_(tensor.detach().to(device=dst.device, dtype=dst.dtype))
                self._unloaded.discard(id(dst))

    def close(self) -> None:
        self.model, self._fused = None, None
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
            raise RuntimeError(
                f"NativeEngine.{what}: wake() gave the weights' memory back without their values; "
                f"load every weight first (load_weights), {len(names)} missing, e.g. {names[:3]}"
            )

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
        if params.stop and self.tokenizer is None:
            raise ValueError("SamplingParams.stop: stop strings need the engine's tokenizer; pass tokenizer=")
        if not all(isinstance(x, str) for x in params.stop):
            raise ValueError(f"SamplingParams.stop={params.stop!r} must be a list of strings")
        if params.repetition_penalty <= 0:
            raise ValueError(f"SamplingParams.repetition_penalty={params.repetition_penalty} must be > 0")
        for t in params.logit_bias:
            if not 0 <= int(t) < self.vocab_size:
                raise ValueError(f"SamplingParams.logit_bias: {t} is outside the vocabulary [0, {self.vocab_size})")
        if not 0 <= params.top_logprobs <= self.vocab_size:
            raise ValueError(f"SamplingParams.top_logprobs={params.top_logprobs} must be in [0, {self.vocab_size}]")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; a prompt needs at least one token")
            lo, hi = min(p), max(p)
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(
                    f"prompt {i} holds token id {lo if lo < 0 else hi}, outside the vocabulary [0, {self.vocab_size})"
                )
            if self.max_positions and len(p) + params.max_new_tokens > self.max_positions:
                raise ValueError(
                    f"prompt {i}: {len(p)} tokens + max_new_tokens={params.max_new_tokens} exceed "
                    f"the model's max_position_embeddings={self.max_positions}"
                )

    def _generate_chunk(
        self,
        indices: list[int],
        prompts: list[list[int]],
        params: SamplingParams,
        stop_ids: torch.Tensor,
        seed: int | None,
        on_step=None,
    ) -> list[list[Rollout]]:
        dev, n, max_new = self.device, params.n, params.max_new_tokens
        num, plen = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((num, plen), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((num, plen), dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, plen - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[r, plen - len(p) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        if self.static_decode_off:
            dec = _HFDecoder(self.model)
        else:
            if self._fused is None:
                self._fused = fuse_weights(self.model)
            dec = StaticDecoder(
                self.model, num, plen, max_new, self._fused, fixed=self.cuda_graph, graph=self.cuda_graph
            )
        logits = dec.prefill(ids, mask)  # [num, V]: one prefill per distinct prompt
        if n > 1:
            dec.repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)

        total = num * n
        out_tokens = torch.full((total, max_new), self.pad_token_id, dtype=torch.long, device=dev)
        out_logps = torch.zeros((total, max_new), dtype=torch.float32, device=dev)
        out_len = torch.full((total,), max_new, dtype=torch.long, device=dev)
        stopped = torch.zeros(total, dtype=torch.bool, device=dev)
        rows = torch.arange(total, device=dev)  # original sample index of each live row
        done = torch.zeros(total, dtype=torch.bool, device=dev)  # live rows that already stopped
        uni = None  # [live rows, max_new]: each sample's uniform numbers, one per position
        shaper = _LogitShaper(params, prompts, n, logits.shape[-1], dev) if params.shapes_logits() else None
        stopper = _StopStrings(self.tokenizer, params.stop) if any(params.stop) else None
        k_top = params.top_logprobs
        if k_top:
            top_ids = torch.zeros((total, max_new, k_top), dtype=torch.long, device=dev)
            top_lps = torch.zeros((total, max_new, k_top), dtype=torch.float32, device=dev)
        if not is_greedy(params.temperature):
            ks = torch.tensor([i * n + j for i in indices for j in range(n)], dtype=torch.long, device=dev)
            uni = uniforms(seed, ks, max_new)

        ndone = 0  # live rows that already stopped (rows that stopped stay until compaction)
        for step in range(max_new):
            if shaper is not None:
                logits = shaper(logits)
            tok, logp = sample(logits, params, None if uni is None else uni[:, step])
            if k_top:
                t = scoring_temperature(params.temperature)
                top = torch.log_softmax(logits if t == 1.0 else logits / t, dim=-1).topk(k_top, dim=-1)
                top_ids[:, step].index_copy_(0, rows, top.indices)
                top_lps[:, step].index_copy_(0, rows, top.values)
            if ndone:  # rows that already stopped keep pad / 0 after their stop
                tok, logp = tok.masked_fill(done, self.pad_token_id), logp.masked_fill(done, 0.0)
            out_tokens[:, step].index_copy_(0, rows, tok)
            if on_step is not None:
                live = (~done).nonzero().squeeze(1)
                on_step([indices[r // n] * n + r % n for r in rows[live].tolist()], tok[live].tolist())
            out_logps[:, step].index_copy_(0, rows, logp)
            hit = torch.isin(tok, stop_ids)
            if stopper is not None:
                hit |= stopper.hits(out_tokens, rows, step, done)
            if ndone:
                hit &= ~done
            if bool(hit.any()):
                out_len[rows[hit]] = step + 1
                stopped[rows[hit]] = True
                done = done | hit
                ndone = int(done.sum())
            if step == max_new - 1 or ndone == done.numel():
                break
            if shaper is not None:
                shaper.add(tok)
            if ndone and not self.cuda_graph and ndone >= self.compact_fraction * done.numel():
                keep = (~done).nonzero().squeeze(1)
                dec.select(keep)
                if shaper is not None:
                    shaper.select(keep)
                rows, tok, done, ndone = rows[keep], tok[keep], done[keep], 0
                if uni is not None:
                    uni = uni[keep]
            logits = dec.step(tok)

        tokens, logps = out_tokens.tolist(), out_logps.tolist()
        lengths, stops = out_len.tolist(), stopped.tolist()
        tops = None
        if k_top:
            tops = [
                [list(zip(i_row, l_row)) for i_row, l_row in zip(i_s, l_s)]
                for i_s, l_s in zip(top_ids.tolist(), top_lps.tolist())
            ]
        result = []
        for r, (i, p) in enumerate(zip(indices, prompts)):
            group = []
            for s in range(r * n, r * n + n):
                k = lengths[s]
                group.append(
                    Rollout(
                        prompt_index=i,
                        prompt_ids=list(p),
                        output_ids=tokens[s][:k],
                        logprobs=logps[s][:k],
                        finish_reason="stop" if stops[s] else "length",
                        top_logprobs=None if tops is None else tops[s][:k],
                    )
                )
            result.append(group)
        return result


class _LogitShaper:
    """Penalties and logit bias on the logits of the live rows [b, V] (SamplingParams.shapes_logits),
    before the temperature, as vLLM orders them: bias, repetition, then frequency and presence."""

    def __init__(self, params: SamplingParams, prompts: list[list[int]], n: int, vocab: int, device):
        self.params = params
        self.counts = torch.zeros((len(prompts) * n, vocab), dtype=torch.float32, device=device)
        self.seen = None  # [b, V] bool: tokens of the prompt or the output so far (repetition penalty)
        if params.repetition_penalty != 1.0:
            seen = torch.zeros((len(prompts), vocab), dtype=torch.bool)
            for r, p in enumerate(prompts):
                seen[r, torch.tensor(p, dtype=torch.long)] = True
            self.seen = seen.to(device).repeat_interleave(n, dim=0)
        self.bias = None
        if params.logit_bias:
            bias = torch.zeros(vocab, dtype=torch.float32)
            for t, v in params.logit_bias.items():
                bias[int(t)] = float(v)
            self.bias = bias.to(device)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        if self.bias is not None:
            logits = logits + self.bias
        if self.seen is not None:
            rp = p.repetition_penalty
            logits = torch.where(self.seen, torch.where(logits > 0, logits / rp, logits * rp), logits)
        if p.frequency_penalty:
            logits = logits - p.frequency_penalty * self.counts
        if p.presence_penalty:
            logits = logits - p.presence_penalty * (self.counts > 0).float()
        return logits

    def add(self, tok: torch.Tensor) -> None:
        """Count the tokens [b] just drawn (rows that already stopped count their padding; unread)."""
        r = torch.arange(tok.shape[0], device=tok.device)
        self.counts[r, tok] += 1
        if self.seen is not None:
            self.seen[r, tok] = True

    def select(self, keep: torch.Tensor) -> None:
        self.counts = self.counts[keep]
        if self.seen is not None:
            self.seen = self.seen[keep]


class _StopStrings:
    """Which live samples' text has just completed a stop string. A match must end in the newest
    token (an earlier one would have stopped the sample before), and a string of L characters spans
    at most 4L tokens (a character is at most 4 bytes), so decoding the last 4L + 8 tokens suffices;
    the window's first tokens, which may decode differently out of context (a SentencePiece leading
    space, a split character), lie before any match."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.window = 4 * max(len(s) for s in self.stops) + 8

    def hits(self, out_tokens: torch.Tensor, rows: torch.Tensor, step: int, done: torch.Tensor) -> torch.Tensor:
        """[live rows] bool: the sample of each live row (``rows`` into ``out_tokens`` [total, max_new])
        holds a stop string in its text up to ``step``; rows already ``done`` are False."""
        lo = max(0, step + 1 - self.window)
        windows = out_tokens[rows, lo : step + 1].tolist()
        out = []
        for ids, finished in zip(windows, done.tolist()):
            text = "" if finished else self.tokenizer.decode(ids, skip_special_tokens=False)
            out.append(any(s in text for s in self.stops))
        return torch.tensor(out, dtype=torch.bool, device=done.device)


class _HFDecoder:
    """StaticDecoder's interface over Hugging Face's forward and a dynamic cache (any causal LM)."""

    def __init__(self, model):
        from transformers import DynamicCache

        self.model, self.cache = model, DynamicCache(config=model.config)
        # transformers 5.24 renamed past_key_values to cache (the old name warns, then goes away)
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def _forward(self, ids, mask, pos) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_arg: self.cache},
        )
        return out.logits[:, -1, :].float()

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.mask, self.next_pos = mask, mask.sum(1)
        return self._forward(ids, mask, (mask.cumsum(1) - 1).clamp(min=0))

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        logits = self._forward(tok[:, None], self.mask, self.next_pos[:, None])
        self.next_pos = self.next_pos + 1
        return logits

    def repeat_interleave(self, n: int) -> None:
        self.cache.batch_repeat_interleave(n)
        self.mask, self.next_pos = self.mask.repeat_interleave(n, dim=0), self.next_pos.repeat_interleave(n, dim=0)

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask, self.next_pos = self.mask[keep], self.next_pos[keep]


def _strip_wrappers(name: str) -> str:
    # Names as a wrapped trainer model may report them; the engine's model is the bare HF model.
    for prefix in ("_orig_mod.", "module.", "_fsdp_wrapped_module."):
        name = name.replace(prefix, "")
    return name
