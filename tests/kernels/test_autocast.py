"""The fused kernels inside a caller's autocast region (a bf16 training loop that imports them):
they choose their own compute precision from their inputs, so autocast changes nothing, forward or
backward, and a bf16 hidden state against an fp32 head (what an autocast model hands over) works."""

import pytest
import torch

from fastcrit_kernels import fused_linear_pacs_loss, fused_linear_ppo_loss, fused_logprobs

B, T, H, V = 3, 5, 16, 40


def _inputs():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(B, T, H, generator=g)
    w = torch.randn(V, H, generator=g) / 4
    lab = torch.randint(0, V, (B, T), generator=g)
    old = torch.randn(B, T, generator=g) - 3
    adv = torch.randn(B, T, generator=g)
    mask = torch.ones(B, T)
    mask[2, 3:] = 0
    return h, w, lab, old, adv, mask


LOSSES = {
    "fused_logprobs": lambda h, w, lab, old, adv, m: (fused_logprobs(h, w, lab, return_entropy=True)[0] * m).sum(),
    "fused_linear_ppo_loss": lambda h, w, lab, old, adv, m: fused_linear_ppo_loss(
        h, w, lab, old, adv, m, ref_logp=old, kl_coef=0.1
    )[0],
    "fused_linear_pacs_loss": lambda h, w, lab, old, adv, m: fused_linear_pacs_loss(
        h, w, lab, old, torch.tensor([1.0, 0.0, 1.0]), m, torch.tensor([0, 0, 1])
    )[0],
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_autocast_changes_nothing(name):
    h, w, lab, old, adv, m = _inputs()
    f = LOSSES[name]

    def run(hidden, autocast):
        hh, ww = hidden.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = f(hh, ww, lab, old, adv, m)
        loss.backward()
        return loss, hh.grad, ww.grad

    plain, under = run(h, False), run(h, True)
    assert under[0].dtype == torch.float32
    for a, b in zip(plain, under):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    # an autocast model's bf16 hidden state against its fp32 head: computed in fp32 from the
    # bf16 values, the same as feeding those values in fp32
    hb = h.to(torch.bfloat16)
    mixed, ref = run(hb, True), run(hb.float(), False)
    assert mixed[1].dtype == torch.bfloat16
    torch.testing.assert_close(mixed[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mixed[2], ref[2], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mixed[1].float(), ref[1], rtol=2e-2, atol=2e-2)
