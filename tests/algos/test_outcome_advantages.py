"""fastcrit.algos against the slow, obvious loop versions of verl's estimators (the oracles)."""

import math

import pytest
import torch

from fastcrit.algos.advantages import outcome_advantages
from fastcrit.algos.losses import policy_objective


def loop_grpo(scores, ids, norm=True, eps=1e-6):
    out = []
    for i, s in enumerate(scores):
        g = [scores[j] for j in range(len(scores)) if ids[j] == ids[i]]
        if len(g) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(g) / len(g)
            std = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1))
        out.append((s - mean) / (std + eps) if norm else s - mean)
    return out


def loop_rloo(scores, ids):
    out = []
    for i, s in enumerate(scores):
        g = [scores[j] for j in range(len(scores)) if ids[j] == ids[i]]
        n = len(g)
        out.append(s if n == 1 else n / (n - 1) * (s - sum(g) / n))
    return out


@pytest.mark.parametrize("name", ["grpo", "rloo"])
@pytest.mark.parametrize("norm", [True, False])
def test_outcome_advantages_match_loops(name, norm):
    g = torch.Generator().manual_seed(0)
    ids = [3, 3, 3, 7, 1, 1, 9, 9, 9, 9, 3]  # mixed sizes, a group of one, unsorted ids
    scores = torch.rand(len(ids), generator=g).tolist()
    scores[6:10] = [0.5] * 4  # a constant group
    mask = torch.ones(len(ids), 5)
    mask[2, 3:] = 0
    mask[4] = 0  # an empty response
    adv = outcome_advantages(name, torch.tensor(scores), torch.tensor(ids), mask, norm_by_std=norm)
    want = loop_grpo(scores, ids, norm) if name == "grpo" else loop_rloo(scores, ids)
    want = torch.tensor(want, dtype=torch.float32)[:, None] * mask
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="algorithm.name"):
        outcome_advantages("ppo", torch.tensor(scores), torch.tensor(ids), mask)


def test_policy_objective_adds_kl_and_entropy_terms():
    g = torch.Generator().manual_seed(1)
    B, T = 3, 4
    logp = (-torch.rand(B, T, generator=g)).requires_grad_()
    old = logp.detach() + 0.05 * torch.randn(B, T, generator=g)
    ref = logp.detach() - 0.1
    adv = torch.randn(B, T, generator=g)
    mask = torch.ones(B, T)
    mask[1, 2:] = 0
    ent = torch.rand(B, T, generator=g)
    loss, stats = policy_objective(
        logp,
        old,
        adv,
        mask,
        clip_low=0.2,
        clip_high=0.2,
        clip_c=None,
        agg="token-mean",
        ref_logp=ref,
        kl_coef=0.5,
        kl_kind="k1",
        entropy=ent,
        entropy_coef=0.1,
    )
    ratio = torch.exp(logp - old)
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    mean = lambda x: (x * mask).sum() / mask.sum()
    want = mean(pg) + 0.5 * mean(logp - ref) - 0.1 * mean(ent)
    torch.testing.assert_close(loss, want.float(), atol=1e-5, rtol=1e-5)
    assert stats["kl/mean"] == pytest.approx(mean(logp - ref).item(), abs=1e-6)
    loss.backward()
    assert torch.all(logp.grad[1, 2:] == 0)
