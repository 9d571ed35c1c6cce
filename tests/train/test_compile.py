"""trainer.compile: decoder layers through torch.compile (Inductor, dynamic shapes) give the update
and the forward-only passes eager gives, to fp32 rounding; the graphs really ran, and a third
batch of other shapes compiles no new graph."""

import pytest
import torch
from test_actor import ALGO, UPDATE, make_batch, make_grouped_batch

from fastcrit.config import OptimConfig
from fastcrit.train.actor import build_actor, compute_logprobs, update_policy
from fastcrit.train.policy import compile_stats


def _grads(actor) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in actor.module.lm.named_parameters() if p.grad is not None}


def _run(path, compile: bool, batches, share: bool):
    """Per batch, from the same starting weights (reloaded: Adam's first step is ~lr * sign(grad),
    which would turn rounding into lr-sized differences): the forward-only log-probs, then the
    update's stats and gradients."""
    torch.manual_seed(0)
    kw = dict(dtype="float32", device=torch.device("cpu"), world_size=1, share_prompts=share, compile=compile)
    actor = build_actor(path, optim=OptimConfig(lr=1e-2), **kw)
    start = {k: v.clone() for k, v in actor.module.state_dict().items()}
    out = []
    for b in batches:
        actor.module.load_state_dict(start)
        logp = compute_logprobs(actor, b, 0.7, micro_batch_size=8)
        stats = update_policy(actor, b, ALGO, micro_batch_size=4, **UPDATE)
        out.append((stats, _grads(actor), logp))
    return out


def test_compiled_layers_give_eager_updates_and_logprobs(tiny_model_path):
    """Rows run whole, then shared prompts: the prompt-sharing passes call the layers with a KV
    cache, which run eager (compile_layers), and a group of one falls back to rows run whole."""
    torch._dynamo.reset()
    graphs = 0
    for share, make in ((False, make_batch), (True, make_grouped_batch)):
        batches = [make(1), make(2), make(3)]  # different prompt and response lengths
        eager = _run(tiny_model_path, False, batches, share)
        assert compile_stats().get("compile/graphs", 0) == graphs
        compiled = _run(tiny_model_path, True, batches[:2], share)
        first = compile_stats()
        if not share:  # a training graph and a forward-only one at least
            assert first["compile/graphs"] >= 2
        assert first["compile/time_s"] > 0
        assert first["compile/graphs"] <= 4  # one row or more, with gradients or without
        # a third batch of new shapes, on a new model instance, reuses the graphs: dynamic shapes
        compiled += _run(tiny_model_path, True, batches[2:], share)
        graphs = compile_stats()["compile/graphs"]
        assert graphs == first["compile/graphs"]
        for (sa, ga, la), (sb, gb, lb) in zip(eager, compiled):
            for k in ("loss/policy", "kl/mean", "actor/grad_norm"):
                assert sb[k] == pytest.approx(sa[k], rel=1e-5, abs=1e-6), k
            assert ga.keys() == gb.keys()
            for n in ga:
                torch.testing.assert_close(gb[n], ga[n], atol=1e-5, rtol=1e-4, msg=n)
            torch.testing.assert_close(lb, la, atol=1e-5, rtol=1e-5)
