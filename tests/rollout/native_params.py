"""Sampling parameters the native engine's test files share."""

from fastcrit.types import SamplingParams


def greedy(n=1, max_new=8, **kw):
    return SamplingParams(n=n, max_new_tokens=max_new, temperature=0.0, **kw)
