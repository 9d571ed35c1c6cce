"""RARO end to end through the CLI on a tiny model: its metrics, the replay buffer growing and
saved with the checkpoint, and an exact resume (buffer included); what the step hands the update."""

import dataclasses
import json
import os
import statistics

import pytest
import torch
from recipe_cli import metric_rows as rows
from recipe_cli import run_cli, stable

SETS = [
    "model.path=tiny",
    "model.tiny.hidden=64",
    "model.tiny.layers=2",
    "model.tiny.heads=2",
    "model.tiny.kv_heads=1",
    "model.tiny.intermediate=128",
    "algorithm.name=raro",
    "data.train=reverse",
    "data.val=reverse:test",
    "data.max_prompt_len=400",
    "data.prompts_per_step=2",
    "data.val_size=4",
    "rollout.n=2",
    "rollout.max_new_tokens=8",
    "raro.critic_samples=2",
    "raro.critic_max_new_tokens=6",
    "raro.replay_capacity=5",
    "sft.steps=25",
    "sft.lr=3e-3",
    "sft.batch_size=16",
    "optim.lr=1e-3",
    "algorithm.kl_coef=0.01",
    "reward.name=rule",
    "trainer.micro_batch_size=4",
    "trainer.progress=false",
    "trainer.seed=3",
]
REVERSE = {"task": "reverse"}  # the final answer is the answer line
CPU_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "cpu", "grpo.yaml")


def train(out, *extra):
    return run_cli("train", CPU_CONFIG, SETS, f"trainer.output_dir={out}", *extra)


def test_raro_steps_buffer_and_exact_resume(tmp_path, same_checkpoint):
    straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
    assert train(straight, "trainer.total_steps=3", "trainer.save_every=2") == 0
    r = rows(straight)
    for key in (
        "raro/critic_acc",
        "raro/tie_rate",
        "raro/unparseable_rate",
        "raro/policy_reward",
        "raro/buffer_size",
        "raro/replayed_pairs",
        "reward/mean",
        "kl/mean",
        *(f"raro/{role}/{k}" for role in ("policy", "critic") for k in ("loss", "clipfrac", "kl")),
    ):
        assert all(isinstance(x[key], float) for x in r), key
    # 4 fresh triples a step (minus over-length and blank answers), capacity 5; replay after the first step
    judged = [4 - y["raro/masked/policy_overlong"] - y["raro/masked/policy_no_answer"] for y in r]
    assert [x["raro/buffer_size"] for x in r] == [min(5, sum(judged[: i + 1])) for i in range(3)]
    assert r[0]["raro/replayed_pairs"] == 0 and r[1]["raro/replayed_pairs"] > 0
    state = torch.load(os.path.join(straight, "checkpoints", "step_2", "recipe_rank0.pt"), weights_only=False)
    assert len(state["buffer"]["items"]) == r[1]["raro/buffer_size"]
    summary = json.load(open(os.path.join(straight, "summary.json")))
    for key in (
        "val_critic_acc_end",
        "val_policy_reward_end",
        "val_unparseable_rate_end",
        "val_reward_end",
        "val_critic_acc_fixed_end",
        "val_start_policy_reward_end",
    ):
        assert summary[key] is not None, key
    e = summary["eval"]  # each role against the other's start
    assert e["critic_acc_start"] == summary["val_critic_acc_fixed_start"] == summary["val_critic_acc_start"]
    assert e["policy_reward_end"] == summary["val_policy_reward_end"]
    assert e["policy_reward_start"] == summary["val_start_policy_reward_end"]
    assert len(state["start_answers"]) == 4  # the starting policy's held-out answers, kept for resume

    assert train(resumed, "trainer.total_steps=2", "trainer.save_every=2") == 0
    assert train(resumed, "trainer.total_steps=3", "trainer.save_every=2") == 0
    for x, y in zip(r, rows(resumed)):
        assert stable(x) == pytest.approx(stable(y), rel=1e-5, abs=1e-6)
    same_checkpoint(straight, resumed, 3)


