"""GRPO on the shipped math task with the `math` reward, end to end through the CLI (a few steps,
a small tiny model): the warm start reads math:sft, every score comes from math-verify, and each
reference is the shipped answer of the prompt it was scored for."""

import json
import os

from recipe_cli import metric_rows, run_cli

from fastcrit.data.tasks import task_path
from fastcrit.reward.math_answer import MathReward

SETS = [
    "model.tiny.hidden=64",
    "model.tiny.layers=2",
    "model.tiny.heads=2",
    "model.tiny.kv_heads=1",
    "model.tiny.intermediate=128",
    "data.prompts_per_step=2",
    "data.val_size=4",
    "rollout.n=4",
    "rollout.max_new_tokens=8",
    "sft.steps=2",
    "sft.batch_size=8",
    "trainer.micro_batch_size=4",
    "trainer.total_steps=2",
    "trainer.save_every=0",
    "trainer.eval_every=0",
    "trainer.progress=false",
    "trainer.compute_threads=1",
]
CPU_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "cpu", "math.yaml")


def shipped_answers() -> dict[str, str]:
    out = {}
    for split in ("train", "test"):
        with open(task_path("math", split)) as f:
            out.update((r["prompt"], r["answer"]) for r in map(json.loads, f))
    return out


def test_grpo_with_the_math_reward_on_the_shipped_task(tmp_path, monkeypatch):
    scored = []  # (item, result) of every call the run makes to the math manager
    real_call = MathReward.__call__

    def recording_call(self, items):
        results = real_call(self, items)
        scored.extend(zip(items, results))
        return results

    monkeypatch.setattr(MathReward, "__call__", recording_call)
    out = str(tmp_path / "run")
    assert run_cli("train", CPU_CONFIG, SETS, f"trainer.output_dir={out}") == 0

    with open(os.path.join(out, "sft", "config.yaml")) as f:
        assert "data: math:sft" in f.read()
    # 4 greedy answers at the start, 2 steps x 2 prompts x 4 samples, 4 at the end.
    assert len(scored) == 4 + 2 * 2 * 4 + 4
    answers = shipped_answers()
    for item, result in scored:
        assert item.answer == answers[item.prompt]
        assert set(result.info) >= {"correct", "no_answer"}
        assert result.score == float(result.info["correct"])
        if result.info["no_answer"]:
            assert result.info["reason"] == "no answer found"
    rows = metric_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # math-verify's verdicts, averaged, are the logged reward
        assert r["reward/mean"] == r["reward/correct"] and 0.0 <= r["reward/no_answer"] <= 1.0
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["val_correct_end"] == summary["val_reward_end"]
    assert summary["val_no_answer_start"] is not None
