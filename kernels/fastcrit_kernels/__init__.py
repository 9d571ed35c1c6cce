"""fastcrit_kernels: fused kernels for RL losses, usable alone with torch + triton.

Each public function has a Triton path, a fast CPU path (chunked torch) and a plain fp32/fp64
reference; see ``_dispatch`` for how one is chosen.
"""

from fastcrit_kernels._dispatch import BACKENDS, resolve_backend

__version__ = "0.1.0"

# Public functions: each module adds its own import line below (keep one line per module).
from fastcrit_kernels.advantages import ESTIMATORS, broadcast_to_tokens, group_advantages
from fastcrit_kernels.fused_linear import fused_linear_pacs_loss, fused_linear_ppo_loss
from fastcrit_kernels.kl import KL_KINDS, kl_penalty
from fastcrit_kernels.logprobs import fused_logprobs
from fastcrit_kernels.pacs import pacs_loss
from fastcrit_kernels.ppo import AGG_MODES, aggregate_loss, ppo_policy_loss, value_loss

__all__ = [
    "BACKENDS",
    "resolve_backend",
    "fused_logprobs",
    "fused_linear_ppo_loss",
    "fused_linear_pacs_loss",
    "KL_KINDS",
    "kl_penalty",
    "ESTIMATORS",
    "group_advantages",
    "broadcast_to_tokens",
    "AGG_MODES",
    "aggregate_loss",
    "ppo_policy_loss",
    "value_loss",
    "pacs_loss",
]
