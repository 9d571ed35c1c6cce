"""A lean decode path for Llama-family decoders on a static KV cache.

Hugging Face's forward rebuilds the attention mask, grows a dynamic cache and runs its checks at
every generated token; with small models and batches that overhead is most of the time. Here the
engine runs the same modules (projections, norms, MLPs, rotary embedding: the model's own
``nn.Module``\\s and weights) in a fixed order over a cache allocated once for the whole generation:

- a prompt's keys and values are cached once, however many samples it has; its samples' queries
  are stacked into one matrix against them, so a decode step reads each prompt's cache once (n
  samples of a prompt read it n times from n copies in a plain KV cache, and with short prompts
  and GQA that reading is most of a small model's decode time); each row's generated keys and values
  have their own part of the cache, where every row writes its t-th token into column ``t``;
- prompts are left-padded; an additive bias (-inf on padding, computed once in prefill) is all the
  masking decode needs; prefill attends causally within each prompt, and a padding query attends to
  itself only, so no row ever takes a softmax over nothing;
- rows that stopped leave the batch by ``select`` (one gather of the generated part; prompts left
  without rows leave the prompt part).

``fixed=True`` keeps every shape of a decode step the same from the first step to the last, so the
step can be captured as a CUDA graph (``graph=True``, CUDA only) and replayed: it attends over the
whole width of the generated part under a bias (a column turns on when its token is written), and
the token, its cache column and the positions live in buffers the step reads (``index_copy_`` /
``index_fill_`` at the column, no Python-side slicing). Rows then never leave the batch. On CPU the
fixed step runs eagerly (tests compare it with the sliced one); the capture follows torch's
documented pattern (warm-up on a side stream, ``torch.cuda.graph``, ``CUDAGraph.replay``; torch 2.13
cuda/graphs.py); on a GPU test_cuda_graph_decode_matches_eager checks that it gives the same tokens
as eager decoding, and benchmarks/bench_generate.py times it against HF generate.

Supported: model types whose decoder layers are ``input_layernorm -> self_attn(q/k/v/o_proj,
optional q_norm/k_norm) -> post_attention_layernorm -> mlp(gate/up/down, act_fn or SiLU)`` with rotary
positions from ``model.rotary_emb`` and no sliding window (Qwen2, Qwen3, Llama, Mistral without a
window). Liger-Kernel's SwiGLU MLP (which the trainer's ``model.liger`` patch puts into every
Qwen2 / Llama loaded after it: Liger replaces the class in Transformers' module) has no ``act_fn``:
its activation is SiLU, by its own check of ``hidden_act``. ``unsupported(model)`` says why another
model falls back to Hugging Face's forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastcrit.rollout import decode_attn

TYPES = ("qwen2", "qwen3", "llama", "mistral")
_PACK_MIN_STEPS = 4  # decode steps left for which packing the projections for MKL pays (StaticDecoder._pack)
# Models narrower than this decode on plain linears: per-op overhead, not the GEMMs, bounds their
# step, so packing buys them nothing and costs memory (the A/B figures: docs/LOG.md).
_PACK_MIN_HIDDEN = 256


def _activation(mlp, cfg):
    """The gated MLP's activation: its ``act_fn``, else SiLU where the config names it (Liger's
    SwiGLU MLP), else None."""
    act = getattr(mlp, "act_fn", None)
    if act is None and getattr(cfg, "hidden_act", None) in ("silu", "swish"):
        act = F.silu
    return act


def unsupported(model) -> str | None:
    """Why ``model`` cannot use the static decoder, or None when it can."""
    cfg = model.config
    if cfg.model_type not in TYPES:
        return f"model_type {cfg.model_type!r} (supported: {', '.join(TYPES)})"
    if getattr(cfg, "use_sliding_window", False) or (
        cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None)
    ):
        return "sliding-window attention"
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return "layers other than full attention"
    rope = getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if kind not in ("default", "linear", "llama3", "yarn"):
        return f"rope type {kind!r} (its frequencies depend on the sequence length)"
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "rotary_emb") or not hasattr(base, "layers"):
        return "no model.rotary_emb / model.layers"
    for layer in base.layers:
        a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if a is None or m is None or not all(hasattr(a, k) for k in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return "a decoder layer without q/k/v/o projections"
        if not all(hasattr(m, k) for k in ("gate_proj", "up_proj", "down_proj")):
            return "a decoder layer without a gated MLP"
        if _activation(m, cfg) is None:
            return f"an MLP activation other than SiLU without act_fn ({getattr(cfg, 'hidden_act', None)!r})"
    return None


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def c_attention(model, fixed: bool = False) -> bool:
    """Whether the engine's decode step for ``model`` runs its attention in C (decode_attn.py): a
    model this decoder supports, a step that is not fixed, and what ``decode_attn.usable`` accepts
    (fp32 on a CPU, the library built, head sizes in multiples of 16)."""
    p = next(model.parameters())
    return not fixed and unsupported(model) is None and decode_attn.usable(p.dtype, p.device, _head_dim(model.config))


def _rms(norm, scaled: bool = True):
    """An RMSNorm module as one fused call (F.rms_norm: x * rsqrt(mean(x^2) + eps) * weight, in
    fp32 for fp32 inputs), instead of its seven eager ops; ``scaled=False`` leaves the weight out
    (where ``fuse_weights`` folded it into the next projection)."""
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    w = norm.weight if scaled else None
    w32 = None if w is None else w.float()  # made per decoder (one per generate call), not per step
    return lambda x: (
        F.rms_norm(x.float(), (x.shape[-1],), w32, eps).to(x.dtype)
        if x.dtype != torch.float32
        else F.rms_norm(x, (x.shape[-1],), w, eps)
    )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the rotate-half layout: x cos + rotate_half(x) sin, where rotate_half(x)
    = (-x2, x1) is x rolled by half the head dimension times the signs (-1, +1) already folded
    into ``sin_signed``: three ops where slicing, negating and concatenating took six."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


def mkl_packing(model) -> bool:
    """Whether the decode step can run its projections on MKL's pre-packed GEMM
    (``torch.ops.mkl._mkl_linear``): fp32 weights on a CPU, in a torch built with MKL. An ordinary
    GEMM call re-packs its weight operand into MKL's panel layout every time; a decode step's GEMMs
    have few rows (one token per sample), so that packing is a large share of them. Packed once per
    row count, the step is faster, the more so the fewer the rows (benchmarks/bench_generate.py),
    with the same logits (tests/rollout/test_native.py)."""
    p = next(model.parameters())
    return (
        p.device.type == "cpu"
        and p.dtype == torch.float32
        and torch.backends.mkl.is_available()
        and hasattr(torch.ops.mkl, "_mkl_linear")
        and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
    )


def fuse_weights(model) -> list[tuple]:
    """Per layer: (q/k/v projections as one weight, their bias, gate/up projections as one weight,
    the scale the step still puts on q), so q/k/v take one matmul where they took three (the step
    multiplies by the gate/up weight's two halves separately: see ``_run``). Where q is
    not normalised (no q_norm), its rows carry the attention scale (rotary is linear, so q's scores
    come out scaled) and the step's scale is 1; a q_norm would undo a scaled weight, so there the
    step scales q. The RMSNorm before each (its weight scales the input's columns) is folded into
    the columns of the weight, so the step's norms are weightless: W (g * x) = (W diag g) x.
    Copies, computed in fp32: rebuild after the weights change."""
    out = []
    with torch.no_grad():
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            in_weight, in_step = (1.0, a.scaling) if hasattr(a, "q_norm") else (a.scaling, 1.0)
            g_in, g_post = layer.input_layernorm.weight.float(), layer.post_attention_layernorm.weight.float()
            w = torch.cat([a.q_proj.weight.float() * in_weight, a.k_proj.weight.float(), a.v_proj.weight.float()])
            b = (
                torch.cat([a.q_proj.bias * in_weight, a.k_proj.bias, a.v_proj.bias])
                if a.q_proj.bias is not None
                else None
            )
            gu = torch.cat([m.gate_proj.weight.float(), m.up_proj.weight.float()]) * g_post
            out.append(((w * g_in).to(a.q_proj.weight.dtype), b, gu.to(m.gate_proj.weight.dtype), in_step))
    return out


class StaticDecoder:
    """Prefill, then one token per ``step``, for ``rows`` prompts of at most ``prompt_len`` tokens
    and ``max_new`` generated ones. Call ``prefill`` once; ``repeat_interleave`` gives each prompt
    n rows; ``select`` keeps some rows.

    The cache has two parts. A prompt's keys and values are stored once, ``[prompts, kv, P, d]``,
    whatever the number of its rows: every sample of a prompt attends to the same copy, so a decode
    step reads the prompt's cache once per prompt, not once per sample (the queries of a prompt's
    rows are stacked into one matrix against it). Generated keys and values are per row,
    ``[rows, kv, max_new, d]``. A row's scores over both parts go through one softmax."""

    def __init__(
        self,
        model,
        rows: int,
        prompt_len: int,
        max_new: int,
        fused: list[tuple] | None = None,
        fixed: bool = False,
        graph: bool = False,
    ):
        if graph and not fixed:
            raise ValueError("StaticDecoder: graph=True needs fixed=True (a captured step keeps its shapes)")
        self.model, self.base = model, model.model
        self.fixed, self.use_graph = fixed, graph
        self.graph = None  # the captured step (torch.cuda.CUDAGraph), at the first step
        self._out = None  # the step's logits buffer when fixed
        self.fused = fused if fused is not None else fuse_weights(model)
        # the fused gate/up weight's halves (contiguous rows, views), each layer's two MLP GEMMs
        self.gate_up = [(f[2][: f[2].shape[0] // 2], f[2][f[2].shape[0] // 2 :]) for f in self.fused]
        # their biases (Llama's mlp_bias), which folding the norm into the weights leaves as they are
        self.gate_up_bias = [(layer.mlp.gate_proj.bias, layer.mlp.up_proj.bias) for layer in model.model.layers]
        # the projections pre-packed for MKL at one row count (made at a decode step, see _pack)
        self.packing = mkl_packing(model) and not graph and model.config.hidden_size >= _PACK_MIN_HIDDEN
        self._packs: dict | None = None
        self._packed_rows = 0
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = _head_dim(cfg)
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self.P, self.max_new, self.t = prompt_len, max_new, 0
        # the decode step's attention in C (decode_attn.py) where it applies: its key caches are
        # then in that module's blocked layout (decode_attn.key_cache)
        self.native_attn = c_attention(model, fixed)
        self._scratch = torch.empty(0, dtype=p.dtype)
        shape = (rows, self.kv_heads, prompt_len, self.head_dim)
        self.kp = [
            decode_attn.key_cache(shape[:2], prompt_len, self.head_dim, p.dtype)
            if self.native_attn
            else torch.zeros(shape, dtype=p.dtype, device=p.device)
            for _ in self.base.layers
        ]
        self.vp = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in self.base.layers]
        # generated part [rows, kv, max_new, d] (keys blocked where native_attn), made at the first step
        self.kg = self.vg = None
        self.bias_p = None  # [prompts, P]: 0 on a prompt token, -inf on padding (added to the scores)
        self.bias_g = None  # fixed only, [rows, max_new]: -inf until the column is written
        self.group = torch.arange(rows, device=p.device)  # each row's prompt (ascending)
        self.width = 1  # rows per prompt in the grid of stacked queries
        self.slot = None  # each row's place in the [prompts x width] grid; None: the rows are the grid
        self.norms = [
            (_rms(layer.input_layernorm, scaled=False), _rms(layer.post_attention_layernorm, scaled=False))
            for layer in self.base.layers
        ]  # their weights are in the fused projections
        self.final_norm = _rms(self.base.norm)
        self.acts = [_activation(layer.mlp, model.config) for layer in self.base.layers]
        a = self.base.layers[0].self_attn
        self.qk_norm = (
            [(_rms(layer.self_attn.q_norm), _rms(layer.self_attn.k_norm)) for layer in self.base.layers]
            if hasattr(a, "q_norm")
            else None
        )
        # cos / sin of every position a row can reach, computed once (the model's rotary module)
        x = torch.zeros(1, 1, dtype=p.dtype, device=p.device)
        self.cos, self.sin = self.base.rotary_emb(x, torch.arange(prompt_len + max_new, device=p.device)[None])
        self.cos, self.sin = self.cos[0], self.sin[0]  # [positions, head_dim]
        half = self.head_dim // 2  # rotate_half's signs (-1 on the first half), folded into sin
        self.sin = self.sin * torch.cat([-torch.ones(half), torch.ones(self.head_dim - half)]).to(self.sin)

    def _attend(self, i, layer, x, c, s, mask):
        """Self-attention of layer i: the prompts' causal attention in prefill (``mask``), else
        one decode step (``mask`` None)."""
        a, (w, bias, _, scale) = layer.self_attn, self.fused[i]
        b, q_len, _ = x.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        qkv = self._linear(x, ("qkv", i), w, bias)
        v = qkv[..., (h + kv) * d :].view(b, q_len, kv, d).transpose(1, 2)
        if self.qk_norm is None:  # rotate q and k in one go
            qk = _rotate(qkv[..., : (h + kv) * d].view(b, q_len, h + kv, d).transpose(1, 2), c, s)
            q, k = qk[:, :h], qk[:, h:]
        else:
            q = self.qk_norm[i][0](qkv[..., : h * d].view(b, q_len, h, d)).transpose(1, 2)
            k = self.qk_norm[i][1](qkv[..., h * d : (h + kv) * d].view(b, q_len, kv, d)).transpose(1, 2)
            q, k = _rotate(q, c, s), _rotate(k, c, s)
        if mask is not None:  # prefill: the prompt part of the cache
            if self.native_attn:
                decode_attn.store_keys(self.kp[i], k)
            else:
                self.kp[i].copy_(k)
            self.vp[i].copy_(v)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=kv != h)
            return a.o_proj(out.transpose(1, 2).reshape(b, q_len, h * d))
        if self.native_attn:
            out = self._native_attend(i, q, k, v, scale)
            return self._proj(a.o_proj, out.reshape(b, 1, h * d), ("o", i))
        if self.fixed:  # the column is a tensor, the generated keys the whole width
            self.kg[i].index_copy_(2, self._col, k)
            self.vg[i].index_copy_(2, self._col, v)
            kg, vg = self.kg[i], self.vg[i]
        else:
            self.kg[i][:, :, self.t : self.t + 1] = k
            self.vg[i][:, :, self.t : self.t + 1] = v
            kg, vg = self.kg[i][:, :, : self.t + 1], self.vg[i][:, :, : self.t + 1]
        # The heads that share a KV head attend as one [group, d] block: the cache is read once per
        # KV head, never expanded. The scale goes on q (a few numbers), not on the scores.
        q = (q if scale == 1.0 else q * scale).reshape(b, kv, h // kv, d)
        sp = torch.matmul(self._to_grid(q), self.kp[i].transpose(-1, -2))  # [prompts, kv, width*g, P]
        sp = self._from_grid(sp.add_(self.bias_p[:, None, None, :]))
        sg = torch.matmul(q, kg.transpose(-1, -2))  # [rows, kv, g, t]
        if self.bias_g is not None:
            sg.add_(self.bias_g[:, None, None, :])
        probs = torch.softmax(torch.cat([sp, sg], dim=-1), dim=-1)
        out = torch.matmul(probs[..., self.P :], vg)
        out += self._from_grid(torch.matmul(self._to_grid(probs[..., : self.P]), self.vp[i]))
        return self._proj(a.o_proj, out.reshape(b, 1, h * d), ("o", i))

    def _native_attend(self, i, q, k, v, scale) -> torch.Tensor:
        """Step ``t``'s attention of layer i in C (decode_attn.attend), which also writes k and v
        into the generated cache."""
        need = torch.get_num_threads() * 2 * (self.kp[i].shape[2] + self.kg[i].shape[2]) * decode_attn.BLOCK
        if self._scratch.numel() < need:
            self._scratch = torch.empty(need, dtype=self.dtype)
        return decode_attn.attend(
            q,
            k,
            v,
            self.kp[i],
            self.vp[i],
            self.bias_p,
            self.group,
            self.kg[i],
            self.vg[i],
            self.t,
            scale,
            self._scratch,
        )

    def _to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, kv, g, m] -> [prompts, kv, width * g, m]: each prompt's rows stacked (empty
        places in the grid are zeros, and their results are never read)."""
        if self.slot is not None:
            grid = x.new_zeros((self.kp[0].shape[0] * self.width,) + x.shape[1:])
            grid[self.slot] = x
            x = grid
        n, kv, g, m = x.shape
        return (
            x.view(n // self.width, self.width, kv, g, m)
            .transpose(1, 2)
            .reshape(n // self.width, kv, self.width * g, m)
        )

    def _from_grid(self, y: torch.Tensor) -> torch.Tensor:
        """[prompts, kv, width * g, m] -> [rows, kv, g, m], the inverse of ``_to_grid``."""
        prompts, kv, wg, m = y.shape
        y = (
            y.view(prompts, kv, self.width, wg // self.width, m)
            .transpose(1, 2)
            .reshape(prompts * self.width, kv, wg // self.width, m)
        )
        return y if self.slot is None else y[self.slot]

    def _run(self, ids, pos, mask) -> torch.Tensor:
        x = self.base.embed_tokens(ids)
        c, s = self.cos[pos][:, None], self.sin[pos][:, None]  # [rows, 1, q_len, head_dim]
        for i, layer in enumerate(self.base.layers):
            pre, post = self.norms[i]
            x = x + self._attend(i, layer, pre(x), c, s, mask)
            m, h = layer.mlp, post(x)
            # gate and up as two GEMMs on the fused weight's halves (contiguous rows), not one: the
            # one [rows, 2 I] result outgrows the cache at a decode step's row counts, and its
            # halves are strided views the activation then reads (docs/LOG.md has the A/B)
            (w_gate, w_up), (b_gate, b_up) = self.gate_up[i], self.gate_up_bias[i]
            act = self.acts[i](self._linear(h, ("gate", i), w_gate, b_gate))
            x = x + self._proj(m.down_proj, act.mul_(self._linear(h, ("up", i), w_up, b_up)), ("down", i))
        return self._proj(self.model.lm_head, self.final_norm(x[:, -1]), "head").float()

    def _linear(self, x, key, w, b=None):
        """x @ w.T + b: on the weight's MKL pack when there is one (``_pack``), else plainly."""
        p = None if self._packs is None else self._packs.get(key)
        return F.linear(x, w, b) if p is None else torch.ops.mkl._mkl_linear(x, p, w, b, self._packed_rows)

    def _proj(self, module, x, key):
        """A projection module: on its MKL pack when it has one, else the module itself."""
        if self._packs is None or key not in self._packs:
            return module(x)
        return self._linear(x, key, module.weight, module.bias)

    def _pack(self) -> None:
        """Pre-pack the projections for MKL's GEMM at the current row count (``mkl_packing``), once
        enough steps are left to repay it: packing costs about one pass over the weights; the packed
        GEMM skips that pass at every call. ``_mkl_linear`` takes the pack only at the row count it
        was made for (torch falls back to a plain linear otherwise), so ``select`` drops the packs
        and the next step packs again. Where a projection is not a plain ``nn.Linear`` (a
        subclass may compute otherwise), it runs as it is."""
        rows = self.group.numel()
        if self._packed_rows == rows or self.max_new - self.t < _PACK_MIN_STEPS:
            return
        self._packs = None  # the old packs go before the new ones are made
        weights = {}
        for i, layer in enumerate(self.base.layers):
            weights[("qkv", i)] = self.fused[i][0]
            weights[("gate", i)], weights[("up", i)] = self.gate_up[i]
            for name, mod in (("o", layer.self_attn.o_proj), ("down", layer.mlp.down_proj)):
                if type(mod) is torch.nn.Linear:
                    weights[(name, i)] = mod.weight
        if type(self.model.lm_head) is torch.nn.Linear:
            weights["head"] = self.model.lm_head.weight
        reorder = torch.ops.mkl._mkl_reorder_linear_weight
        self._packs = {k: reorder(w.detach().contiguous(), rows) for k, w in weights.items()}
        self._packed_rows = rows

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids/mask [rows, P] left-padded; returns the last position's logits [rows, V] (fp32)."""
        rows, P = ids.shape
        valid = mask.bool()
        self.bias_p = torch.zeros(rows, P, dtype=self.dtype, device=ids.device).masked_fill_(~valid, float("-inf"))
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()
        attn = (causal[None] & valid[:, None, :]) | torch.eye(P, dtype=torch.bool, device=ids.device)[None]
        self.next_pos = mask.sum(1)
        return self._run(ids, pos, attn[:, None])

    def _start_decode(self) -> None:
        """The generated part of the cache, one row per sample (after ``repeat_interleave``)."""
        rows = self.group.numel()
        if self.native_attn:  # keys blocked (decode_attn.key_cache); values' rows padded alike
            shape = (rows, self.kv_heads, decode_attn.padded(self.max_new), self.head_dim)
            self.kg = [
                decode_attn.key_cache(shape[:2], self.max_new, self.head_dim, self.dtype) for _ in self.base.layers
            ]
        else:
            shape = (rows, self.kv_heads, self.max_new, self.head_dim)
            self.kg = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.base.layers]
        self.vg = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.base.layers]
        if self.fixed:
            self.bias_g = torch.full((shape[0], self.max_new), float("-inf"), dtype=self.dtype, device=self.device)

    @torch.inference_mode()
    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """Feed one token per row ([rows]); returns the next logits [rows, V] (fp32). Fixed: the
        logits are a buffer the next step overwrites."""
        if self.t >= self.max_new:
            raise RuntimeError(f"StaticDecoder.step: the cache holds {self.max_new} generated tokens")
        if self.kg is None:
            self._start_decode()
        if self.packing:
            self._pack()
        if self.fixed:
            return self._fixed_step(tok)
        logits = self._run(tok[:, None], self.next_pos[:, None], None)
        self.next_pos = self.next_pos + 1
        self.t += 1
        return logits

    def _fixed_step(self, tok: torch.Tensor) -> torch.Tensor:
        if self._out is None:  # the buffers the step reads, made once the rows are final
            self._tok = torch.zeros_like(tok)
            self._col = torch.zeros((1,), dtype=torch.long, device=tok.device)
        self._tok.copy_(tok)
        if self.use_graph and self.graph is None:
            self._capture()
        if self.graph is not None:
            self.graph.replay()
        else:
            self._out = self._body()
        self._col += 1
        self.next_pos += 1
        self.t += 1
        return self._out

    def _body(self) -> torch.Tensor:
        """One fixed-shape decode step from the buffers. Running it twice with the same buffers
        writes the same column again (so warm-up runs before a capture change nothing)."""
        self.bias_g.index_fill_(1, self._col, 0.0)
        return self._run(self._tok[:, None], self.next_pos[:, None], None)

    def _capture(self) -> None:
        """Capture ``_body`` as a CUDA graph: warm-up on a side stream, then ``torch.cuda.graph``."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._body()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._out = self._body()

    def repeat_interleave(self, n: int) -> None:
        """n rows per prompt, sharing the prompt's part of the cache (nothing is copied)."""
        if self.kg is not None:
            raise RuntimeError("StaticDecoder.repeat_interleave: only before the first step")
        self.group = self.group.repeat_interleave(n)
        self.next_pos = self.next_pos.repeat_interleave(n, dim=0)
        self.width *= n

    def select(self, keep: torch.Tensor) -> None:
        """Keep the rows ``keep`` (ascending); prompts left without a row leave the cache."""
        if self.fixed:
            raise RuntimeError("StaticDecoder.select: a fixed decoder keeps its rows (its step's shapes are fixed)")
        self._packs, self._packed_rows = None, 0  # packed for the old row count
        if self.kg is not None:
            self.kg = [c.index_select(0, keep) for c in self.kg]
            self.vg = [c.index_select(0, keep) for c in self.vg]
        self.next_pos = self.next_pos.index_select(0, keep)
        alive, group, counts = torch.unique_consecutive(
            self.group.index_select(0, keep), return_inverse=True, return_counts=True
        )
        if alive.numel() < self.kp[0].shape[0]:
            self.kp = [c.index_select(0, alive) for c in self.kp]
            self.vp = [c.index_select(0, alive) for c in self.vp]
            self.bias_p = self.bias_p.index_select(0, alive)
        self.group, self.width = group, int(counts.max())
        if bool((counts == self.width).all()):
            self.slot = None  # every prompt keeps all its rows: the rows are the grid
        else:
            first = counts.cumsum(0) - counts
            rank = torch.arange(group.numel(), device=group.device) - first[group]
            self.slot = group * self.width + rank
