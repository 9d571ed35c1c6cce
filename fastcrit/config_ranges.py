"""The range of each numeric setting, one table: a value out of it stops the config with the key's
name, before anything runs. Every float anywhere in the tree must also be finite: ``nan`` passes
every comparison, so ``optim.lr=nan`` would otherwise train on and write NaN weights, and ``inf``
overflows the timeouts it reaches. Ranges that depend on other settings stay in config_checks.py.
"""

from __future__ import annotations

import dataclasses
import math

from fastcrit.errors import ConfigError

_AT_LEAST_1 = (lambda v: v >= 1, "must be >= 1")
_NON_NEGATIVE = (lambda v: v >= 0, "must be >= 0")
_POSITIVE = (lambda v: v > 0, "must be > 0")
_UNIT = (lambda v: 0 <= v <= 1, "must be in [0, 1]")
_UNIT_OPEN = (lambda v: 0 <= v < 1, "must be in [0, 1)")
_TOP_K = (lambda v: v == -1 or v >= 1, "must be -1 (off) or >= 1")  # SGLang's rule; both engines the same

_ENGINE = {
    "temperature": _NON_NEGATIVE,
    "top_k": _TOP_K,
    "max_new_tokens": _AT_LEAST_1,
    "weight_bucket_mb": _AT_LEAST_1,
}

RANGES: dict[str, tuple] = {
    "data.max_prompt_len": _AT_LEAST_1,
    "data.val_size": _NON_NEGATIVE,
    **{f"rollout.{k}": r for k, r in _ENGINE.items()},
    **{f"proxy.rollout.{k}": r for k, r in _ENGINE.items()},
    "proxy.rollout.top_p": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "proxy.concurrency": _AT_LEAST_1,
    "proxy.timeout_s": _POSITIVE,
    "proxy.retries": _NON_NEGATIVE,
    "algorithm.kl_coef": _NON_NEGATIVE,
    # the ratio's lower bound 1 - clip_low must stay above 0
    "algorithm.clip_low": _UNIT_OPEN,
    "algorithm.clip_high": _NON_NEGATIVE,
    "reward.model_batch_size": _AT_LEAST_1,
    "optim.lr": _NON_NEGATIVE,
    "optim.weight_decay": _NON_NEGATIVE,
    "optim.beta1": _UNIT_OPEN,
    "optim.beta2": _UNIT_OPEN,
    "optim.eps": _POSITIVE,
    # clip_grad_norm_ scales the gradients by grad_clip / norm: 0 zeroes every step, below 0 flips
    # the gradients' sign (the run would ascend its loss)
    "optim.grad_clip": _POSITIVE,
    "optim.warmup_steps": _NON_NEGATIVE,
    "sft.steps": _NON_NEGATIVE,
    "sft.batch_size": _AT_LEAST_1,
    "sft.lr": _NON_NEGATIVE,
    "sft.warmup_steps": _NON_NEGATIVE,
    "ppo.critic_lr": _NON_NEGATIVE,
    "ppo.critic_warmup": _NON_NEGATIVE,
    "ppo.kl_in_reward_coef": _NON_NEGATIVE,
    "rm.samples_per_prompt": _AT_LEAST_1,
    "rm.prompts": _AT_LEAST_1,
    "rm.steps": _NON_NEGATIVE,
    "rm.batch_size": _AT_LEAST_1,
    "rm.lr": _NON_NEGATIVE,
    "rm.warmup_steps": _NON_NEGATIVE,
    "raro.critic_samples": _AT_LEAST_1,
    "raro.critic_max_new_tokens": _AT_LEAST_1,
    # a tie pays between naming the expert (critic 1, policy 0) and being fooled (0, 1)
    "raro.tau_crit": _UNIT,
    "raro.tau_pol": _UNIT,
    "ctrl.solution_temperature": _NON_NEGATIVE,
    "ctrl.val_seed": _NON_NEGATIVE,  # numpy's generators refuse a negative seed
    "trainer.eval_every": _NON_NEGATIVE,
    "trainer.seed": _NON_NEGATIVE,
    "trainer.compute_threads": _NON_NEGATIVE,
}


def _leaves(node, prefix: str = ""):
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def check_ranges(cfg) -> None:
    """ConfigError naming the first setting of ``cfg`` (fastcrit.config.Config) out of its range."""
    values = dict(_leaves(cfg))
    for key, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}: must be a finite number, got {value}")
    for key, (ok, rule) in RANGES.items():
        value = values[key]  # KeyError: a key in the table that the tree no longer has
        if value is not None and not ok(value):
            raise ConfigError(f"{key}: {rule}, got {value}")
    for section in ("model", "proxy.model"):
        model = cfg.model if section == "model" else cfg.proxy.model
        if model.path == "tiny":
            try:
                model.tiny.validate()
            except ValueError as e:
                raise ConfigError(f"{section}.tiny: {e}") from None
