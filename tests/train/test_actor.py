"""The FSDP2 actor: log-probs equal a plain Hugging Face forward; micro-batching and 2 processes
change nothing but the schedule."""

import dataclasses
import json
import os

import pytest
import torch

from fastcrit.config import AlgorithmConfig, OptimConfig
from fastcrit.rollout.batch import collate
from fastcrit.train.actor import balance_ranks, build_actor, compute_logprobs, lr_factor, update_policy
from fastcrit.train.dist import all_reduce_mean, launch
from fastcrit.types import Rollout, RolloutBatch

ALGO = AlgorithmConfig(
    clip_low=0.2,
    clip_high=0.28,
    clip_c=3.0,
    loss_agg="token-mean",
    kl_coef=0.1,
    kl_kind="low_var_kl",
    entropy_coef=0.01,
)
UPDATE = dict(temperature=0.7, grad_clip=1.0)


def make_batch(seed: int, B: int = 8, equal_halves: bool = False):
    g = torch.Generator().manual_seed(seed)
    rs = []
    for i in range(B):
        p = torch.randint(3, 200, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        o_len = 4 if equal_halves else int(torch.randint(1, 6, (1,), generator=g))
        o = torch.randint(3, 200, (o_len,), generator=g).tolist()
        lp = (-torch.rand(o_len, generator=g) * 3).tolist()
        rs.append(Rollout(i // 2, p, o, lp, "stop"))
    b = collate(rs, pad_id=0)
    b.advantages = torch.randn(B, generator=g)[:, None] * b.response_mask
    b.ref_logprobs = b.old_logprobs - 0.1 * torch.rand(b.old_logprobs.shape, generator=g) * b.response_mask
    return b


def _logprobs_match_hf(ctx, path):
    from fastcrit.models.hf import load_model

    actor = build_actor(path, dtype="float32", device=ctx.device, world_size=1)
    b = make_batch(0)
    got = compute_logprobs(actor, b, temperature=0.7, micro_batch_size=3)
    lm = load_model(path)
    with torch.no_grad():
        logits = lm(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits.float()
    R = b.responses.shape[1]
    lp = torch.log_softmax(logits[:, -R - 1 : -1] / 0.7, -1).gather(-1, b.responses[..., None])[..., 0]
    torch.testing.assert_close(got, lp * b.response_mask, atol=1e-4, rtol=1e-4)


def test_actor_logprobs_equal_a_plain_forward(tiny_model_path):
    launch(_logprobs_match_hf, (tiny_model_path,), 1, "cpu")


def _grads_after_update(
    ctx, path, micro, out_file, rank_slice, algo=ALGO, equal_halves=True, max_tokens=0, packed=False
):
    torch.manual_seed(0)
    actor = build_actor(path, dtype="float32", device=ctx.device, world_size=ctx.world_size, optim=OptimConfig(lr=1e-2))
    b = make_batch(1, equal_halves=equal_halves)
    if rank_slice:
        half = len(b) // ctx.world_size
        b = b.select(torch.arange(ctx.rank * half, (ctx.rank + 1) * half))
    stats = all_reduce_mean(
        update_policy(actor, b, algo, micro_batch_size=micro, max_tokens=max_tokens, packed=packed, **UPDATE)
    )
    _save_grads(ctx, actor, stats, out_file)


def _save_grads(ctx, actor, stats, out_file) -> None:
    """The full gradients (gathered from the shards) and ``stats``, saved by rank 0. Gradients, not
    Adam's first step: that is ~lr * sign(grad), which turns rounding noise in a near-zero gradient
    into a full lr-sized difference."""
    full = {
        n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
        for n, p in actor.module.lm.named_parameters()
    }
    if ctx.is_main:
        torch.save({"params": full, "stats": stats}, out_file)


def test_micro_batches_give_the_same_update(tiny_model_path, tmp_path):
    a, b = str(tmp_path / "a.pt"), str(tmp_path / "b.pt")
    launch(_grads_after_update, (tiny_model_path, 8, a, False), 1, "cpu")
    launch(_grads_after_update, (tiny_model_path, 3, b, False), 1, "cpu")
    pa, pb = torch.load(a), torch.load(b)
    assert pa["stats"]["actor/grad_norm"] > 0
    assert pa["stats"]["loss/policy"] == pytest.approx(pb["stats"]["loss/policy"], abs=1e-5)
    for n in pa["params"]:
        torch.testing.assert_close(pa["params"][n], pb["params"][n], atol=1e-6, rtol=1e-4)


def test_token_budget_micro_batches_give_the_same_update_with_less_padding(tiny_model_path, tmp_path):
    """Micro-batches cut by a token budget (longest rows first, each cut to its own longest row)
    give the whole-batch loss and gradients, with less padding than the batch padded as one."""
    a, b = str(tmp_path / "a.pt"), str(tmp_path / "b.pt")
    launch(_grads_after_update, (tiny_model_path, 8, a, False, ALGO, False), 1, "cpu")
    launch(_grads_after_update, (tiny_model_path, 8, b, False, ALGO, False, 24), 1, "cpu")
    pa, pb = torch.load(a), torch.load(b)
    assert pb["stats"]["loss/policy"] == pytest.approx(pa["stats"]["loss/policy"], abs=1e-6)
    assert pb["stats"]["actor/grad_norm"] == pytest.approx(pa["stats"]["actor/grad_norm"], rel=1e-5)
    for n in pa["params"]:
        torch.testing.assert_close(pb["params"][n], pa["params"][n], atol=1e-6, rtol=1e-4)
    assert "batch/pad_frac" not in pa["stats"]
    assert pb["stats"]["batch/pad_frac"] < pb["stats"]["batch/pad_frac_padded"]
    assert pb["stats"]["batch/imbalance"] == 1.0  # one rank


def test_packed_micro_batches_give_the_same_update_without_padding(tiny_model_path, tmp_path):
    a, b = str(tmp_path / "a.pt"), str(tmp_path / "b.pt")
    launch(_grads_after_update, (tiny_model_path, 8, a, False, ALGO, False), 1, "cpu")
    launch(_grads_after_update, (tiny_model_path, 8, b, False, ALGO, False, 24, True), 1, "cpu")
    pa, pb = torch.load(a), torch.load(b)
    for k in ("loss/policy", "kl/mean", "actor/entropy", "actor/grad_norm"):
        assert pb["stats"][k] == pytest.approx(pa["stats"][k], rel=1e-5, abs=1e-6), k
    for n in pa["params"]:
        torch.testing.assert_close(pb["params"][n], pa["params"][n], atol=1e-6, rtol=1e-4)
    assert pb["stats"]["batch/pad_frac"] == 0.0 < pb["stats"]["batch/pad_frac_padded"]


def _token_budget_logprobs(ctx, path):
    actor = build_actor(path, dtype="float32", device=ctx.device, world_size=1)
    b = make_batch(3)
    rows = compute_logprobs(actor, b, 0.7, micro_batch_size=8)
    budget = compute_logprobs(actor, b, 0.7, micro_batch_size=8, max_tokens=20)
    torch.testing.assert_close(budget, rows, atol=1e-5, rtol=1e-5)
    assert budget.shape == rows.shape and (budget[b.response_mask == 0] == 0).all()
    # packed: the rows end to end, positions restarting, a block-causal mask instead of padding
    packed = compute_logprobs(actor, b, 0.7, micro_batch_size=8, max_tokens=24, packed=True)
    torch.testing.assert_close(packed, rows, atol=1e-5, rtol=1e-5)
    assert (packed[b.response_mask == 0] == 0).all()


def test_token_budget_logprobs_equal_the_padded_ones(tiny_model_path):
    launch(_token_budget_logprobs, (tiny_model_path,), 1, "cpu")


def _uneven_ranks(ctx, path, out_file, balance=False):
    """Rank 0 holds long rows, rank 1 short ones: their token budgets give different numbers of
    micro-batches until the ranks agree (or FSDP's gathers would hang). With ``balance``, the rows
    first move between the ranks by work."""
    torch.manual_seed(0)
    actor = build_actor(path, dtype="float32", device=ctx.device, world_size=ctx.world_size, optim=OptimConfig(lr=1e-2))
    b = make_batch(1)
    order = torch.argsort(b.attention_mask.sum(-1), descending=True, stable=True)
    if ctx.world_size == 2:
        b = b.select(order[:4] if ctx.rank == 0 else order[4:]).trimmed()
    moved = {}
    if balance:
        b, moved = balance_ranks(b, whole_groups=False)
    stats = all_reduce_mean({**moved, **update_policy(actor, b, ALGO, micro_batch_size=8, max_tokens=12, **UPDATE)})
    lm = actor.module.lm
    if lm.config.tie_word_embeddings:  # also on rank 1, whose module was built on the meta device
        assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
    _save_grads(ctx, actor, stats, out_file)


def test_token_budget_ranks_agree_on_micro_batches_and_match_one_process(tiny_model_path, tmp_path):
    one, two = str(tmp_path / "one.pt"), str(tmp_path / "two.pt")
    launch(_uneven_ranks, (tiny_model_path, one), 1, "cpu")
    launch(_uneven_ranks, (tiny_model_path, two), 2, "cpu")
    p1, p2 = torch.load(one), torch.load(two)
    assert p2["stats"]["loss/policy"] == pytest.approx(p1["stats"]["loss/policy"], rel=1e-5, abs=1e-7)
    for n in p1["params"]:
        torch.testing.assert_close(p2["params"][n], p1["params"][n], atol=1e-6, rtol=1e-4)
    assert p2["stats"]["batch/imbalance"] > 1.0  # the long rows sit on rank 0


def test_rows_moved_between_ranks_by_work_give_the_same_update_and_even_ranks(tied_tiny_model_path, tmp_path):
    """Also with tied embeddings (Qwen2.5-0.5B's and 1.5B's): the lm_head stays the embedding on a
    rank that built its module on the meta device and took its shards from rank 0, and the tied
    weight's gradient (both uses) is one process's."""
    tied = tied_tiny_model_path
    assert json.load(open(os.path.join(tied, "config.json")))["tie_word_embeddings"] is True
    one, two = str(tmp_path / "one.pt"), str(tmp_path / "two.pt")
    launch(_uneven_ranks, (tied, one), 1, "cpu")
    launch(_uneven_ranks, (tied, two, True), 2, "cpu")
    p1, p2 = torch.load(one), torch.load(two)
    assert p2["stats"]["loss/policy"] == pytest.approx(p1["stats"]["loss/policy"], rel=1e-5, abs=1e-7)
    for n in p1["params"]:
        torch.testing.assert_close(p2["params"][n], p1["params"][n], atol=1e-6, rtol=1e-4)
    assert p2["stats"]["batch/imbalance"] < p2["stats"]["batch/imbalance_before"]


def test_concat_repads_rows_of_different_widths():
    b = make_batch(4)
    order = torch.argsort(b.attention_mask.sum(-1), stable=True)
    short, long = b.select(order[:4]).trimmed(), b.select(order[4:]).trimmed()
    assert short.input_ids.shape[1] < b.input_ids.shape[1]
    back = RolloutBatch.concat([short, long])
    whole = b.select(order).trimmed()
    for name in ("prompts", "responses", "attention_mask", "response_mask", "old_logprobs", "advantages"):
        assert torch.equal(getattr(back, name), getattr(whole, name)), name
    assert torch.equal(back.position_ids * back.attention_mask, whole.position_ids * whole.attention_mask)
    short.ref_logprobs = None
    with pytest.raises(ValueError, match="ref_logprobs"):
        RolloutBatch.concat([short, long])


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
def test_two_fsdp_processes_give_the_one_process_update(tiny_model_path, tmp_path, agg):
    """2 gloo ranks with half the batch each == 1 rank with the whole batch, with different numbers
    of response tokens per rank: the loss is normalised by the count over all ranks (and
    seq-mean-token-sum-norm by a constant), not averaged over per-rank means."""
    b = make_batch(1)
    mask = b.response_mask
    assert mask[:4].sum() != mask[4:].sum()  # the ranks' halves hold different token counts
    assert mask.sum(-1).max() != 8  # ... and the constant is not the longest response
    algo = dataclasses.replace(ALGO, loss_agg=agg, loss_scale_factor=8.0)
    one, two = str(tmp_path / "one.pt"), str(tmp_path / "two.pt")
    launch(_grads_after_update, (tiny_model_path, 3, one, False, algo, False), 1, "cpu")
    launch(_grads_after_update, (tiny_model_path, 3, two, True, algo, False), 2, "cpu")
    p1, p2 = torch.load(one), torch.load(two)
    # The loss terms (aggregated by `agg`); token statistics such as the clip fraction are weighted
    # by the agg's unit too, so they agree only where that unit is the token.
    same = ("loss/policy", "kl/mean", "actor/entropy", "actor/grad_norm")
    for k in same + (("actor/clipfrac", "actor/approx_kl") if agg == "token-mean" else ()):
        assert p2["stats"][k] == pytest.approx(p1["stats"][k], rel=1e-5, abs=1e-7), k
    changed = 0
    for n in p1["params"]:
        torch.testing.assert_close(p2["params"][n], p1["params"][n], atol=1e-6, rtol=1e-4)
        changed += 1
    assert changed > 10


def _bf16_mixed_precision(ctx, path):
    actor = build_actor(path, dtype="bfloat16", device=ctx.device, world_size=1, optim=OptimConfig(lr=1e-3))
    assert all(p.dtype == torch.float32 for p in actor.module.parameters())  # fp32 masters
    assert actor.optimizer.defaults["fused"]  # fused AdamW on FSDP2's DTensor shards too
    ref = build_actor(path, dtype="float32", device=ctx.device, world_size=1)
    b = make_batch(2)
    lp16 = compute_logprobs(actor, b, 1.0, 8)
    lp32 = compute_logprobs(ref, b, 1.0, 8)
    assert lp16.dtype == torch.float32
    assert not torch.equal(lp16, lp32)  # really computed in bf16 ...
    torch.testing.assert_close(lp16, lp32, atol=0.1, rtol=0.05)  # ... and close to fp32
    stats = update_policy(actor, b, ALGO, micro_batch_size=8, **UPDATE)
    assert stats["actor/grad_norm"] > 0
    assert all(p.grad.dtype == torch.float32 for p in actor.module.parameters())


def test_bf16_policy_keeps_fp32_master_weights(tiny_model_path):
    launch(_bf16_mixed_precision, (tiny_model_path,), 1, "cpu")


def _attention_ops(actor, b, grad: bool) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.set_grad_enabled(grad):
        actor.module(b.input_ids, b.attention_mask, b.position_ids, b.responses, b.response_mask)
    return {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key}


def _bf16_trains_on_sdpa_math(ctx, path):
    b = make_batch(3)
    actor = build_actor(path, dtype="bfloat16", device=ctx.device, world_size=1, optim=OptimConfig(lr=1e-3))
    # a bf16 forward that builds a graph takes SDPA's math path (its CPU flash backward is slow in
    # bf16); one without a graph keeps flash attention, and so does fp32 training
    assert actor.module.math_attention_for_grad
    assert not any("flash" in k for k in _attention_ops(actor, b, grad=True))
    assert any("flash" in k for k in _attention_ops(actor, b, grad=False))
    fp32 = build_actor(path, dtype="float32", device=ctx.device, world_size=1, optim=OptimConfig(lr=1e-3))
    assert not fp32.module.math_attention_for_grad
    assert any("flash" in k for k in _attention_ops(fp32, b, grad=True))
    # the math path gives the flash path's log-probs and gradients, to bf16 rounding
    out = {}
    for flag in (True, False):
        actor.module.math_attention_for_grad = flag
        actor.module.zero_grad(set_to_none=True)
        lp = actor.module(b.input_ids, b.attention_mask, b.position_ids, b.responses, b.response_mask)
        (lp * b.response_mask).sum().backward()
        out[flag] = lp.detach(), [p.grad.full_tensor().clone() for p in actor.module.parameters()]
    torch.testing.assert_close(out[True][0], out[False][0], atol=0.05, rtol=0.02)
    for g1, g2 in zip(out[True][1], out[False][1]):
        torch.testing.assert_close(g1, g2, atol=0.05 * float(g2.abs().max()) + 1e-6, rtol=0.05)


def test_bf16_training_forward_runs_attention_on_sdpa_math(tiny_model_path):
    launch(_bf16_trains_on_sdpa_math, (tiny_model_path,), 1, "cpu")


def test_lr_schedule_warms_up_then_holds_or_follows_a_cosine():
    const = lr_factor(OptimConfig(warmup_steps=4), total_updates=20)
    assert [const(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0] and const(19) == 1.0
    cos = lr_factor(OptimConfig(warmup_steps=4, lr_schedule="cosine", min_lr_ratio=0.1), total_updates=20)
    got = [cos(s) for s in range(25)]
    assert got[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a > b for a, b in zip(got[4:20], got[5:21]))  # strictly down to the end
    assert got[12] == pytest.approx(0.55) and got[20] == pytest.approx(0.1) and got[24] == pytest.approx(0.1)
    flat = lr_factor(OptimConfig(lr_schedule="cosine"), total_updates=0)  # no length: nothing to decay
    assert flat(0) == flat(100) == 1.0


def _pacs_grads(ctx, path, micro, mini_batches, out_file):
    from fastcrit.algos.losses import PACSObjective
    from fastcrit.config import PACSConfig

    torch.manual_seed(0)
    actor = build_actor(path, dtype="float32", device=ctx.device, world_size=1, optim=OptimConfig(lr=1e-2))
    b = make_batch(3)  # 4 groups of 2
    b.scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    algo = AlgorithmConfig(mini_batches=mini_batches)
    objective = PACSObjective(PACSConfig(beta=0.5, reward_method="2", estimator="rloo"), algo)
    seen = []

    def recording(logp, ent, mb):
        seen.append(sorted(mb.group_ids.tolist()))
        return objective(logp, ent, mb)

    recording.agg, recording.whole_groups, recording.entropy = objective.agg, True, False
    recording.check = objective.check
    stats = update_policy(
        actor,
        b,
        algo,
        micro_batch_size=micro,
        objective=recording,
        generator=torch.Generator().manual_seed(0),
        **UPDATE,
    )
    grads = {n: p.grad.clone() for n, p in actor.module.lm.named_parameters()}
    torch.save({"grads": grads, "stats": stats, "seen": seen}, out_file)


def test_pacs_micro_batches_keep_whole_groups_and_give_the_same_update(tiny_model_path, tmp_path):
    a, b, c = (str(tmp_path / f"{x}.pt") for x in "abc")
    launch(_pacs_grads, (tiny_model_path, 8, 1, a), 1, "cpu")
    launch(_pacs_grads, (tiny_model_path, 3, 1, b), 1, "cpu")
    launch(_pacs_grads, (tiny_model_path, 3, 2, c), 1, "cpu")
    pa, pb, pc = torch.load(a), torch.load(b), torch.load(c)
    assert pa["seen"] == [[0, 0, 1, 1, 2, 2, 3, 3]]
    assert pb["seen"] == [[0, 0], [1, 1], [2, 2], [3, 3]]  # a group never splits across micro-batches
    assert all(len(s) == 2 and s[0] == s[1] for s in pc["seen"])  # ... nor across mini-batches
    assert pa["stats"]["pacs/loss"] == pytest.approx(pb["stats"]["pacs/loss"], abs=1e-6)
    assert pa["stats"]["actor/grad_norm"] > 0
    for n in pa["grads"]:
        torch.testing.assert_close(pa["grads"][n], pb["grads"][n], atol=1e-6, rtol=1e-4)


def make_grouped_batch(seed: int, n: int = 4):
    """Three prompts of different lengths with n samples each (a GRPO batch), then one prompt with
    a single sample: rows that share a prompt, left-padded prompts, right-padded responses."""
    g = torch.Generator().manual_seed(seed)
    rs = []
    for i, plen in enumerate((3, 6, 4, 5)):
        p = torch.randint(3, 200, (plen,), generator=g).tolist()
        for _ in range(n if i < 3 else 1):
            o_len = int(torch.randint(1, 6, (1,), generator=g))
            o = torch.randint(3, 200, (o_len,), generator=g).tolist()
            rs.append(Rollout(i, p, o, (-torch.rand(o_len, generator=g) * 3).tolist(), "stop"))
    b = collate(rs, pad_id=0)
    b.advantages = torch.randn(len(rs), generator=g)[:, None] * b.response_mask
    b.ref_logprobs = b.old_logprobs - 0.1 * torch.rand(b.old_logprobs.shape, generator=g) * b.response_mask
    return b


def _shared_prompts(ctx, path, share, out_file, rank_slice=False):
    torch.manual_seed(0)
    actor = build_actor(
        path,
        dtype="float32",
        device=ctx.device,
        world_size=ctx.world_size,
        optim=OptimConfig(lr=1e-2),
        share_prompts=share,
    )
    b = make_grouped_batch(4)
    if rank_slice:  # rank 0: the first two groups, rank 1: the rest
        b = b.select(torch.arange(0, 8) if ctx.rank == 0 else torch.arange(8, len(b)))
    logp = compute_logprobs(actor, b, 0.7, micro_batch_size=16)
    # micro-batches of 5 rows split groups: a micro-batch's rows that share a prompt still share it
    stats = all_reduce_mean(update_policy(actor, b, ALGO, micro_batch_size=5, **UPDATE))
    _save_grads(ctx, actor, {**stats, "logp": logp}, out_file)


def test_shared_prompts_give_the_same_logprobs_and_update(tiny_model_path, tmp_path):
    """trainer.share_prompts: the rows of a prompt run it once (a KV cache gathered to its rows);
    log-probs, loss and gradients are those of the rows run whole, in one process and in two."""
    whole, shared, two = (str(tmp_path / f"{k}.pt") for k in ("whole", "shared", "two"))
    launch(_shared_prompts, (tiny_model_path, False, whole), 1, "cpu")
    launch(_shared_prompts, (tiny_model_path, True, shared), 1, "cpu")
    launch(_shared_prompts, (tiny_model_path, True, two, True), 2, "cpu")
    pw, ps, p2 = torch.load(whole), torch.load(shared), torch.load(two)
    torch.testing.assert_close(ps["stats"]["logp"], pw["stats"]["logp"], atol=1e-5, rtol=1e-5)
    for k in ("loss/policy", "kl/mean", "actor/entropy", "actor/grad_norm"):
        assert ps["stats"][k] == pytest.approx(pw["stats"][k], rel=1e-5, abs=1e-7), k
    for n in pw["params"]:
        torch.testing.assert_close(ps["params"][n], pw["params"][n], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(p2["params"][n], pw["params"][n], atol=1e-6, rtol=1e-4)


def test_shared_prompt_hidden_equals_the_whole_rows_and_steps_aside_without_sharing(tiny_model_path):
    from fastcrit.models.hf import load_model
    from fastcrit.train.policy import CausalLMLogprobs

    m = CausalLMLogprobs(load_model(tiny_model_path))
    b = make_grouped_batch(5)
    R = b.responses.shape[1]
    with torch.no_grad():
        whole = m.base(
            input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids
        ).last_hidden_state[:, -R - 1 : -1]
        got = m.shared_prompt_hidden(b.input_ids, b.attention_mask, b.position_ids, R)
    valid = b.response_mask.bool()
    torch.testing.assert_close(got[valid], whole[valid], atol=1e-5, rtol=1e-5)
    # one response token: the second forward still runs (on it; every rank runs two) and the
    # prompt's last position alone predicts it
    cut = slice(0, 12), slice(0, b.input_ids.shape[1] - R + 1)
    with torch.no_grad():
        got = m.shared_prompt_hidden(b.input_ids[cut], b.attention_mask[cut], b.position_ids[cut], 1)
    assert got.shape == (12, 1, whole.shape[-1])
    torch.testing.assert_close(got, whole[:12, :1], atol=1e-5, rtol=1e-5)
    single = b.select(torch.tensor([0, 4, 8, 12]))  # one row per prompt: nothing to share
    assert m.shared_prompt_hidden(single.input_ids, single.attention_mask, single.position_ids, R) is None
    # a model with a recurrent layer (its cache is a state, not keys a gather can share) runs whole
    m.lm.config.layer_types = ["full_attention", "linear_attention"] * 2
    assert m.shared_prompt_hidden(b.input_ids, b.attention_mask, b.position_ids, R) is None


def test_shared_prompt_pass_packs_short_responses_end_to_end(tiny_model_path, monkeypatch):
    """Short responses of one prompt run end to end in one row of the responses' pass (a
    block-causal mask, each segment at its own positions): fewer rows, and the same log-probs and
    parameter gradients as the rows run one by one."""
    from types import SimpleNamespace as NS

    from fastcrit.models.hf import load_model
    from fastcrit.train import policy
    from fastcrit.train.policy import CausalLMLogprobs

    # which models pack: SDPA over full attention, no sliding window in use
    assert policy._packable(NS(_attn_implementation="sdpa", sliding_window=None))
    assert policy._packable(NS(_attn_implementation="sdpa", sliding_window=4096, use_sliding_window=False))
    assert not policy._packable(NS(_attn_implementation="sdpa", sliding_window=4096))  # Mistral's
    assert not policy._packable(NS(_attn_implementation="flash_attention_2", sliding_window=None))
    assert not policy._packable(NS(_attn_implementation="sdpa", layer_types=["full_attention", "sliding_attention"]))
    b = make_grouped_batch(5)
    R = b.responses.shape[1]
    _, inverse = torch.unique(torch.cat([b.input_ids[:, :-R], b.attention_mask[:, :-R]], 1), dim=0, return_inverse=True)
    lead, row, col, src, seg = policy._pack_responses(b.attention_mask[:, -R:], inverse, R - 1)
    assert len(lead) < len(b)  # rows of lengths 3 + 2 etc. share a row
    runs = (b.attention_mask[:, -R:].sum(1) - 1).clamp(min=0)
    assert len(row) == int(runs.sum()) and int(col.max()) < R - 1
    assert torch.equal(inverse[src[0]], inverse[lead[row]])  # a packed row holds one prompt's responses
    calls = []
    packed = policy.CausalLMLogprobs._packed_responses
    monkeypatch.setattr(
        policy.CausalLMLogprobs, "_packed_responses", lambda self, *a: calls.append(1) or packed(self, *a)
    )

    def run(pack: bool):
        monkeypatch.setattr(policy, "_packable", lambda config: pack)
        torch.manual_seed(0)
        m = CausalLMLogprobs(load_model(tiny_model_path))
        lp = m(
            b.input_ids,
            b.attention_mask,
            b.position_ids,
            b.responses,
            b.response_mask,
            temperature=0.7,
            share_prompts=True,
        )
        (lp * torch.linspace(0.5, 1.5, lp.numel()).view_as(lp)).sum().backward()
        return lp.detach(), {n: p.grad for n, p in m.named_parameters()}

    lp_p, g_p = run(True)
    assert calls == [1]
    lp_u, g_u = run(False)
    assert calls == [1]
    torch.testing.assert_close(lp_p, lp_u, atol=1e-5, rtol=1e-5)
    for n in g_u:
        torch.testing.assert_close(g_p[n], g_u[n], atol=1e-6, rtol=1e-4)
    # a batch that packing cannot shrink, or responses that are not right-padded: rows as they are
    assert policy._pack_responses(torch.ones(4, 5), torch.tensor([0, 0, 1, 1]), 4) is None
    assert policy._pack_responses(torch.tensor([[1, 0, 1], [1, 0, 0]]), torch.tensor([0, 0]), 2) is None


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none"),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
def test_a_plain_module_steps_with_fused_adamw_like_foreach(tiny_model_path, device):
    """One fp32 process gives the plain module torch's fused AdamW: three steps on the same
    gradients leave the weights where the foreach AdamW (FSDP2's) leaves them."""
    optim = OptimConfig(lr=1e-2, weight_decay=0.1)
    actor = build_actor(tiny_model_path, dtype="float32", device=torch.device(device), world_size=1, optim=optim)
    assert actor.optimizer.defaults["fused"] and not actor.optimizer.defaults["foreach"]
    start = [p.detach().clone() for p in actor.module.parameters()]
    twin = [p.detach().clone().requires_grad_(True) for p in actor.module.parameters()]
    ref = torch.optim.AdamW(
        twin,
        lr=optim.lr,
        betas=(optim.beta1, optim.beta2),
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        foreach=True,
    )
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p, q in zip(actor.module.parameters(), twin):
            p.grad = torch.randn(p.shape, generator=g).to(device)
            q.grad = p.grad.clone()
        actor.optimizer.step()
        ref.step()
    for p, q, p0 in zip(actor.module.parameters(), twin, start):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
        assert (p - p0).abs().max() > 1e-3  # the steps moved every weight
