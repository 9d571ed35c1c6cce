"""The scaffold's engine seeds: every sample's seed (seed + its index) stays below 2**63 whatever
trainer.seed and the step, both engines take it, and the seeds that fitted before are unchanged."""

import itertools

import pytest
import torch

from fastcrit.recipes.scaffold import sampling_seed
from fastcrit.rollout.sampling import uniforms
from fastcrit.rollout.sglang import request_params
from fastcrit.types import SamplingParams

SEEDS = [0, 1, 3, 2147, 2148, 4295, 2**31 - 1, 2**31, 2**32 + 5, 2**62, 2**63 + 1, 10**30]
STEPS = [1, 2, 999, 10**6, 2**28 + 3, 2**40]
STREAMS = [0, 1, 15]
FIRSTS = [0, 96, 2**32 - 2**20]
LAST_K = 2**20 - 1  # samples after `first` in one call: first + k stays below 2**32


def _old_key(seed: int, step: int, stream: int) -> int:
    return (seed * 1_000_003 + step * 16 + stream) % 2**32


def test_every_sample_seed_fits_int64_and_both_engines_take_it():
    fitted_before = 0
    for seed, step, stream, first in itertools.product(SEEDS, STEPS, STREAMS, FIRSTS):
        s = sampling_seed(seed, step, stream, first)
        assert 0 <= s and s + LAST_K < 2**63, (seed, step, stream, first, s)
        # SGLang: the last requests of the call carry seed + k, each inside int64.
        tail = request_params(SamplingParams(seed=s + LAST_K - 3), 4, stop_ids=[1], deterministic=True)
        assert [r["sampling_seed"] for r in tail] == [s + LAST_K - 3 + i for i in range(4)]
        assert all(r["sampling_seed"] <= 2**63 - 1 for r in tail)
        # The native engine: the same numbers as the seeds' remainder mod 2**64 (how it reads them).
        u = uniforms(s, torch.tensor([0, LAST_K]), 3)
        assert ((u >= 0) & (u < 1)).all()
        if _old_key(seed, step, stream) < 2**31:  # a seed that fitted int64 before: unchanged
            assert s == _old_key(seed, step, stream) * 2**32 + first
            fitted_before += 1
    assert 0 < fitted_before < len(SEEDS) * len(STEPS) * len(STREAMS) * len(FIRSTS)


def test_the_default_seeds_are_the_ones_runs_were_made_with():
    assert sampling_seed(0, 1, 0, 0) == 16 * 2**32
    assert sampling_seed(3, 5, 1, 8) == (3 * 1_000_003 + 5 * 16 + 1) * 2**32 + 8


def test_seeds_of_different_steps_and_streams_differ():
    seen = {sampling_seed(2148, step, stream, 0) for step in range(1, 200) for stream in range(16)}
    assert len(seen) == 199 * 16


def test_a_sample_index_past_32_bits_is_refused():
    with pytest.raises(ValueError, match="first=4294967296"):
        sampling_seed(0, 1, 0, 2**32)
    with pytest.raises(ValueError, match="first=-1"):
        sampling_seed(0, 1, 0, -1)


def test_sglang_params_refuse_a_seed_outside_int64():
    with pytest.raises(ValueError, match="2\\*\\*63"):
        request_params(SamplingParams(seed=2**63 - 2), 4, stop_ids=[1], deterministic=True)
    with pytest.raises(ValueError, match="2\\*\\*63"):
        request_params(SamplingParams(seed=-1), 1, stop_ids=[1], deterministic=True)
    ok = request_params(SamplingParams(seed=2**63 - 4), 4, stop_ids=[1], deterministic=True)
    assert ok[-1]["sampling_seed"] == 2**63 - 1
