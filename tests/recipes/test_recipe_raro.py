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
    for key in ("val_critic_acc_end", "val_policy_reward_end", "val_unparseable_rate_end", "val_reward_end"):
        assert summary[key] is not None, key

    assert train(resumed, "trainer.total_steps=2", "trainer.save_every=2") == 0
    assert train(resumed, "trainer.total_steps=3", "trainer.save_every=2") == 0
    for x, y in zip(r, rows(resumed)):
        assert stable(x) == pytest.approx(stable(y), rel=1e-5, abs=1e-6)
    same_checkpoint(straight, resumed, 3)
