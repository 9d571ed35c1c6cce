"""How the native engine (native.py) draws a token: ``sample`` (greedy, or temperature, top-k and
top-p over the sorted softmax, as SGLang does), ``draw`` (inverse-CDF sampling from one uniform
number per row) and ``uniforms`` (counter-based random numbers: a sample's depend on its seed
alone). The module docstring of native.py says what seeding covers."""

from __future__ import annotations

import torch

from fastcrit.types import SamplingParams, is_greedy


def sample(logits: torch.Tensor, params: SamplingParams, u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits`` [b, V] (fp32) with the uniform numbers ``u`` [b] in
    [0, 1) (unused when greedy); return (tokens [b], log-probs [b]).

    The log-prob is log_softmax(logits / T) at the token before any top-k / top-p filtering
    (T = 1 when greedy, see fastcrit.types.is_greedy).
    """
    if is_greedy(params.temperature):
        tok = logits.argmax(dim=-1)
        return tok, torch.log_softmax(logits, dim=-1).gather(1, tok[:, None]).squeeze(1)
    logp_all = torch.log_softmax(logits if params.temperature == 1.0 else logits / params.temperature, dim=-1)
    vocab = logits.shape[-1]
    if params.top_p >= 1.0 and (params.top_k < 0 or params.top_k >= vocab):
        tok = draw(logp_all.exp(), u)
    else:
        probs_sorted, order = logp_all.exp().sort(dim=-1, descending=True)
        if params.top_p < 1.0:
            cum = probs_sorted.cumsum(dim=-1)
            probs_sorted = probs_sorted.masked_fill(cum - probs_sorted > params.top_p, 0.0)
        if 0 < params.top_k < vocab:
            probs_sorted[:, params.top_k :] = 0.0
        tok = order.gather(1, draw(probs_sorted, u)[:, None]).squeeze(1)
    return tok, logp_all.gather(1, tok[:, None]).squeeze(1)


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One index per row of ``probs`` [b, V] (unnormalised, >= 0), with probability proportional
    to its entry, from one uniform number per row ``u`` [b] in [0, 1): inverse-CDF sampling
    (``torch.multinomial`` draws one per entry and was a fifth of a tiny model's decode time). A
    zero entry is never drawn."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    # u * total < total always picks an index whose cdf rises there (a positive entry); rounding
    # can make it reach total, which would pick past the end: the largest float under total picks
    # the last positive entry instead (a clamp of two numbers a row, not a pass over the vocabulary)
    under = torch.nextafter(total, torch.zeros_like(total))
    x = torch.minimum(u.to(device=probs.device, dtype=cdf.dtype)[:, None] * total, under)
    return torch.searchsorted(cdf, x, right=True).squeeze(1)


_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for int64 ``x`` in [0, 2**32): in 16-bit halves of ``c``, so no
    product leaves int64's range."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash with full avalanche (Wellons' "lowbias32" constants)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniforms(seed: int, ks: torch.Tensor, steps: int) -> torch.Tensor:
    """[len(ks), steps] float64 uniform numbers in [0, 1): row r depends only on ``seed + ks[r]``
    (mod 2**64) and the column, so a sample draws the same numbers whatever else is in its batch,
    in what order, on which rank or in how many calls (counter-based, like Philox; 53 random bits
    from two 32-bit hashes of a 64-bit key)."""
    base = int(seed) % 2**64
    lo = (base & _M32) + ks
    hi = ((base >> 32) + (lo >> 32)) & _M32
    lo = lo & _M32
    k1 = _mix32(lo ^ _mix32(hi ^ 0x9E3779B9))
    k2 = _mix32(hi ^ _mix32(lo ^ 0x85EBCA6B))
    t = torch.arange(steps, dtype=torch.long, device=ks.device)
    a = _mix32(k1[:, None] ^ _mix32(2 * t + 1)[None, :])
    b = _mix32(k2[:, None] ^ _mix32(2 * t + 2)[None, :] ^ a)
    return ((a << 21) + (b >> 11)).double() / 2.0**53
