"""The objectives update_policy minimises, against plain loops written from the papers."""

import math

import pytest
import torch

from fastcrit.algos.losses import PACSObjective, PPOObjective, tis_weights
from fastcrit.config import AlgorithmConfig, PACSConfig
from fastcrit.types import RolloutBatch


def batch(seed=0, groups=3, n=4, R=5):
    g = torch.Generator().manual_seed(seed)
    B = groups * n
    mask = (torch.rand(B, R, generator=g) > 0.2).float()
    mask[:, 0] = 1.0
    old = -torch.rand(B, R, generator=g) * 2 * mask
    logp = (old + 0.3 * torch.randn(B, R, generator=g)) * mask
    scores = (torch.rand(B, generator=g) > 0.5).float()
    b = RolloutBatch(
        prompts=torch.zeros(B, 1, dtype=torch.long),
        responses=torch.zeros(B, R, dtype=torch.long),
        attention_mask=torch.ones(B, R + 1, dtype=torch.long),
        response_mask=mask,
        old_logprobs=old,
        group_ids=torch.arange(B) // n,
        scores=scores,
    )
    return b, logp.requires_grad_(True)


def loop_pacs(logp, b, beta, method, weighted):
    B = len(b)
    r = []
    for i in range(B):
        m = b.response_mask[i]
        if method == "1":
            r.append(beta * ((logp[i] - b.old_logprobs[i]) * m).sum())
        else:
            r.append(beta * (logp[i] * m).sum() / m.sum())
    loss = 0.0
    for i in range(B):
        mates = [j for j in range(B) if b.group_ids[j] == b.group_ids[i] and j != i]
        a = r[i] - sum(r[j] for j in mates) / len(mates)  # RLOO
        y = float(b.scores[i])
        w = 1.0
        labels = [float(b.scores[j]) for j in range(B) if b.group_ids[j] == b.group_ids[i]]
        if weighted and 0 < sum(labels) < len(labels):
            n_c = sum(1 for v in labels if v == y)
            w = len(labels) / (2 * n_c)
        loss = loss + w * (torch.nn.functional.softplus(a) - y * a)  # BCE with logits
    return loss / B


@pytest.mark.parametrize("method", ["1", "2"])
@pytest.mark.parametrize("weight_mode", ["question", "none"])
def test_pacs_objective_is_the_papers_loss(method, weight_mode):
    b, logp = batch(1)
    obj = PACSObjective(
        PACSConfig(beta=0.7, reward_method=method, estimator="rloo", weight_mode=weight_mode),
        AlgorithmConfig(name="pacs"),
    )
    obj.check(b)
    loss, stats = obj(logp, None, b)
    (g,) = torch.autograd.grad(loss, logp)
    logp2 = logp.detach().clone().requires_grad_(True)
    want = loop_pacs(logp2, b, 0.7, method, weight_mode == "question")
    (g2,) = torch.autograd.grad(want, logp2)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert stats["pacs/loss"] == pytest.approx(want.item(), rel=1e-5)
    torch.testing.assert_close(g, g2, atol=1e-6, rtol=1e-4)
    assert obj.whole_groups and obj.agg == "sample-mean"


def test_pacs_logits_are_the_bce_inputs():
    b, logp = batch(2)
    obj = PACSObjective(PACSConfig(beta=2.0, reward_method="1", estimator="rloo"), AlgorithmConfig(name="pacs"))
    a = obj.logits(logp.detach(), b.old_logprobs, b.response_mask, b.group_ids)
    r = 2.0 * ((logp.detach() - b.old_logprobs) * b.response_mask).sum(-1)
    for i in range(len(b)):
        mates = [j for j in range(len(b)) if b.group_ids[j] == b.group_ids[i] and j != i]
        assert a[i].item() == pytest.approx((r[i] - r[mates].mean()).item(), abs=1e-5)
    # At the behaviour policy the ratio score is 0 for every sample: the BCE sees logit 0.
    a0 = obj.logits(b.old_logprobs, b.old_logprobs, b.response_mask, b.group_ids)
    assert torch.count_nonzero(a0) == 0


def test_pacs_kl_term_only_when_configured():
    b, logp = batch(3)
    b.ref_logprobs = b.old_logprobs - 0.05 * b.response_mask
    no_kl = PACSObjective(PACSConfig(), AlgorithmConfig(name="pacs", kl_coef=0.0))
    with_kl = PACSObjective(PACSConfig(), AlgorithmConfig(name="pacs", kl_coef=0.5))
    l0, s0 = no_kl(logp, None, b)
    l1, s1 = with_kl(logp, None, b)
    assert "kl/mean" not in s0 and s1["kl/mean"] > 0
    assert l1.item() == pytest.approx(l0.item() + 0.5 * s1["kl/mean"], rel=1e-5)
    b.ref_logprobs = None
    with pytest.raises(ValueError, match="kl_coef"):
        with_kl.check(b)


