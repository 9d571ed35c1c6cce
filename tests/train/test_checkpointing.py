"""Activation checkpointing (trainer.gradient_checkpointing): the same loss and gradients as
without it, in the policy update (1 and 2 FSDP2 processes, shared prompts, packed micro-batches),
SFT with a token budget, and the value critic; the layers really run twice and keep less."""

import dataclasses

import pytest
import torch
from test_actor import ALGO, UPDATE, _save_grads, make_batch, make_grouped_batch

from fastcrit.config import OptimConfig, PPOConfig
from fastcrit.train.actor import build_actor, sft_step, update_policy
from fastcrit.train.dist import all_reduce_mean, launch


def _count_mlp_calls(actor) -> list[int]:
    """A counter of the decoder layers' MLP calls: the recompute of a checkpointed layer calls its
    submodules again (the layer's own forward hooks, e.g. FSDP2's, run once)."""
    calls = [0]
    for layer in actor.module.base.layers:
        layer.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _update(ctx, path, ckpt, out_file, rank_slice=False, share=False, max_tokens=0, packed=False):
    torch.manual_seed(0)
    actor = build_actor(
        path,
        dtype="float32",
        device=ctx.device,
        world_size=ctx.world_size,
        optim=OptimConfig(lr=1e-2),
        checkpointing=ckpt,
        share_prompts=share,
    )
    calls = _count_mlp_calls(actor)
    b = make_grouped_batch(4) if share else make_batch(1, equal_halves=not max_tokens)
    if rank_slice:
        half = len(b) // ctx.world_size
        b = b.select(torch.arange(ctx.rank * half, (ctx.rank + 1) * half))
    stats = all_reduce_mean(
        update_policy(actor, b, ALGO, micro_batch_size=3, max_tokens=max_tokens, packed=packed, **UPDATE)
    )
    _save_grads(ctx, actor, {**stats, "mlp_calls": calls[0]}, out_file)


