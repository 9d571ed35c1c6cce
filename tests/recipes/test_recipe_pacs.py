"""PACS end to end through the CLI on a tiny model: its metrics, exact resume, and a clear error
when the reward is not 0/1."""

import json
import os

import pytest
from recipe_cli import TINY_MODEL, run_cli, stable
from recipe_cli import metric_rows as rows

SETS = [
    *TINY_MODEL,
    "data.prompts_per_step=2",
    "data.val_size=4",
    "rollout.n=4",
    "rollout.max_new_tokens=6",
    "sft.steps=3",
    "sft.batch_size=8",
    "optim.lr=1e-3",
    "algorithm.kl_coef=0.01",
    "trainer.micro_batch_size=3",
    "trainer.progress=false",
    "trainer.seed=3",
]
CPU_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "cpu", "pacs.yaml")


def train(out, *extra):
    return run_cli("train", CPU_CONFIG, SETS, f"trainer.output_dir={out}", *extra)


def test_pacs_logs_its_metrics_and_resumes_exactly(tmp_path, same_checkpoint):
    straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
    assert train(straight, "trainer.total_steps=3", "trainer.save_every=2") == 0
    r = rows(straight)
    for key in (
        "pacs/loss",
        "pacs/pos_frac",
        "pacs/logit_pos",
        "pacs/logit_neg",
        "pacs/accuracy",
        "kl/mean",
        "reward/mean",
        "actor/grad_norm",
        "time/update_s",
    ):
        assert all(isinstance(x[key], float) for x in r), key
    assert all(0.0 <= x["pacs/pos_frac"] <= 1.0 for x in r)
    assert all(x["pacs/pos_frac"] == x["reward/mean"] for x in r)  # exact_match: labels are the rewards
    assert any(x["actor/grad_norm"] > 0 for x in r)
    summary = json.load(open(os.path.join(straight, "summary.json")))
    assert summary["val_reward_start"] is not None and summary["val_reward_end"] is not None

    assert train(resumed, "trainer.total_steps=2", "trainer.save_every=2") == 0
    assert train(resumed, "trainer.total_steps=3", "trainer.save_every=2") == 0
    for x, y in zip(r, rows(resumed)):
        assert stable(x) == pytest.approx(stable(y), rel=1e-6, abs=1e-7)
    same_checkpoint(straight, resumed, 3)


def test_pacs_refuses_a_reward_that_is_not_0_or_1():
    import torch

    from fastcrit.config import ConfigError
    from fastcrit.recipes.pacs import outcome_labels

    assert outcome_labels(torch.tensor([0.0, 1.0, 1.0]), "exact_match").tolist() == [0.0, 1.0, 1.0]
    with pytest.raises(ConfigError, match=r"pacs needs 0/1 rewards, but reward manager 'reverse' gave \[0\.4"):
        outcome_labels(torch.tensor([1.0, 0.4, 0.0]), "reverse")
