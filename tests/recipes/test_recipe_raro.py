"""RARO end to end through the CLI on a tiny model: its metrics, the replay buffer growing and
saved with the checkpoint, and an exact resume (buffer included)."""
import json
import os

import pytest
import torch

from recipe_cli import metric_rows as rows, run_cli, stable

SETS = ["model.path=tiny", "model.tiny.hidden=64", "model.tiny.layers=2", "model.tiny.heads=2",
        "model.tiny.kv_heads=1", "model.tiny.intermediate=128", "algorithm.name=raro",
        "data.train=reverse", "data.val=reverse:test", "data.max_prompt_len=400",
        "data.prompts_per_step=2", "data.val_size=4", "rollout.n=2", "rollout.max_new_tokens=8",
        "raro.critic_samples=2", "raro.critic_max_new_tokens=6", "raro.replay_capacity=5",
        "sft.steps=25", "sft.lr=3e-3", "sft.batch_size=16", "optim.lr=1e-3", "algorithm.kl_coef=0.01", "reward.name=rule",
        "trainer.micro_batch_size=4", "trainer.progress=false", "trainer.seed=3"]
CPU_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "cpu", "grpo.yaml")


def train(out, *extra):
    return run_cli("train", CPU_CONFIG, SETS, f"trainer.output_dir={out}", *extra)


def test_raro_steps_buffer_and_exact_resume(tmp_path, same_checkpoint):
    straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
    assert train(straight, "trainer.total_steps=3", "trainer.save_every=2") == 0
    r = rows(straight)
    for key in ("raro/critic_acc", "raro/tie_rate", "raro/unparseable_rate", "raro/policy_reward",
                "raro/buffer_size", "raro/replayed_pairs", "reward/mean", "kl/mean"):
        assert all(isinstance(x[key], float) for x in r), key
    # 4 fresh triples a step (minus over-length answers), capacity 5; replay after the first step
    assert [x["raro/buffer_size"] for x in r] == [min(5, sum(4 - y["raro/overlong_policy"] for y in r[:i + 1]))
                                                  for i in range(3)]
    assert r[0]["raro/replayed_pairs"] == 0 and r[1]["raro/replayed_pairs"] > 0
    state = torch.load(os.path.join(straight, "checkpoints", "step_2", "recipe_rank0.pt"), weights_only=False)
    assert len(state["buffer"]["items"]) == r[1]["raro/buffer_size"]
    summary = json.load(open(os.path.join(straight, "summary.json")))
    for key in ("val_critic_acc_end", "val_policy_reward_end", "val_unparseable_rate_end", "val_reward_end",
                "val_critic_acc_fixed_end", "val_start_policy_reward_end"):
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

    ex = [SimpleNamespace(prompt=f"Reverse the letters: {w}", answer=" ".join(reversed(w.split())))
          for w in ("a b c d e", "f g h i j", "k l m n o", "p q r s t")] * 50
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
    policy = [(r["messages"][1]["content"], r["messages"][-1]["content"]) for r in cut
              if r["messages"][0]["content"] == RAROConfig.policy_system]
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

    ex = [SimpleNamespace(prompt=f"Reverse the letters: {w}", answer=" ".join(reversed(w.split())))
          for w in ("a b c d e", "f g h i j", "k l m n o", "p q r s t")] * 20
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

    ex = [SimpleNamespace(prompt=f"Reverse the letters: {w}", answer=" ".join(reversed(w.split())))
          for w in ("a b c d e", "f g h i j", "k l m n o", "p q r s t")] * 100
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


@pytest.mark.parametrize("key", ["raro.critic_samples", "rollout.n"])
def test_groups_of_one_are_refused_naming_the_key(key):
    from fastcrit.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=rf"^{key}: .*>= 2, got 1"):
        load_config(None, ["algorithm.name=raro", f"{key}=1"])
    load_config(None, ["algorithm.name=grpo", "raro.critic_samples=1"])  # RARO's keys bind RARO only