def test_warm_start_rows_cut_policy_answers_and_random_critic_labels():
    from types import SimpleNamespace

    from fastcrit.config import RAROConfig
    from fastcrit.recipes.raro import warm_start_rows

    ex = [
        SimpleNamespace(prompt=f"Reverse the letters: {w}", answer=" ".join(reversed(w.split())), meta=REVERSE)
        for w in ("a b c d e", "f g h i j", "k l m n o", "p q r s t")
    ] * 50
    full = warm_start_rows(ex, RAROConfig())
    policy = [r["messages"][-1]["content"] for r in full if r["messages"][0]["content"] == RAROConfig.policy_system]
    assert policy == [e.answer for e in ex]
    critic = [r for r in full if r["messages"][0]["content"] != RAROConfig.policy_system]
    # "expert": the label names the expert's answer
    for r in critic:
        q = r["messages"][1]["content"]
        expert = next(e.answer for e in ex if e.prompt in q)
        assert q.split(f"Answer {r['messages'][-1]['content'][-2]}:\n")[1].startswith(expert)
    cut = warm_start_rows(ex, RAROConfig(warm_start_cut=0.5, warm_start_critic="random"))
    policy = [
        (r["messages"][1]["content"], r["messages"][-1]["content"])
        for r in cut
        if r["messages"][0]["content"] == RAROConfig.policy_system
    ]
    short = [a for q, a in policy if len(a.split()) < 5]
    assert 0.35 < len(short) / len(policy) < 0.65
    assert all(" ".join(reversed(q.split(": ")[1].split())).startswith(a) for q, a in policy)  # prefixes
    labels = [r["messages"][-1]["content"] for r in cut if r["messages"][0]["content"] != RAROConfig.policy_system]
    assert 0.35 < labels.count("[Answer 1]") / len(labels) < 0.65


def test_cut_warm_start_shows_the_critic_the_expert_answer_against_itself_cut_short():
    from types import SimpleNamespace

    from fastcrit.algos.raro import parse_label
    from fastcrit.config import RAROConfig
    from fastcrit.recipes.raro import warm_start_rows

    ex = [
        SimpleNamespace(prompt=f"Reverse the letters: {w}", answer=" ".join(reversed(w.split())), meta=REVERSE)
        for w in ("a b c d e", "f g h i j", "k l m n o", "p q r s t")
    ] * 20
    rows = warm_start_rows(ex, RAROConfig(warm_start_critic="cut", warm_start_cut=0.7))
    critic = [r for r in rows if r["messages"][0]["content"] != RAROConfig.policy_system]
    assert len(critic) == len(ex)
    positions = []
    for r in critic:
        q, label = r["messages"][1]["content"], parse_label(r["messages"][-1]["content"])
        expert = next(e.answer for e in ex if e.prompt in q)
        named = q.split(f"Answer {label}:\n")[1].split("\n")[0]
        other = q.split(f"Answer {3 - label}:\n")[1].split("\n")[0]
        assert named == expert  # the label names the expert's answer
        assert expert.startswith(other + " ") and len(other.split()) < len(expert.split())  # cut short
        positions.append(label)
    assert 0.3 < positions.count(1) / len(positions) < 0.7


def test_warm_start_critic_share_keeps_every_policy_row_and_that_share_of_critic_rows():
    from types import SimpleNamespace

    from fastcrit.config import RAROConfig
    from fastcrit.recipes.raro import warm_start_rows

    ex = [
        SimpleNamespace(prompt=f"Reverse the letters: {w}", answer=" ".join(reversed(w.split())), meta=REVERSE)
        for w in ("a b c d e", "f g h i j", "k l m n o", "p q r s t")
    ] * 100
    rows = warm_start_rows(ex, RAROConfig(warm_start_critic="cut", warm_start_cut=0.7, warm_start_critic_share=0.2))
    policy = [r for r in rows if r["messages"][0]["content"] == RAROConfig.policy_system]
    critic = [r for r in rows if r["messages"][0]["content"] != RAROConfig.policy_system]
    assert len(policy) == len(ex)
    assert 0.14 < len(critic) / len(ex) < 0.26
    # without the share, every question gets a critic row
    full = warm_start_rows(ex, RAROConfig(warm_start_critic="cut", warm_start_cut=0.7))
    assert len([r for r in full if r["messages"][0]["content"] != RAROConfig.policy_system]) == len(ex)
    from fastcrit.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"raro.warm_start_critic_share: must be in \(0, 1\]"):
        load_config(None, ["raro.warm_start_critic_share=0"])


