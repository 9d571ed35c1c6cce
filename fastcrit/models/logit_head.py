"""What a causal LM does to ``lm_head``'s output before it calls it logits.

The trainer never materialises logits: it computes log-probs from the last hidden states and
``lm_head``'s weight (fastcrit_kernels.fused_logprobs), which equals the model's own log-softmax
only where ``logits == hidden @ lm_head.T (+ bias)``. Several Hugging Face families change the
product first: Granite and MiniCPM3 divide it by ``logits_scaling``, HyperCLOVA X multiplies by
it, Cohere by ``logit_scale``, Falcon-H1 by ``lm_head_multiplier``; Gemma 2, nanochat (and Gemma 3
where its config sets it) cap it with ``tanh`` (``final_logit_softcapping``). A constant factor is
exact to fold into the temperature (``log_softmax(c z / T) = log_softmax(z / (T / c))``); a cap is
not linear, and a trainer that left it out would follow another distribution than the one the
model samples from.

``logit_scale(lm)`` finds the factor by running the model's own forward with its decoder
answering a fixed probe and ``lm_head`` taken out (its input passed through), so the factor comes
from the model's code whatever its family calls it; no weight is read (a model on the meta device
works).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn

# Config keys that some families read after lm_head: named in the error, so the user sees which.
TRANSFORM_KEYS = (
    "final_logit_softcapping",
    "logit_softcapping",
    "logits_soft_cap",
    "logits_scaling",
    "logit_scale",
    "lm_head_multiplier",
)
# Values from -48 to 48: a tanh cap (Gemma 2's is 30) bends them far beyond the tolerance, and a
# cap large enough not to (over about 1e5) changes no log-prob measurably either.
_PROBE = torch.linspace(-48.0, 48.0, 4 * 12).reshape(1, 4, 12)
_RTOL = 1e-5


class _Answer(dict):
    """The decoder's output as a family's head reads it: ``last_hidden_state`` (or ``[0]``), and
    None for whatever else it asks (GPT-2's ``cross_attentions``, a MoE's ``router_logits``)."""

    def __init__(self, hidden: torch.Tensor):
        super().__init__(last_hidden_state=hidden)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)

    def __getitem__(self, key):
        return self["last_hidden_state"] if key == 0 else super().__getitem__(key)

    def to_tuple(self) -> tuple:
        return (self["last_hidden_state"],)


class _PassThrough(nn.Module):
    """``lm_head`` taken out: its input comes back as it is. A ``weight`` (fp32, empty) stays for
    the families that read its dtype first (Mamba casts the hidden states to it)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(0), requires_grad=False)
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class UnsupportedLogits(ValueError):
    """The model's logits are not its hidden states times ``lm_head`` up to a constant factor."""


def _transform_settings(config) -> str:
    found = [f"{k}={getattr(config, k)!r}" for k in TRANSFORM_KEYS if getattr(config, k, None) is not None]
    return ", ".join(found)


def _head_slot(lm: nn.Module) -> str | None:
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    if head is None:
        return None
    return next((name for name, m in lm.named_children() if m is head), None)


@contextlib.contextmanager
def _probing(lm: nn.Module, base: nn.Module, slot: str, hidden: torch.Tensor):
    """The decoder answers ``hidden`` (its ``forward`` replaced on the instance, so attributes the
    head reads from it, such as Falcon-H1's multiplier, stay), ``lm_head`` passes its input through."""
    head = lm._modules[slot]
    own = base.__dict__.get("forward")  # a forward already set on the instance (a hook library's)

    def answer(*args, **kwargs):
        return _Answer(hidden)

    base.forward = answer
    lm._modules[slot] = _PassThrough()
    try:
        yield
    finally:
        lm._modules[slot] = head
        if own is None:
            del base.forward
        else:
            base.forward = own


def logit_scale(lm: nn.Module) -> float:
    """The constant ``c`` with ``lm(x).logits == c * (hidden @ lm_head.T + bias)`` for ``lm``, a
    Hugging Face causal LM (1.0 for most families). Raises UnsupportedLogits when the model does
    something else to the product (a ``tanh`` cap), naming the config keys that ask for it."""
    name = getattr(lm.config, "model_type", type(lm).__name__)
    base = getattr(lm, getattr(lm, "base_model_prefix", ""), None)
    slot = _head_slot(lm)
    if not isinstance(base, nn.Module) or base is lm or slot is None:
        raise UnsupportedLogits(
            f"{name}: no decoder under base_model_prefix and lm_head as a child module, so the "
            "log-probs from hidden states x lm_head cannot be checked against the model's logits"
        )
    hidden = _PROBE.clone()
    try:
        with _probing(lm, base, slot, hidden), torch.no_grad():
            out = lm(input_ids=torch.zeros(hidden.shape[:2], dtype=torch.long), use_cache=False)
        logits = out.logits if hasattr(out, "logits") else out[0]
    except Exception as exc:  # the model's own forward, whatever it raises
        raise UnsupportedLogits(
            f"{name}: its forward could not be run on a probe of hidden states to check what it does "
            f"after lm_head ({type(exc).__name__}: {exc})"
        ) from exc
    settings = _transform_settings(lm.config)
    where = f" ({settings})" if settings else ""
    if tuple(logits.shape) != tuple(hidden.shape):
        raise UnsupportedLogits(
            f"{name}: its logits are not lm_head's output elementwise{where}: the probe's "
            f"{tuple(hidden.shape)} came back as {tuple(logits.shape)}"
        )
    logits = logits.detach().to(torch.float64)
    ref = hidden.to(torch.float64)
    scale = float((logits * ref).sum() / (ref * ref).sum())  # least squares through 0
    if not (math.isfinite(scale) and scale > 0) or not torch.allclose(logits, scale * ref, rtol=_RTOL, atol=0.0):
        raise UnsupportedLogits(
            f"{name} transforms lm_head's output before its logits, not by a constant factor{where}. "
            "fastcrit computes log-probs from hidden states x lm_head without materialising the "
            "logits, so it would train another distribution than the model samples from. To train "
            "this model without the transform, remove it from the model directory's config.json "
            "(e.g. final_logit_softcapping: null); generation then runs without it too."
        )
    return 1.0 if abs(scale - 1.0) <= _RTOL else scale
