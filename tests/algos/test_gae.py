"""GAE and whitening against loops written from the definitions."""

import pytest
import torch

from fastcrit.algos.advantages import gae, masked_whiten


def loop_gae(r, v, m, gamma, lam):
    """Per row: GAE over the valid tokens only (masked tokens are not steps), 0 after the last."""
    B, R = r.shape
    adv = torch.zeros(B, R)
    for b in range(B):
        idx = [t for t in range(R) if m[b, t] > 0]
        last = 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            nv = v[b, idx[k + 1]] if k + 1 < len(idx) else 0.0
            delta = r[b, t] + gamma * nv - v[b, t]
            last = delta + gamma * lam * last
            adv[b, t] = last
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_the_definition_with_holes_in_the_mask(gamma, lam):
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g)
    m = torch.ones(4, 7)
    m[0, 5:] = 0  # padding at the end
    m[1, 2] = 0  # a hole (e.g. a tool observation)
    m[2, :] = 0  # an empty row
    adv, ret = gae(r, v, m, gamma=gamma, lam=lam)
    want = loop_gae(r, v, m, gamma, lam)
    torch.testing.assert_close(adv, want * m, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, (want + v) * m, atol=1e-5, rtol=1e-5)


def test_gae_with_gamma_lam_1_is_reward_to_go_minus_value():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.2, 0.5, 0.7]])
    adv, ret = gae(r, v, torch.ones(1, 3), gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.8, 0.5, 0.3]]))
    torch.testing.assert_close(ret, torch.ones(1, 3))


def oracle_whiten(x, m):
    """Mean and unbiased variance of the valid entries, in Python floats; 0 on the others."""
    vals = [float(v) for v, k in zip(x.flatten(), m.flatten()) if k > 0]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return torch.tensor(
        [
            [(float(v) - mean) / (var + 1e-8) ** 0.5 if k > 0 else 0.0 for v, k in zip(row, mrow)]
            for row, mrow in zip(x, m)
        ]
    )


def whitening_batch():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, generator=g) * 2 + 1
    x[3:] += 4.0  # the second half sits elsewhere: whitening each half alone would differ
    m = (torch.rand(6, 5, generator=g) > 0.3).float()
    m[0] = 0  # an empty row
    return x, m


def test_masked_whiten_matches_the_definition():
    x, m = whitening_batch()
    torch.testing.assert_close(masked_whiten(x, m), oracle_whiten(x, m), atol=1e-6, rtol=1e-6)


def _whiten_my_half(ctx, x, m, out):
    from fastcrit.train.dist import all_reduce

    rows = slice(0, 3) if ctx.rank == 0 else slice(3, 6)
    torch.save(masked_whiten(x[rows], m[rows], all_sum=all_reduce), f"{out}/rank{ctx.rank}.pt")


def test_whitening_over_two_processes_is_the_whole_batchs(tmp_path):
    """Each of 2 gloo ranks holds half the rows: with all_sum, the mean and variance are the whole
    batch's (verl whitens the whole batch), not each half's."""
    from fastcrit.train.dist import launch

    x, m = whitening_batch()
    launch(_whiten_my_half, (x, m, str(tmp_path)), 2, "cpu")
    got = torch.cat([torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")])
    torch.testing.assert_close(got, oracle_whiten(x, m), atol=1e-6, rtol=1e-6)
    per_half = torch.cat([masked_whiten(x[:3], m[:3]), masked_whiten(x[3:], m[3:])])
    assert (per_half - got).abs().max() > 0.1


def test_masked_whiten():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, 5.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    w = masked_whiten(x, m)
    vals = w[m > 0]
    assert vals.mean().abs() < 1e-6 and vals.std().item() == pytest.approx(1.0, abs=1e-4)
    assert w[0, 2] == 0.0