@pytest.mark.parametrize("kind, mistaken", [("repeat", "e d c b b"), ("swap", "e d c a b"), ("z", "e d c b z")])
def test_wrong_warm_start_keeps_the_length_and_makes_one_mistake_in_the_same_place(kind, mistaken):
    from types import SimpleNamespace

    from fastcrit.algos.raro import parse_label
    from fastcrit.config import ConfigError, RAROConfig, load_config
    from fastcrit.recipes.raro import warm_start_rows, with_mistake

    assert with_mistake("e d c b a", kind) == mistaken and with_mistake("e", kind) == "e"
    ex = [
        SimpleNamespace(prompt=f"Reverse the letters: {w}", answer=" ".join(reversed(w.split())), meta=REVERSE)
        for w in ("a b c d e", "f g h i j", "k l m n o", "p q r s t")
    ] * 100
    cfg = RAROConfig(warm_start_wrong=0.7, warm_start_mistake=kind, warm_start_critic="wrong")
    rows = warm_start_rows(ex, cfg)
    policy = [r["messages"][-1]["content"] for r in rows if r["messages"][0]["content"] == RAROConfig.policy_system]
    assert len(policy) == len(ex) and all(len(a.split()) == 5 for a in policy)  # the length kept
    wrong = [(a, e.answer) for a, e in zip(policy, ex) if a != e.answer]
    assert 0.6 < len(wrong) / len(ex) < 0.8
    assert all(a == with_mistake(e, kind) and a.split()[:3] == e.split()[:3] for a, e in wrong)  # in the same place
    critic = [r for r in rows if r["messages"][0]["content"] != RAROConfig.policy_system]
    assert len(critic) == len(ex)
    for r in critic:  # the expert's answer against the same with the mistake, the label naming the expert's
        q, label = r["messages"][1]["content"], parse_label(r["messages"][-1]["content"])
        expert = next(e.answer for e in ex if e.prompt in q)
        assert q.split(f"Answer {label}:\n")[1].split("\n")[0] == expert
        assert q.split(f"Answer {3 - label}:\n")[1].split("\n")[0] == with_mistake(expert, kind)
    # a mistake without a share changes nothing; out-of-range shares and unknown kinds name the key
    assert warm_start_rows(ex, RAROConfig(warm_start_mistake=kind)) == warm_start_rows(ex, RAROConfig())
    with pytest.raises(ConfigError, match=r"raro.warm_start_wrong: must be in \[0, 1\]"):
        load_config(None, ["raro.warm_start_wrong=1.5"])
    with pytest.raises(ConfigError, match=r"raro.warm_start_mistake"):
        load_config(None, ["raro.warm_start_mistake=drop"])


@pytest.mark.parametrize("key", ["raro.critic_samples", "rollout.n"])
def test_groups_of_one_are_refused_naming_the_key(key):
    from fastcrit.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=rf"^{key}: .*>= 2, got 1"):
        load_config(None, ["algorithm.name=raro", f"{key}=1"])
    load_config(None, ["algorithm.name=grpo", "raro.critic_samples=1"])  # RARO's keys bind RARO only


