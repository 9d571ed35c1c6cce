import copy

import pytest
import torch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Qwen2 (2 layers, hidden 64, MLP 160, vocab 300) for the CPU patch tests."""
    from fastcrit.models.tiny import build_tiny_model
    from fastcrit.models.tokenizer import default_corpus

    d = str(tmp_path_factory.mktemp("tiny") / "m")
    return build_tiny_model(
        d,
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        intermediate=160,
        vocab_size=300,
        seed=3,
        corpus=default_corpus(use_human_eval=False),
    )


@pytest.fixture
def patched_matches_copy():
    """check(lm, patch) -> the number ``patch(lm)`` returned, after checking that the patched
    model's logits (with and without gradients) and every parameter's gradient of a log-prob sum
    equal those of an unpatched copy made first, in fp32; and that the patch went per instance
    (no class's ``forward`` changed)."""

    def check(lm, patch):
        ref = copy.deepcopy(lm)
        classes = {type(m): type(m).forward for m in lm.modules()}
        n = patch(lm)
        assert all(c.forward is f for c, f in classes.items())
        ids = torch.randint(0, lm.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(1))
        outs = []
        for m in (lm, ref):
            logits = m(input_ids=ids).logits
            torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None].roll(1, 1)).sum().backward()
            with torch.no_grad():
                frozen = m(input_ids=ids).logits
            outs.append((logits.detach(), frozen, {k: p.grad for k, p in m.named_parameters()}))
        (ours, ours_frozen, ours_grads), (want, want_frozen, want_grads) = outs
        torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours_frozen, want_frozen, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours_frozen, ours, atol=1e-5, rtol=1e-5)
        for name, grad in want_grads.items():
            torch.testing.assert_close(ours_grads[name], grad, atol=1e-5, rtol=1e-4, msg=lambda s, k=name: f"{k}: {s}")
        return n

    return check
