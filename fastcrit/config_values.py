"""Values the config implies rather than states: each resolves a key whose default depends on others
(an ``auto``, an empty path). Apart from config.py so the tree itself stays declarations."""

from __future__ import annotations

import os

# Each function takes the config tree (``cfg``: fastcrit.config.Config), not imported here: config.py's
# checks import this module.


def recompute_old_logprobs(cfg) -> bool:
    """``algorithm.recompute_old_logprobs`` resolved: ``auto`` recomputes when the engine's
    log-probs can differ from the trainer's by more than fp32 rounding (SGLang's kernels, or a
    low-precision dtype: bf16 rounding of the logits alone moves log-probs far beyond fp32 rounding)."""
    r = cfg.algorithm.recompute_old_logprobs
    if r == "auto":
        return cfg.rollout.engine == "sglang" or cfg.model.dtype != "float32"
    return bool(r)


def loss_scale(cfg) -> float:
    """The constant ``seq-mean-token-sum-norm`` divides by: ``algorithm.loss_scale_factor``, else
    ``rollout.max_new_tokens``."""
    f = cfg.algorithm.loss_scale_factor
    return float(cfg.rollout.max_new_tokens if f is None else f)


def rm_output_dir(cfg) -> str:
    """Where `fastcrit rm` writes: ``rm.output_dir``, else ``<trainer.output_dir>/rm``."""
    return cfg.rm.output_dir or os.path.join(cfg.trainer.output_dir, "rm")


def reward_model_path(cfg) -> str:
    """The `model` reward's directory: ``reward.model_path``, else the reward model this run trains
    itself (``<rm_output_dir>/final``), so a run given another output_dir never scores with the
    reward model of the run whose directory a config names."""
    return cfg.reward.model_path or os.path.join(rm_output_dir(cfg), "final")