def forced_verdicts(monkeypatch, pattern):
    """Make the critic's verdicts ``pattern[pair index % len(pattern)][sample]``: "expert" (names the
    expert's answer), "policy" (fooled) or None (unparseable), whatever the tiny critic wrote."""
    from fastcrit.recipes import raro
    from fastcrit.reward import RewardResult

    real = raro.RARO.judge

    def judge(self, pairs, params):
        outs, verdicts, too_long = real(self, pairs, params)
        seen: dict[int, int] = {}
        forced = []
        for o in outs:
            k = seen[o.prompt_index] = seen.get(o.prompt_index, -1) + 1
            pos = pairs[o.prompt_index].expert_pos
            v = pattern[o.prompt_index % len(pattern)][k]
            if v is None:
                forced.append(RewardResult(0.0, {"unparseable": True, "reason": "forced"}))
            else:
                label = pos if v == "expert" else 3 - pos
                forced.append(
                    RewardResult(
                        float(v == "expert"),
                        {"unparseable": False, "label": label, "policy_reward": float(v != "expert")},
                    )
                )
        return outs, forced, too_long

    monkeypatch.setattr(raro.RARO, "judge", judge)


def captured_updates(monkeypatch) -> list:
    """The batches the RARO step hands to ``Run.update`` (copied before the update)."""
    from fastcrit.recipes import scaffold

    seen, real = [], scaffold.Run.update

    def update(self, batch, *args, **kwargs):
        seen.append(
            dataclasses.replace(batch, advantages=batch.advantages.clone(), response_mask=batch.response_mask.clone())
        )
        return real(self, batch, *args, **kwargs)

    monkeypatch.setattr(scaffold.Run, "update", update)
    return seen


def test_masked_rows_neither_train_nor_count_in_their_groups(tmp_path, monkeypatch):
    """Verdicts forced per pair (3 a pair): two naming the expert and one unparseable; one each way
    and one unparseable; all three unparseable (the policy answer is then unjudged). In the batch
    the update gets, masked rows have no valid tokens, and each kept row's advantage is GRPO over
    its group's kept rows alone (the loop below): a group of equal kept verdicts gets 0, with no
    hidden reward for the masked row's score of 0."""
    forced_verdicts(monkeypatch, [("expert", "expert", None), ("expert", "policy", None), (None, None, None)])
    seen = captured_updates(monkeypatch)
    assert train(str(tmp_path / "m"), "trainer.total_steps=2", "trainer.save_every=0", "raro.critic_samples=3") == 0
    assert len(seen) == 2
    equal_kept_groups = 0
    for b in seen:
        kept = (b.response_mask.sum(-1) > 0).tolist()
        scores, groups = b.scores.tolist(), b.group_ids.tolist()
        adv = [
            float(a[m > 0][0]) if k else float(a.abs().sum()) for a, m, k in zip(b.advantages, b.response_mask, kept)
        ]
        want = []
        for i, s in enumerate(scores):
            peers = [scores[j] for j in range(len(scores)) if kept[j] and groups[j] == groups[i]]
            ok = kept[i] and len(peers) >= 2
            want.append((s - statistics.mean(peers)) / (statistics.stdev(peers) + 1e-6) if ok else 0.0)
        assert adv == pytest.approx(want, abs=1e-5)
        for g in set(groups):
            rows = [i for i in range(len(groups)) if groups[i] == g]
            n_kept = sum(kept[i] for i in rows)
            equal_kept_groups += 2 <= n_kept < len(rows) and len({scores[i] for i in rows if kept[i]}) == 1
    assert equal_kept_groups > 0  # the case at stake occurred


# -- the joint update: lambda_pol * L_pol + lambda_crit * L_crit in every optimizer step ----------

LAMBDAS = {0: ("policy", 1 / 9), 1: ("critic", 8 / 9)}
AGG_SCALE = 8.0
RANK_ROWS = {0: [0, 1, 2, 3, 4, 5, 8, 9], 1: [6, 7, 10, 11, 12, 13, 14, 15]}  # whole groups, uneven roles


