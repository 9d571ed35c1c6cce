"""The recipe registry (fastcrit.registry): a recipe is one file that declares itself. The toy recipe
here lives in a temporary directory named by FASTCRIT_RECIPES and touches no file of fastcrit, yet
`fastcrit train` runs it, the config loader applies its rules, `fastcrit plan` reads its needs and
`fastcrit recipes` lists it."""

import json
import os
import sys

import pytest

from fastcrit import registry
from fastcrit.config import ConfigError, load_config
from tests.recipes.recipe_cli import TINY_MODEL, metric_rows, run_cli

CPU_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "cpu", "grpo.yaml")
SETS = [
    *TINY_MODEL,
    "data.prompts_per_step=2",
    "data.val_size=4",
    "rollout.n=3",
    "rollout.max_new_tokens=4",
    "sft.steps=0",
    "trainer.micro_batch_size=6",
    "trainer.progress=false",
    "trainer.total_steps=2",
    "algorithm.kl_coef=0",
]

TOY = '''
"""REINFORCE with the batch mean as baseline: the smallest recipe the scaffold runs."""

import dataclasses

import torch

from fastcrit.recipes.scaffold import Run, reward_items
from fastcrit.registry import Recipe
from fastcrit.reward import make_reward
from toy_helpers import baseline  # a module beside the recipe's file

RECIPE = Recipe(
    names=("toy",),
    step="Toy",
    prepare="prepare",
    minimums={"rollout.n": (3, "the toy wants three samples")},
)


def prepare(ctx, cfg):
    # the pre-stage's config is the one the recipe runs with: the step sees val_size 2
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, val_size=2))


class Toy:
    def __init__(self, run: Run):
        self.run = run
        self.reward = make_reward(run.cfg, run.out, run.ctx.rank, run.ctx.device)
        self.prompts = run.load_prompts(run.cfg.data.train, "train")

    def step(self, step: int) -> dict:
        run = self.run
        prompts = run.share(self.prompts, step)
        rollouts = run.generate([p.ids for p in prompts], run.sampling(step))
        texts = [run.tok.decode(r.output_ids, skip_special_tokens=True) for r in rollouts]
        results = self.reward(reward_items(rollouts, texts, [p.example for p in prompts]))
        scores = torch.tensor([r.score for r in results], dtype=torch.float32)
        batch = run.batch(rollouts, scores)
        batch.advantages = (scores - baseline(scores))[:, None] * batch.response_mask
        stats = run.update(batch)
        run.sync()
        return {"toy/score": scores.mean().item(), **stats}

    def evaluate(self) -> dict:
        return {"val/toy_val_size": float(self.run.cfg.data.val_size)}
'''


@pytest.fixture
def toy_dir(tmp_path, monkeypatch):
    d = tmp_path / "my_recipes"
    d.mkdir()
    (d / "toy.py").write_text(TOY)
    (d / "toy_helpers.py").write_text("def baseline(scores):\n    return scores.mean()\n")
    monkeypatch.setenv(registry.ENV, str(d))
    yield d
    for name in [m for m in list(sys.modules) if m.startswith(registry.EXTERNAL)]:
        del sys.modules[name]


def test_the_shipped_recipes_declare_themselves():
    found = registry.recipes()
    assert set(found) == {"grpo", "rloo", "pacs", "ppo", "raro", "ctrl"}
    assert found["ctrl"].module == "fastcrit.recipes.ctrl.recipe" and found["ctrl"].proxy
    assert found["ppo"].value_critic and found["ppo"].kl_in_reward
    assert not found["raro"].needs_reward
    assert found["rloo"].minimums and not found["grpo"].minimums  # GRPO takes groups of one
    assert found["pacs"].load().__name__ == "PACS"
    ppo = load_config(None, ["algorithm.name=ppo", "reward.name=model", "ppo.kl_in_reward_coef=0.1"])
    assert registry.recipe("ppo").needs_reference(ppo)
    assert not registry.recipe("grpo").needs_reference(load_config(None, ["ppo.kl_in_reward_coef=0.1"]))


def test_a_toy_recipe_in_its_own_file_trains_through_the_cli(tmp_path, toy_dir, capsys):
    out = str(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"rollout.n: algorithm.name=toy needs rollout.n >= 3, got 2 \(the toy"):
        load_config(CPU_CONFIG, ["algorithm.name=toy", "rollout.n=2"])
    assert run_cli("train", CPU_CONFIG, [*SETS, "algorithm.name=toy", f"trainer.output_dir={out}"]) == 0
    rows = metric_rows(out)
    steps = [r for r in rows if "toy/score" in r]
    assert [r["step"] for r in steps] == [1, 2]
    with open(os.path.join(out, "eval_start.json")) as f:
        assert json.load(f) == {"val/toy_val_size": 2.0}  # prepare's config (SETS say 4)
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["val_toy_val_size_end"] == 2.0
    with open(os.path.join(out, "config.yaml")) as f:
        assert "name: toy" in f.read()

    from fastcrit.cli import main

    capsys.readouterr()
    assert main(["recipes"]) == 0
    listed = capsys.readouterr().out
    assert "toy" in listed and str(toy_dir / "toy.py") in listed and "fastcrit/recipes/grpo.py:GRPO" in listed
    plan = tmp_path / "plan.json"
    for kl, ref in (("0", False), ("0.01", True)):
        argv = ["plan", CPU_CONFIG, "--set", "algorithm.name=toy", "--set", f"algorithm.kl_coef={kl}"]
        assert main([*argv, "--gpu-memory-gib", "80", "--json", str(plan)]) == 0
        phases = json.loads(plan.read_text())["phases"]
        assert ("ref" in phases) == ref and "critic" not in phases  # no value critic declared


def test_a_declaration_the_registry_cannot_read_is_named(tmp_path, monkeypatch):
    d = tmp_path / "bad"
    d.mkdir()
    monkeypatch.setenv(registry.ENV, str(d))
    (d / "a.py").write_text(
        "from fastcrit.registry import Recipe\nN = 3\n"
        'RECIPE = Recipe(names=("a",), step="A", minimums={"rollout.n": (N, "x")})\n'
    )
    with pytest.raises(ConfigError, match=r"a.py:3: Recipe field 'minimums' must be a literal"):
        registry.recipes()
    (d / "a.py").write_text('RECIPE = Recipe(names=("a",), step="A", needs_refernce=True)\n')
    with pytest.raises(ConfigError, match=r"a.py:1: Recipe has no field 'needs_refernce'"):
        registry.recipes()
    (d / "a.py").write_text('RECIPE = Recipe(names=("grpo",), step="A")\n')
    with pytest.raises(ConfigError, match=r"algorithm.name 'grpo' is declared twice: in .*grpo.py and .*a.py"):
        registry.recipes()
    (d / "a.py").write_text('RECIPE = Recipe(names="a", step="A")\n')
    with pytest.raises(ConfigError, match=r"a.py: Recipe needs names \(a tuple of strings\)"):
        registry.recipes()
    (d / "a.py").write_text('RECIPE = Recipe(names=("a",), step="A", minimums={"rollout.m": (2, "x")})\n')
    with pytest.raises(ConfigError, match=r"a.py: Recipe minimums: 'rollout.m' is not a numeric config key"):
        load_config(None, ["algorithm.name=a"])
    monkeypatch.setenv(registry.ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"FASTCRIT_RECIPES: .*missing' is not a directory"):
        registry.recipes()