def _same(a, b):
    for k in ("loss/policy", "kl/mean", "actor/entropy", "actor/grad_norm"):
        assert b["stats"][k] == pytest.approx(a["stats"][k], rel=1e-5, abs=1e-7), k
    for n in a["params"]:
        torch.testing.assert_close(b["params"][n], a["params"][n], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("world", [1, 2])
def test_checkpointed_update_equals_the_plain_one(tiny_model_path, tmp_path, world):
    off, on = str(tmp_path / "off.pt"), str(tmp_path / "on.pt")
    launch(_update, (tiny_model_path, False, off, world > 1), world, "cpu")
    launch(_update, (tiny_model_path, True, on, world > 1), world, "cpu")
    a, b = torch.load(off), torch.load(on)
    _same(a, b)
    # every layer ran again in the backward: twice the MLP calls of the plain update
    assert b["stats"]["mlp_calls"] == 2 * a["stats"]["mlp_calls"] > 0


def test_checkpointing_with_shared_prompts_and_packed_micro_batches(tiny_model_path, tmp_path):
    """Under checkpointing a training forward runs its rows whole (the recompute would write the
    shared KV cache twice): the update is the one shared prompts give without checkpointing.
    Packed micro-batches (no padding) are checkpointed like padded ones."""
    runs = {k: str(tmp_path / f"{k}.pt") for k in ("shared", "shared_ckpt", "packed", "packed_ckpt")}
    launch(_update, (tiny_model_path, False, runs["shared"], False, True), 1, "cpu")
    launch(_update, (tiny_model_path, True, runs["shared_ckpt"], False, True), 1, "cpu")
    launch(_update, (tiny_model_path, False, runs["packed"], False, False, 24, True), 1, "cpu")
    launch(_update, (tiny_model_path, True, runs["packed_ckpt"], False, False, 24, True), 1, "cpu")
    got = {k: torch.load(v) for k, v in runs.items()}
    _same(got["shared"], got["shared_ckpt"])
    _same(got["packed"], got["packed_ckpt"])
    assert got["packed_ckpt"]["stats"]["mlp_calls"] == 2 * got["packed"]["stats"]["mlp_calls"]


def _saved_bytes(ctx, path, out):
    """Bytes autograd keeps for the backward outside checkpoints, for one forward, on and off."""
    b = make_batch(1)
    res = {}
    for ckpt in (False, True):
        actor = build_actor(
            path, dtype="float32", device=ctx.device, world_size=1, optim=OptimConfig(lr=1e-2), checkpointing=ckpt
        )
        seen: dict[int, int] = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            actor.module(b.input_ids, b.attention_mask, b.position_ids, b.responses, b.response_mask)
        params = {p.untyped_storage().data_ptr() for p in actor.module.parameters()}
        res[ckpt] = sum(v for k, v in seen.items() if k not in params)
    torch.save(res, out)


def test_checkpointed_forward_keeps_less_for_the_backward(tiny_model_path, tmp_path):
    out = str(tmp_path / "saved.pt")
    launch(_saved_bytes, (tiny_model_path, out), 1, "cpu")
    res = torch.load(out)
    assert 0 < res[True] < 0.5 * res[False]


def _sft(ctx, path, ckpt, max_tokens, out_file):
    torch.manual_seed(0)
    actor = build_actor(
        path,
        dtype="float32",
        device=ctx.device,
        world_size=ctx.world_size,
        optim=OptimConfig(lr=1e-2),
        checkpointing=ckpt,
    )
    b = make_batch(5)
    if ctx.world_size > 1:
        half = len(b) // ctx.world_size
        b = b.select(torch.arange(ctx.rank * half, (ctx.rank + 1) * half))
    stats = all_reduce_mean(sft_step(actor, b, micro_batch_size=3, grad_clip=1.0, max_tokens=max_tokens))
    _save_grads(ctx, actor, stats, out_file)


@pytest.mark.parametrize("world", [1, 2])
def test_sft_with_checkpointing_and_a_token_budget_equals_plain_sft(tiny_model_path, tmp_path, world):
    runs = [str(tmp_path / f"{i}.pt") for i in range(3)]
    launch(_sft, (tiny_model_path, False, 0, runs[0]), world, "cpu")
    launch(_sft, (tiny_model_path, True, 0, runs[1]), world, "cpu")
    launch(_sft, (tiny_model_path, True, 20, runs[2]), world, "cpu")
    base, *others = [torch.load(r) for r in runs]
    assert base["stats"]["sft/grad_norm"] > 0
    for o in others:
        assert o["stats"]["sft/nll"] == pytest.approx(base["stats"]["sft/nll"], rel=1e-5)
        for n in base["params"]:
            torch.testing.assert_close(o["params"][n], base["params"][n], atol=1e-6, rtol=1e-4)


def _critic(ctx, path, ckpt, out_file):
    from fastcrit.train.value import build_value_actor, update_values

    torch.manual_seed(0)
    actor = build_value_actor(
        path, dtype="float32", device=ctx.device, world_size=1, optim=OptimConfig(lr=1e-2), checkpointing=ckpt
    )
    b = make_batch(6)
    g = torch.Generator().manual_seed(1)
    b.values = torch.randn(b.response_mask.shape, generator=g) * b.response_mask
    b.returns = torch.randn(b.response_mask.shape, generator=g) * b.response_mask
    stats = update_values(actor, b, dataclasses.replace(ALGO), PPOConfig(), micro_batch_size=3, grad_clip=1.0)
    torch.save({"stats": stats, "params": {n: p.grad.clone() for n, p in actor.module.lm.named_parameters()}}, out_file)


def test_checkpointed_value_critic_equals_the_plain_one(tiny_model_path, tmp_path):
    off, on = str(tmp_path / "off.pt"), str(tmp_path / "on.pt")
    launch(_critic, (tiny_model_path, False, off), 1, "cpu")
    launch(_critic, (tiny_model_path, True, on), 1, "cpu")
    a, b = torch.load(off), torch.load(on)
    assert b["stats"]["critic/value_loss"] == pytest.approx(a["stats"]["critic/value_loss"], rel=1e-6)
    for n in a["params"]:
        torch.testing.assert_close(b["params"][n], a["params"][n], atol=1e-6, rtol=1e-4)