def raro_algo(agg: str):
    from fastcrit.config import AlgorithmConfig

    return AlgorithmConfig(
        clip_low=0.2, clip_high=0.28, clip_c=3.0, loss_agg=agg, kl_coef=0.1, kl_kind="low_var_kl", mini_batches=2
    )


def raro_batch():
    """16 rows: policy answers 0-7 (groups 0-3, 4-8 tokens), critic verdicts 8-15 (groups 4-7, 1-3
    tokens), rows 3 and 13 masked; old log-probs that are not the model's, so that ratios clip."""
    from fastcrit.rollout.batch import collate
    from fastcrit.types import Rollout

    g = torch.Generator().manual_seed(0)
    rs = []
    for i in range(16):
        p = torch.randint(3, 200, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        n = int(torch.randint(1, 4, (1,), generator=g)) if i >= 8 else int(torch.randint(4, 9, (1,), generator=g))
        o = torch.randint(3, 200, (n,), generator=g).tolist()
        rs.append(Rollout(i // 2, p, o, (-torch.rand(n, generator=g) * 3).tolist(), "stop"))
    b = collate(rs, pad_id=0)
    b.roles = torch.tensor([0] * 8 + [1] * 8)
    b.response_mask[[3, 13]] = 0.0
    b.advantages = torch.randn(16, generator=g)[:, None] * b.response_mask
    b.ref_logprobs = b.old_logprobs - 0.1 * torch.rand(b.old_logprobs.shape, generator=g) * b.response_mask
    return b


def joint_loss_loop(logp, b, algo):
    """The slow, obvious loss of one optimizer step on the rows of ``b``: each role's clipped PPO
    loss over its own rows, aggregated by ``algo.loss_agg``, times its lambda, plus kl_coef x the
    KL over all rows. Also each role's own loss, KL and share of tokens clipped."""

    def pg(i, t):
        a = b.advantages[i, t]
        ratio = torch.exp((logp[i, t] - b.old_logprobs[i, t]).clamp(-20, 20))
        loss = torch.maximum(-a * ratio, -a * ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high))
        return torch.minimum(loss, -a * algo.clip_c) if a < 0 else loss

    def clipped(i, t):
        a, ratio = b.advantages[i, t], torch.exp((logp[i, t] - b.old_logprobs[i, t]).clamp(-20, 20))
        return float(-a * ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high) > -a * ratio)

    def kl(i, t):
        d = (b.ref_logprobs[i, t] - logp[i, t]).clamp(-20, 20)
        return (torch.exp(d) - d - 1).clamp(-10, 10)

    def agg(f, rows):
        seqs = [[f(i, t) for t in range(b.responses.shape[1]) if b.response_mask[i, t] > 0] for i in rows]
        seqs = [s for s in seqs if s]
        if algo.loss_agg == "token-mean":
            return sum(sum(s) for s in seqs) / sum(len(s) for s in seqs)
        if algo.loss_agg == "seq-mean-token-mean":
            return sum(sum(s) / len(s) for s in seqs) / len(seqs)
        per_seq = sum(sum(s) for s in seqs) / len(seqs)
        return per_seq / AGG_SCALE if algo.loss_agg == "seq-mean-token-sum-norm" else per_seq

    rows = {r: [i for i in range(len(b)) if int(b.roles[i]) == r] for r in LAMBDAS}
    own = {name: agg(pg, rows[r]) for r, (name, _) in LAMBDAS.items()}
    own_kl = {name: agg(kl, rows[r]) for r, (name, _) in LAMBDAS.items()}
    clip = {}
    for r, (name, _) in LAMBDAS.items():
        flags = [clipped(i, t) for i in rows[r] for t in range(b.responses.shape[1]) if b.response_mask[i, t] > 0]
        clip[name] = sum(flags) / len(flags)
    loss = sum(lam * own[name] for name, lam in LAMBDAS.values()) + algo.kl_coef * agg(kl, range(len(b)))
    return loss, own, own_kl, clip


def _full_grads(actor) -> dict:
    return {
        n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
        for n, p in actor.module.lm.named_parameters()
    }


def _raro_update(ctx, path, out_file, agg, split, weights):
    """``update_policy`` on ``raro_batch`` (``split``: this rank's RANK_ROWS) with 2 mini-batches and lr
    0, so every optimizer step sees the starting weights; saves each step's gradients and the stats.
    ``weights``: "exact" (RaroObjective) or "whole_step" (advantages scaled once by lambda_role *
    N / N_role over the whole batch, then the plain PPO objective)."""
    import fastcrit.train.actor as actor_mod
    from fastcrit.algos.losses import PPOObjective
    from fastcrit.algos.raro import RaroObjective, agg_units
    from fastcrit.config import OptimConfig
    from fastcrit.train.dist import all_reduce_mean

    actor = actor_mod.build_actor(
        path, dtype="float32", device=ctx.device, world_size=ctx.world_size, optim=OptimConfig(lr=0.0)
    )
    algo, b = raro_algo(agg), raro_batch()
    if split:
        b = b.select(torch.tensor(RANK_ROWS[ctx.rank]))
    if weights == "exact":
        objective = RaroObjective(algo, LAMBDAS, AGG_SCALE)
    else:
        units = {r: agg_units(b.response_mask[b.roles == r], agg) for r in LAMBDAS}
        factor = torch.tensor([LAMBDAS[int(r)][1] * sum(units.values()) / units[int(r)] for r in b.roles])
        b.advantages = b.advantages * factor[:, None]
        objective = PPOObjective(algo, AGG_SCALE)
    steps, real = [], actor_mod.optimizer_step

    def record(a, grad_clip):
        steps.append(_full_grads(a))
        return real(a, grad_clip)

    actor_mod.optimizer_step = record
    try:
        update_policy_stats = actor_mod.update_policy(
            actor,
            b,
            algo,
            temperature=1.0,
            micro_batch_size=3,
            grad_clip=1e9,
            objective=objective,
            generator=torch.Generator().manual_seed(5),
        )
    finally:
        actor_mod.optimizer_step = real
    stats = all_reduce_mean(update_policy_stats)
    if ctx.is_main:
        torch.save({"steps": steps, "stats": stats}, out_file)


def _raro_oracle(ctx, path, out_file, agg):
    """The same two optimizer steps by ``joint_loss_loop`` on each whole mini-batch."""
    import fastcrit.train.actor as actor_mod
    from fastcrit.config import OptimConfig

    actor = actor_mod.build_actor(path, dtype="float32", device=ctx.device, world_size=1, optim=OptimConfig(lr=0.0))
    algo, b = raro_algo(agg), raro_batch()
    steps, own, own_kl, clip, losses = [], [], [], [], []
    for idx in actor_mod._mini_batches(b, algo.mini_batches, False, torch.Generator().manual_seed(5)):
        mini = b.select(idx)
        actor.optimizer.zero_grad(set_to_none=True)
        loss, o, k, c = joint_loss_loop(actor_mod._forward(actor, mini, 1.0, False), mini, algo)
        loss.backward()
        steps.append(_full_grads(actor))
        own.append({n: float(v.detach()) for n, v in o.items()})
        own_kl.append({n: float(v.detach()) for n, v in k.items()})
        clip.append(c)
        losses.append(float(loss.detach()))
    torch.save({"steps": steps, "own": own, "own_kl": own_kl, "clip": clip, "loss": losses}, out_file)


def _same_grads(a: dict, b: dict) -> None:
    for n in a:
        torch.testing.assert_close(a[n], b[n], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_role_weights_are_exact_in_every_optimizer_step(tiny_model_path, tmp_path, agg):
    """Each optimizer step's gradient is that of lambda_pol * L_pol + lambda_crit * L_crit + KL over
    its own mini-batch (the loop oracle), for every loss_agg; the role stats are each role's own
    loss, KL and clip fraction. Weights taken once over the whole step's batch (as the recipe did) miss it: the
    two mini-batches hold different shares of each role."""
    from fastcrit.train.dist import launch

    exact, whole, oracle = (str(tmp_path / f"{k}.pt") for k in ("exact", "whole", "oracle"))
    launch(_raro_update, (tiny_model_path, exact, agg, False, "exact"), 1, "cpu")
    launch(_raro_update, (tiny_model_path, whole, agg, False, "whole_step"), 1, "cpu")
    launch(_raro_oracle, (tiny_model_path, oracle, agg), 1, "cpu")
    e, w, o = torch.load(exact), torch.load(whole), torch.load(oracle)
    assert len(e["steps"]) == len(o["steps"]) == 2
    for got, want in zip(e["steps"], o["steps"]):
        _same_grads(got, want)
    for name in ("policy", "critic"):
        assert e["stats"][f"raro/{name}/loss"] == pytest.approx(sum(x[name] for x in o["own"]) / 2, rel=1e-4, abs=1e-6)
        assert e["stats"][f"raro/{name}/kl"] == pytest.approx(sum(x[name] for x in o["own_kl"]) / 2, rel=1e-4, abs=1e-6)
        assert e["stats"][f"raro/{name}/clipfrac"] == pytest.approx(sum(x[name] for x in o["clip"]) / 2, rel=1e-5)
    assert e["stats"]["loss/policy"] + 0.1 * e["stats"]["kl/mean"] == pytest.approx(sum(o["loss"]) / 2, rel=1e-4)
    off = max(
        float((g[n] - h[n]).abs().max() / h[n].abs().max().clamp(min=1e-12))
        for g, h in zip(w["steps"], o["steps"])
        for n in h
    )
    assert off > 0.01  # the whole-step weights are measurably wrong here


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_two_ranks_train_raro_as_one_process(tiny_model_path, tmp_path, agg):
    """2 gloo ranks holding different shares of each role (RANK_ROWS) make the optimizer steps and
    the per-role stats of one process holding every row: the role counts are summed over ranks."""
    from fastcrit.train.dist import launch

    one, two = str(tmp_path / "one.pt"), str(tmp_path / "two.pt")
    launch(_raro_update, (tiny_model_path, one, agg, False, "exact"), 1, "cpu")
    launch(_raro_update, (tiny_model_path, two, agg, True, "exact"), 2, "cpu")
    p1, p2 = torch.load(one), torch.load(two)
    assert len(p1["steps"]) == len(p2["steps"]) == 2
    for a, b in zip(p2["steps"], p1["steps"]):
        _same_grads(a, b)
    keys = [k for k in p1["stats"] if k.startswith("raro/")] + ["loss/policy", "kl/mean"]
    assert len(keys) == 8
    for k in keys:
        assert p2["stats"][k] == pytest.approx(p1["stats"][k], rel=1e-5, abs=1e-7), k


# -- what the critic sees ------------------------------------------------------------------------

REASONED = "I take the letters from the end.\nx y z"


def policy_writes(monkeypatch, texts):
    """The policy's samples (the calls with rollout.n = 2 samples a prompt) replaced by ``texts``
    in turn, each ended by EOS; the critic's (3 a pair here) left as sampled."""
    from fastcrit.recipes import scaffold

    real = scaffold.Run.generate

    def generate(self, prompt_ids, params):
        outs = real(self, prompt_ids, params)
        if params.n != 2:
            return outs
        ids = [
            self.tok.encode(texts[i % len(texts)], add_special_tokens=False) + [self.tok.eos_token_id]
            for i in range(len(outs))
        ]
        return [
            dataclasses.replace(o, output_ids=x, logprobs=[-1.0] * len(x), finish_reason="stop")
            for o, x in zip(outs, ids)
        ]

    monkeypatch.setattr(scaffold.Run, "generate", generate)


def judged_pairs(monkeypatch) -> list:
    """The pairs the critic judges in training steps (sampled verdicts; the evaluation's are greedy)."""
    from fastcrit.recipes import raro

    seen, real = [], raro.RARO.judge

    def judge(self, pairs, params):
        if params.n > 1:
            seen.extend(pairs)
        return real(self, pairs, params)

    monkeypatch.setattr(raro.RARO, "judge", judge)
    return seen


@pytest.mark.parametrize("sees", ["answer", "full"])
def test_the_critic_sees_the_final_answer_and_answers_without_one_are_masked(tmp_path, monkeypatch, sees):
    """Policy answers that reason before their answer line show the critic that line alone
    (``raro.critic_sees: answer``, the default; the task `reverse` declares its answer line) or the
    whole text (``full``). An answer with no line to show is masked, counted, and not judged."""
    policy_writes(monkeypatch, [REASONED, REASONED, REASONED, " \n"])
    pairs = judged_pairs(monkeypatch)
    seen = captured_updates(monkeypatch)
    out = str(tmp_path / sees)
    extra = [] if sees == "answer" else ["raro.critic_sees=full"]  # the default, and the other
    assert train(out, "trainer.total_steps=2", "trainer.save_every=0", "raro.critic_samples=3", *extra) == 0
    fresh = [j.answer for j in pairs if j.policy_row is not None]
    want = {"answer": ["x y z"], "full": [REASONED, " \n"]}[sees]
    assert fresh and sorted(set(fresh)) == sorted(want)
    r = rows(out)
    blank = [x["raro/masked/policy_no_answer"] for x in r]
    assert blank == ([1.0, 1.0] if sees == "answer" else [0.0, 0.0])  # 4 answers a step, one blank
    if sees == "answer":
        for b in seen:  # the blank answer's row (the 4th policy row) trains on nothing
            assert b.response_mask[3].sum() == 0


def test_rows_that_declare_no_final_answer_format_are_refused_naming_the_fix():
    from fastcrit.config import ConfigError, RAROConfig
    from fastcrit.data.datasets import Example
    from fastcrit.recipes.raro import shown_answer

    with pytest.raises(
        ConfigError,
        match=r"raro.critic_sees=answer: data.train: a row declares no final-answer "
        r"format; give each row a `task`.*or set raro.critic_sees=full",
    ):
        shown_answer("a\nb", Example("q", "b"), RAROConfig(), "data.train")
    with pytest.raises(ConfigError, match=r"an unknown \('last'\)"):
        shown_answer("a\nb", Example("q", "b", {"answer_format": "last"}), RAROConfig(), "data.train")
    assert shown_answer("a\nb", Example("q", "b", {"answer_format": "line"}), RAROConfig(), "x") == "b"
    assert shown_answer("a\nb", Example("q", "b"), RAROConfig(critic_sees="full"), "x") == "a\nb"


@pytest.mark.parametrize("sees", ["answer", "full"])
def test_warm_start_critic_rows_show_what_the_critic_sees_in_training(sees):
    import re
    from types import SimpleNamespace

    from fastcrit.config import RAROConfig
    from fastcrit.recipes.raro import warm_start_rows

    ex = [
        SimpleNamespace(
            prompt=f"What is {a} + {a}?", answer=f"{a} + {a} = {2 * a}, so \\boxed{{{2 * a}}}", meta={"task": "math"}
        )
        for a in range(1, 9)
    ]
    rows = warm_start_rows(ex, RAROConfig(critic_sees=sees))
    policy = [r["messages"][-1]["content"] for r in rows if r["messages"][0]["content"] == RAROConfig.policy_system]
    assert policy == [e.answer for e in ex]  # the policy still learns the worked answers
    critic = [r["messages"][1]["content"] for r in rows if r["messages"][0]["content"] != RAROConfig.policy_system]
    shown = [a for q in critic for a in re.findall(r"Answer \d:\n(.*?)(?:\n\n|$)", q, re.DOTALL)]
    assert len(critic) == len(ex) and len(shown) == 2 * len(ex)
    if sees == "answer":
        assert all(a.isdigit() for a in shown)  # the boxed results alone
    else:
        assert all(a in {e.answer for e in ex} for a in shown)
