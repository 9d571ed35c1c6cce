"""The KL-in-reward coefficient's controllers against verl's formulas written out by hand."""

import pytest
import torch

from fastcrit.algos.kl_control import kl_row_means, next_kl_coef


def verl_adaptive(coef, kl, n_steps, target, horizon):
    """AdaptiveKLController.update, step by step: the proportional error, clipped, then the factor."""
    error = kl / target - 1
    if error > 0.2:
        error = 0.2
    if error < -0.2:
        error = -0.2
    return coef * (1 + error * n_steps / horizon)


def test_adaptive_follows_verl_and_fixed_stays():
    coef, want = 0.05, 0.05
    # below, at, a little above and far above / below the target: the clip at +-0.2 is reached both ways
    for kl in (0.02, 0.1, 0.11, 0.5, 0.0, 0.09, 3.0):
        coef = next_kl_coef(coef, kl, 256, ctrl="adaptive", target=0.1, horizon=1000.0)
        want = verl_adaptive(want, kl, 256, 0.1, 1000.0)
        assert coef == pytest.approx(want, rel=1e-12)
    assert next_kl_coef(0.05, 0.5, 256, ctrl="adaptive", target=0.1, horizon=1000.0) == pytest.approx(
        0.05 * (1 + 0.2 * 0.256)
    )  # far above: +20% of n / horizon
    assert next_kl_coef(0.05, 0.5, 256, ctrl="fixed", target=0.1, horizon=1000.0) == 0.05
    with pytest.raises(ValueError, match="algorithm.kl_ctrl"):
        next_kl_coef(0.05, 0.5, 256, ctrl="pid", target=0.1, horizon=1000.0)


def test_kl_row_means_are_token_means_per_sequence():
    kl = torch.tensor([[1.0, 3.0, 7.0], [2.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(kl_row_means(kl, mask), torch.tensor([2.0, 2.0, 0.0], dtype=torch.float64))
