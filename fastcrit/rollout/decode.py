"""A lean decode path for Llama-family decoders on a static KV cache.

Hugging Face's forward rebuilds the attention mask, grows a dynamic cache and runs its checks at
every generated token; with small models and batches that overhead is most of the time. Here the
engine runs the same modules (projections, norms, MLPs, rotary embedding: the model's own
``nn.Module``\\s and weights) in a fixed order over a cache allocated once for the whole generation:

- prompts are left-padded, so every row writes its t-th generated token's keys and values into the
  same cache column ``P + t``; a key-padding mask (prompt mask, then ones) is all the masking decode
  needs;
- prefill attends causally within each prompt; a padding query attends to itself only, so no row
  ever takes a softmax over nothing;
- rows that stopped leave the batch by ``select`` (one gather of the cache).

``fixed=True`` keeps every shape of a decode step the same from the first step to the last, so the
step can be captured as a CUDA graph (``graph=True``, CUDA only) and replayed: it attends over the
whole cache width under the key mask (a generated column turns on when its token is written), and
the token, its cache column and the positions live in buffers the step reads (``index_copy_`` /
``index_fill_`` at the column, no Python-side slicing). Rows then never leave the batch. On CPU the
fixed step runs eagerly (tests compare it with the sliced one); the capture itself has not run here
(no GPU): it follows torch's documented pattern (warm-up on a side stream, ``torch.cuda.graph``,
``CUDAGraph.replay``; torch 2.13 cuda/graphs.py).

Supported: model types whose decoder layers are ``input_layernorm -> self_attn(q/k/v/o_proj,
optional q_norm/k_norm) -> post_attention_layernorm -> mlp(gate/up/down, act_fn)`` with rotary
positions from ``model.rotary_emb`` and no sliding window (Qwen2, Qwen3, Llama, Mistral without a
window). ``unsupported(model)`` says why another model falls back to Hugging Face's forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

TYPES = ("qwen2", "qwen3", "llama", "mistral")


def unsupported(model) -> str | None:
    """Why ``model`` cannot use the static decoder, or None when it can."""
    cfg = model.config
    if cfg.model_type not in TYPES:
        return f"model_type {cfg.model_type!r} (supported: {', '.join(TYPES)})"
    if getattr(cfg, "use_sliding_window", False) or (cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None)):
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
        if not all(hasattr(m, k) for k in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return "a decoder layer without a gated MLP"
    return None


def _rms(norm):
    """An RMSNorm module as one fused call (F.rms_norm: x * rsqrt(mean(x^2) + eps) * weight, in
    fp32 for fp32 inputs), instead of its seven eager ops."""
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    w = norm.weight
    return lambda x: F.rms_norm(x.float(), (x.shape[-1],), w.float(), eps).to(x.dtype) if x.dtype != torch.float32 \
        else F.rms_norm(x, (x.shape[-1],), w, eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def fuse_weights(model) -> list[tuple]:
    """Per layer: the q/k/v projections as one weight (and bias) and the gate/up projections as
    one, so a layer runs two matmuls where it ran five. Copies: rebuild after the weights change."""
    out = []
    with torch.no_grad():
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            b = (torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
                 if a.q_proj.bias is not None else None)
            out.append((w, b, torch.cat([m.gate_proj.weight, m.up_proj.weight])))
    return out


class StaticDecoder:
    """Prefill, then one token per ``step``, for ``rows`` sequences of at most ``prompt_len +
    max_new`` tokens. Call ``prefill`` once; ``repeat_interleave`` copies each row n times (one
    prefill per distinct prompt); ``select`` keeps some rows."""

    def __init__(self, model, rows: int, prompt_len: int, max_new: int, fused: list[tuple] | None = None,
                 fixed: bool = False, graph: bool = False):
        if graph and not fixed:
            raise ValueError("StaticDecoder: graph=True needs fixed=True (a captured step keeps its shapes)")
        self.model, self.base = model, model.model
        self.fixed, self.use_graph = fixed, graph
        self.graph = None  # the captured step (torch.cuda.CUDAGraph), at the first step
        self._out = None  # the step's logits buffer when fixed
        self.fused = fused if fused is not None else fuse_weights(model)
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        p = next(model.parameters())
        self.P, self.max_new, self.t = prompt_len, max_new, 0
        shape = (rows, self.kv_heads, prompt_len + max_new, self.head_dim)
        self.k = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in self.base.layers]
        self.v = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in self.base.layers]
        self.key_mask = None  # [rows, P + max_new] bool
        self.norms = [(_rms(layer.input_layernorm), _rms(layer.post_attention_layernorm)) for layer in self.base.layers]
        self.final_norm = _rms(self.base.norm)
        a = self.base.layers[0].self_attn
        self.qk_norm = [(_rms(layer.self_attn.q_norm), _rms(layer.self_attn.k_norm)) for layer in self.base.layers] \
            if hasattr(a, "q_norm") else None
        # cos / sin of every position a row can reach, computed once (the model's rotary module)
        x = torch.zeros(1, 1, dtype=p.dtype, device=p.device)
        self.cos, self.sin = self.base.rotary_emb(x, torch.arange(prompt_len + max_new, device=p.device)[None])
        self.cos, self.sin = self.cos[0], self.sin[0]  # [positions, head_dim]

    def _attend(self, i, layer, x, c, s, cols: slice, mask):
        a, (w, bias, _) = layer.self_attn, self.fused[i]
        b, q_len, _ = x.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        qkv = F.linear(x, w, bias)
        v = qkv[..., (h + kv) * d:].view(b, q_len, kv, d).transpose(1, 2)
        if self.qk_norm is None:  # rotate q and k in one go
            qk = qkv[..., :(h + kv) * d].view(b, q_len, h + kv, d).transpose(1, 2)
            qk = qk * c + _rotate_half(qk) * s
            q, k = qk[:, :h], qk[:, h:]
        else:
            q = self.qk_norm[i][0](qkv[..., :h * d].view(b, q_len, h, d)).transpose(1, 2)
            k = self.qk_norm[i][1](qkv[..., h * d:(h + kv) * d].view(b, q_len, kv, d)).transpose(1, 2)
            q, k = q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s
        if isinstance(cols, slice):
            self.k[i][:, :, cols] = k
            self.v[i][:, :, cols] = v
            keys, values = self.k[i][:, :, :cols.stop], self.v[i][:, :, :cols.stop]
        else:  # fixed: the column is a tensor, the keys the whole width
            self.k[i].index_copy_(2, cols, k)
            self.v[i].index_copy_(2, cols, v)
            keys, values = self.k[i], self.v[i]
        if q_len == 1 and keys.device.type == "cpu":
            # Decode on CPU: the heads that share a KV head attend as one [group, d] block, so the
            # cache is read once per KV head and not expanded; 10-20% under SDPA's GQA path here.
            scores = torch.matmul(q.reshape(b, kv, h // kv, d), keys.transpose(-1, -2)) * a.scaling
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            return a.o_proj(torch.matmul(probs, values).reshape(b, 1, h * d))
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=a.scaling, enable_gqa=kv != h)
        return a.o_proj(out.transpose(1, 2).reshape(b, q_len, h * d))

    def _run(self, ids, pos, cols, mask) -> torch.Tensor:
        x = self.base.embed_tokens(ids)
        c, s = self.cos[pos][:, None], self.sin[pos][:, None]  # [rows, 1, q_len, head_dim]
        for i, layer in enumerate(self.base.layers):
            pre, post = self.norms[i]
            x = x + self._attend(i, layer, pre(x), c, s, cols, mask)
            m = layer.mlp
            gate, up = F.linear(post(x), self.fused[i][2]).chunk(2, dim=-1)
            x = x + m.down_proj(m.act_fn(gate) * up)
        return self.model.lm_head(self.final_norm(x[:, -1])).float()

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids/mask [rows, P] left-padded; returns the last position's logits [rows, V] (fp32)."""
        rows, P = ids.shape
        valid = mask.bool()
        # sliced steps read only the columns written so far; fixed ones turn each column on as they write it
        gen = valid.new_zeros((rows, self.max_new)) if self.fixed else valid.new_ones((rows, self.max_new))
        self.key_mask = torch.cat([valid, gen], dim=1)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()
        attn = (causal[None] & valid[:, None, :]) | torch.eye(P, dtype=torch.bool, device=ids.device)[None]
        self.next_pos = mask.sum(1)
        return self._run(ids, pos, slice(0, P), attn[:, None])

    @torch.inference_mode()
    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """Feed one token per row ([rows]); returns the next logits [rows, V] (fp32). Fixed: the
        logits are a buffer the next step overwrites."""
        if self.t >= self.max_new:
            raise RuntimeError(f"StaticDecoder.step: the cache holds {self.max_new} generated tokens")
        if self.fixed:
            return self._fixed_step(tok)
        col = self.P + self.t
        mask = self.key_mask[:, None, None, :col + 1]
        logits = self._run(tok[:, None], self.next_pos[:, None], slice(col, col + 1), mask)
        self.next_pos = self.next_pos + 1
        self.t += 1
        return logits

    def _fixed_step(self, tok: torch.Tensor) -> torch.Tensor:
        if self._out is None:  # the buffers the step reads, made once the rows are final
            self._tok = torch.zeros_like(tok)
            self._col = torch.full((1,), self.P, dtype=torch.long, device=tok.device)
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
        self.key_mask.index_fill_(1, self._col, True)
        return self._run(self._tok[:, None], self.next_pos[:, None], self._col, self.key_mask[:, None, None, :])

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
        if self._out is not None:
            raise RuntimeError("StaticDecoder.repeat_interleave: only before the first step")
        self.k = [c.repeat_interleave(n, dim=0) for c in self.k]
        self.v = [c.repeat_interleave(n, dim=0) for c in self.v]
        self.key_mask = self.key_mask.repeat_interleave(n, dim=0)
        self.next_pos = self.next_pos.repeat_interleave(n, dim=0)

    def select(self, keep: torch.Tensor) -> None:
        if self.fixed:
            raise RuntimeError("StaticDecoder.select: a fixed decoder keeps its rows (its step's shapes are fixed)")
        self.k = [c.index_select(0, keep) for c in self.k]
        self.v = [c.index_select(0, keep) for c in self.v]
        self.key_mask = self.key_mask.index_select(0, keep)
        self.next_pos = self.next_pos.index_select(0, keep)