def test_objectives_name_what_the_batch_lacks():
    b, _ = batch(4)
    with pytest.raises(ValueError, match="advantages"):
        PPOObjective(AlgorithmConfig()).check(b)
    b.scores = None
    with pytest.raises(ValueError, match="scores"):
        PACSObjective(PACSConfig(), AlgorithmConfig(name="pacs")).check(b)


def loop_ppo_tis(logp, old, rollout, adv, mask, clip, clip_c, cap):
    """verl's compute_policy_loss_vanilla with tis_imp_ratio_cap, token by token, token-mean."""
    total, n = 0.0, 0.0
    B, R = mask.shape
    for i in range(B):
        for t in range(R):
            if mask[i, t] == 0:
                continue
            a = float(adv[i])
            r = torch.exp(logp[i, t] - old[i, t])
            pg = torch.maximum(-a * r, -a * r.clamp(1 - clip, 1 + clip))
            if a < 0:
                pg = torch.minimum(pg, torch.tensor(-a * clip_c))
            w = min(math.exp(float(old[i, t] - rollout[i, t])), cap)  # a constant: no gradient
            total = total + pg * w
            n += 1
    return total / n


def test_tis_weights_and_the_weighted_loss_are_verls():
    b, logp = batch(5)
    g = torch.Generator().manual_seed(7)
    b.rollout_logprobs = (b.old_logprobs + 0.2 * torch.randn(b.old_logprobs.shape, generator=g)) * b.response_mask
    b.advantages = torch.randn(len(b), generator=g)
    cap = 1.1
    w, stats = tis_weights(b.old_logprobs, b.rollout_logprobs, b.response_mask, cap)
    raw = torch.exp(b.old_logprobs - b.rollout_logprobs)
    m = b.response_mask.bool()
    torch.testing.assert_close(w[m], raw[m].clamp(max=cap))
    assert torch.count_nonzero(w[~m]) == 0 and not w.requires_grad
    assert stats["tis/weight_mean"] == pytest.approx(raw[m].clamp(max=cap).mean().item(), rel=1e-6)
    assert 0 < stats["tis/clipped_frac"] < 1
    assert stats["tis/clipped_frac"] == pytest.approx((raw[m] > cap).float().mean().item())

    algo = AlgorithmConfig(clip_low=0.2, clip_high=0.2, clip_c=3.0, tis_cap=cap)
    obj = PPOObjective(algo)
    obj.check(b)
    loss, out = obj(logp, None, b)
    (grad,) = torch.autograd.grad(loss, logp)
    logp2 = logp.detach().clone().requires_grad_(True)
    want = loop_ppo_tis(logp2, b.old_logprobs, b.rollout_logprobs, b.advantages, b.response_mask, 0.2, 3.0, cap)
    (grad2,) = torch.autograd.grad(want, logp2)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(grad, grad2, atol=1e-6, rtol=1e-4)
    assert out["tis/weight_mean"] == stats["tis/weight_mean"]
    # The clip statistics are those of the unweighted loss (verl weights after clipping).
    _, plain = PPOObjective(AlgorithmConfig(clip_low=0.2, clip_high=0.2, clip_c=3.0))(logp, None, b)
    assert out["actor/clipfrac"] == plain["actor/clipfrac"] and out["actor/approx_kl"] == plain["actor/approx_kl"]
    assert "tis/weight_mean" not in plain
    b.rollout_logprobs = None
    with pytest.raises(ValueError, match="rollout_logprobs"):
        obj.check(b)


def test_seq_mean_token_sum_norm_divides_by_a_constant():
    b, logp = batch(6, R=5)
    b.advantages = torch.randn(len(b), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="loss_scale_factor"):
        PPOObjective(AlgorithmConfig(loss_agg="seq-mean-token-sum-norm"))
    by_arg = PPOObjective(AlgorithmConfig(loss_agg="seq-mean-token-sum-norm", clip_low=0.2, clip_high=0.2), 16.0)
    by_cfg = PPOObjective(
        AlgorithmConfig(loss_agg="seq-mean-token-sum-norm", clip_low=0.2, clip_high=0.2, loss_scale_factor=16.0), 99.0
    )  # the config wins
    plain = PPOObjective(AlgorithmConfig(loss_agg="seq-mean-token-sum", clip_low=0.2, clip_high=0.2))
    l16, _ = by_arg(logp, None, b)
    lcfg, _ = by_cfg(logp, None, b)
    lsum, _ = plain(logp, None, b)
    # mean over sequences of token sums, / 16 -- not / 5 (the batch's padded response length)
    assert l16.item() == pytest.approx(lsum.item() / 16.0, rel=1e-6)
    assert lcfg.item() == l16.item()
