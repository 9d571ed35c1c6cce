"""Numeric settings out of their range stop the config naming the key (fastcrit.config_ranges):
each of these was accepted before and ran (optim.grad_clip=-1 ascended the loss, optim.lr=nan
wrote NaN weights) or failed deep inside a run."""

import dataclasses
import math

import pytest

from fastcrit.config import Config, ConfigError, load_config
from fastcrit.config_ranges import RANGES

BASE = "configs/cpu/grpo.yaml"


@pytest.mark.parametrize(
    "setting, message",
    [
        ("optim.lr=nan", "optim.lr: must be a finite number, got nan"),
        ("optim.grad_clip=0", "optim.grad_clip: must be > 0, got 0"),
        ("optim.grad_clip=-1", "optim.grad_clip: must be > 0"),
        ("optim.beta2=1", "optim.beta2: must be in [0, 1)"),
        ("optim.eps=0", "optim.eps: must be > 0"),
        ("optim.weight_decay=-0.1", "optim.weight_decay: must be >= 0"),
        ("algorithm.kl_coef=-0.001", "algorithm.kl_coef: must be >= 0"),
        ("algorithm.clip_low=1.0", "algorithm.clip_low: must be in [0, 1)"),
        ("algorithm.clip_high=-0.2", "algorithm.clip_high: must be >= 0"),
        ("algorithm.entropy_coef=inf", "algorithm.entropy_coef: must be a finite number, got inf"),
        ("rollout.temperature=inf", "rollout.temperature: must be a finite number"),
        ("rollout.top_k=0", "rollout.top_k: must be -1 (off) or >= 1, got 0"),
        ("data.max_prompt_len=-1", "data.max_prompt_len: must be >= 1"),
        ("sft.batch_size=0", "sft.batch_size: must be >= 1"),
        ("raro.tau_crit=1.5", "raro.tau_crit: must be in [0, 1]"),
        ("trainer.seed=-1", "trainer.seed: must be >= 0"),
        ("trainer.dist_timeout_s=inf", "trainer.dist_timeout_s: must be a finite number"),
        ("model.tiny.hidden=-1", "model.tiny: tiny model: hidden=-1 must be >= 1"),
        ("model.tiny.vocab_size=100", "model.tiny: tiny model: vocab_size=100 must be >= 259"),
        ("sandbox.timeout_s=7200", "sandbox.timeout_s must be a number in [0.01, 3600], got 7200"),
        ("sandbox.memory_mb=-1", "sandbox.memory_mb must be a number in [16, 1048576]"),
    ],
)
def test_out_of_range_settings_are_refused_by_name(setting, message):
    with pytest.raises(ConfigError) as e:
        load_config(BASE, [setting])
    assert message in str(e.value)


def test_every_shipped_default_is_in_range_and_every_ranged_key_exists():
    values = {}

    def walk(node, prefix=""):
        for f in dataclasses.fields(node):
            v = getattr(node, f.name)
            if dataclasses.is_dataclass(v):
                walk(v, f"{prefix}{f.name}.")
            else:
                values[f"{prefix}{f.name}"] = v

    walk(Config())
    assert set(RANGES) <= set(values)
    for key, (ok, rule) in RANGES.items():
        assert values[key] is None or ok(values[key]), (key, rule)
    assert all(math.isfinite(v) for v in values.values() if isinstance(v, float))
    load_config(BASE, ["optim.lr=0", "rollout.top_k=-1", "rollout.top_k=5", "algorithm.clip_low=0"])
