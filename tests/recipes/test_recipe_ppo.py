"""PPO with a critic and a reward model, end to end through the CLI on a tiny model: `fastcrit rm`
trains a reward model that loads back; `fastcrit train` logs the critic's and the reward model's
metrics, checkpoints the critic as a transformers model, and resumes exactly (critic included)."""

import json
import os

import pytest
from recipe_cli import TINY_MODEL, run_cli, stable
from recipe_cli import metric_rows as rows

from fastcrit.cli import main

SETS = [
    *TINY_MODEL,
    "data.prompts_per_step=2",
    "data.val_size=4",
    "rollout.n=2",
    "rollout.max_new_tokens=6",
    "sft.steps=3",
    "sft.batch_size=8",
    "rm.steps=3",
    "rm.batch_size=8",
    "rm.val_fraction=0.01",
    "optim.lr=1e-3",
    "ppo.critic_lr=1e-3",
    "ppo.kl_in_reward_coef=0.05",
    "algorithm.kl_coef=0.01",
    "trainer.micro_batch_size=3",
    "trainer.progress=false",
    "trainer.seed=3",
]
# The KL penalty's coefficient adapted (verl's AdaptiveKLController), with a horizon short enough for it
# to move visibly in a few steps of 4 to 8 sequences.
ADAPTIVE = ["algorithm.kl_ctrl=adaptive", "algorithm.kl_target=0.01", "algorithm.kl_horizon=10"]
CPU_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "cpu", "ppo.yaml")


def run(cmd, out, *extra):
    return run_cli(cmd, CPU_CONFIG, SETS, f"trainer.output_dir={out}", *extra)


def follows_the_controller(r: list[dict], seqs: int) -> None:
    """Each step's coefficient is the adaptive update of the one before from that step's logged KL."""
    from fastcrit.algos.kl_control import next_kl_coef

    assert r[0]["reward/kl_coef"] == pytest.approx(0.05)  # ppo.kl_in_reward_coef, where it starts
    for x, y in zip(r, r[1:]):
        want = next_kl_coef(
            x["reward/kl_coef"], x["reward/kl_penalty"], seqs, ctrl="adaptive", target=0.01, horizon=10.0
        )
        assert y["reward/kl_coef"] == pytest.approx(want, rel=1e-6) and y["reward/kl_coef"] != x["reward/kl_coef"]


def test_rm_then_ppo_with_critic_metrics_and_exact_resume(tmp_path, same_checkpoint, capsys):
    straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
    assert run("rm", straight) == 0
    summary = json.load(open(os.path.join(straight, "rm", "summary.json")))
    assert 0.0 <= summary["val_acc_start"] <= 1.0 and 0.0 <= summary["val_acc_end"] <= 1.0
    assert "held-out accuracy" in capsys.readouterr().out
    from transformers import AutoModelForTokenClassification

    AutoModelForTokenClassification.from_pretrained(os.path.join(straight, "rm", "final"), local_files_only=True)

    assert run("train", straight, "trainer.total_steps=3", "trainer.save_every=2", *ADAPTIVE) == 0  # reuses the rm
    r = rows(straight)
    follows_the_controller(r, seqs=4)
    for key in (
        "critic/value_loss",
        "critic/vf_clipfrac",
        "critic/explained_var",
        "rm/score_mean",
        "reward/kl_penalty",
        "reward/kl_coef",
        "reward/rule",
        "loss/policy",
        "kl/mean",
        "time/values_s",
        "time/critic_s",
    ):
        assert all(isinstance(x[key], float) for x in r), key
    assert all(x["reward/mean"] == pytest.approx(x["reward/rule"]) for x in r)  # weights [model 0, rule 1]
    assert all(x["rm/score_mean"] == pytest.approx(x["reward/model"]) for x in r)
    ckpt = os.path.join(straight, "checkpoints", "step_3", "critic")
    AutoModelForTokenClassification.from_pretrained(ckpt, local_files_only=True)

    # A second run trains its own reward model first, then resumes exactly, critic and KL coefficient included.
    assert run("train", resumed, "trainer.total_steps=2", "trainer.save_every=2", *ADAPTIVE) == 0
    assert run("train", resumed, "trainer.total_steps=3", "trainer.save_every=2", *ADAPTIVE) == 0
    for x, y in zip(r, rows(resumed)):
        assert stable(x) == pytest.approx(stable(y), rel=1e-5, abs=1e-6)
    same_checkpoint(straight, resumed, 3)
    import torch
    from safetensors.torch import load_file

    wa = load_file(os.path.join(ckpt, "model.safetensors"))
    wb = load_file(os.path.join(resumed, "checkpoints", "step_3", "critic", "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_two_processes_train_as_one_process(tmp_path):
    """2 gloo ranks, each with half the step's prompts, make the steps of one process with all of
    them: advantages whitened over every rank's tokens (verl whitens the whole batch), the critic's
    mini-batches dealt by global row, the adaptive KL coefficient moved by the KL of all ranks'
    sequences, the logged means over all ranks' tokens. Metrics and the policy's and critic's
    weights agree to float rounding."""
    from safetensors.torch import load_file

    rm = str(tmp_path / "rm")
    assert run("rm", rm) == 0  # one reward model, read by both runs
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    same = [
        "data.prompts_per_step=4",
        "sft.steps=0",
        "trainer.total_steps=2",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        f"reward.model_path={rm}/rm/final",
        "reward.weights=[0.5, 1.0]",
        *ADAPTIVE,
    ]
    assert run("train", one, *same) == 0
    assert run("train", two, *same, "trainer.nproc=2") == 0
    for name in ("model.safetensors", "critic/model.safetensors"):
        wa = load_file(os.path.join(one, "checkpoints", "step_2", name))
        wb = load_file(os.path.join(two, "checkpoints", "step_2", name))
        assert wa.keys() == wb.keys()
        gap = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
        assert gap < 1e-5, (name, gap)
    a, b = rows(one), rows(two)
    skip = ("time/", "throughput/", "memory/")
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert {k for k in x if not k.startswith(skip)} == {k for k in y if not k.startswith(skip)}
        for k in x:
            if not k.startswith(skip):
                assert abs(x[k] - y[k]) <= 1e-5 * max(1.0, abs(x[k])), (x["step"], k, x[k], y[k])
    assert all(abs(x["critic/value_loss"]) > 0 and x["actor/grad_norm"] > 0 for x in a)  # they did train
    follows_the_controller(b, seqs=8)  # the KL measured over both ranks' sequences moves it


def test_a_missing_reward_model_is_named(tmp_path, capsys):
    rc = main(
        [
            "train",
            CPU_CONFIG,
            "--set",
            "reward.model_path=/nowhere/rm",
            "--set",
            f"trainer.output_dir={tmp_path}",
            "--set",
            "trainer.progress=false",
        ]
    )
    assert rc == 2
    assert (
        "reward.model_path '/nowhere/rm' holds no reward model; train one with `fastcrit rm CONFIG`"
        in capsys.readouterr().err
    )


def test_the_reward_model_is_the_runs_own_by_default(tmp_path, monkeypatch):
    """`fastcrit train configs/cpu/ppo.yaml --set trainer.output_dir=X` trains its reward model in
    X/rm/final and scores with it: it neither stops for want of the reward model of the config's own
    output_dir, nor scores with another run's that exists there."""
    monkeypatch.chdir(tmp_path)  # the config's runs/cpu-ppo is relative: here, away from the repository
    short = ["trainer.total_steps=1", "trainer.eval_every=0", "trainer.save_every=0"]
    assert run_cli("train", CPU_CONFIG, SETS, "trainer.output_dir=a", *short) == 0
    assert os.path.isfile("a/rm/final/COMPLETE") and os.path.isfile("a/rm/summary.json")
    assert not os.path.exists("runs")
    other = tmp_path / "runs" / "cpu-ppo" / "rm" / "final"  # another run's, unreadable if it were read
    other.mkdir(parents=True)
    (other / "COMPLETE").write_text("")
    (other / "config.json").write_text("not a reward model")
    assert run_cli("train", CPU_CONFIG, SETS, "trainer.output_dir=b", *short) == 0
    assert os.path.isfile("b/rm/final/COMPLETE") and rows("b")[0]["rm/score_mean"] == pytest.approx(
        rows("b")[0]["reward/model"]
    )


def test_rm_on_policy_pairs_are_ranked_by_the_label_reward(tmp_path, monkeypatch, capsys):
    (tmp_path / "label_fn.py").write_text(
        "def longer(prompt, response, answer, meta):\n    return float(len(response))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = str(tmp_path / "op")
    assert (
        run(
            "rm",
            out,
            "rm.label_reward=label_fn:longer",
            "rm.samples_per_prompt=3",
            "rm.prompts=40",
            "rm.val_fraction=0.2",
            "rollout.temperature=1.5",
        )
        == 0
    )
    pairs = [json.loads(line) for line in open(os.path.join(out, "rm", "pairs.jsonl"))]
    assert pairs and all(len(p["chosen"]) > len(p["rejected"]) for p in pairs)
    summary = json.load(open(os.path.join(out, "rm", "summary.json")))
    assert summary["sampled_answers"] == 120 and summary["pairs_train"] + summary["pairs_val"] == len(pairs)
    # A label that cannot tell the answers apart gives no pairs: said plainly, not a crash.
    (tmp_path / "flat_fn.py").write_text("def same(prompt, response, answer, meta):\n    return 1.0\n")
    assert run("rm", str(tmp_path / "flat"), "rm.label_reward=flat_fn:same", "rm.prompts=5") == 2
    assert "the answers to each prompt all scored alike" in capsys.readouterr().err


def test_shipped_preference_pairs_prefer_the_better_answer():
    from fastcrit.data.datasets import load_preferences
    from fastcrit.reward.rule import reverse_reward

    pairs, skipped = load_preferences("reverse:prefs")
    assert not skipped and len(pairs) == 8000
    answers = {
        r["prompt"]: r["answer"]
        for r in map(
            json.loads,
            open(
                os.path.join(
                    os.path.dirname(__file__), "..", "..", "fastcrit", "data", "task_files", "reverse_train.jsonl"
                )
            ),
        )
    }
    assert all(
        reverse_reward(p.chosen, answers[p.prompt]) > reverse_reward(p.rejected, answers[p.prompt]) for p in pairs
    )


def test_online_reward_model_refreshes_on_the_policys_pairs_and_resumes_exactly(tmp_path, same_checkpoint, monkeypatch):
    """ppo.rm_refresh_every: the reward model trains on pairs of the policy's answers ranked by
    rm.label_reward, then scores with the new weights; its weights, optimizer and the pairs gathered
    since the last refresh come back on resume."""
    (tmp_path / "len_label.py").write_text(
        "def longer(prompt, response, answer, meta):\n    return float(len(response))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    online = [
        "reward.weights=[1.0, 0.0]",
        "ppo.rm_refresh_every=2",
        "ppo.rm_refresh_steps=2",
        "rm.label_reward=len_label:longer",
        "rollout.n=4",
        "rollout.temperature=1.5",
    ]
    straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
    assert run("rm", straight) == 0
    assert run("train", straight, "trainer.total_steps=5", "trainer.save_every=3", *online) == 0
    r = rows(straight)
    refreshed = [x for x in r if "rm/onpolicy_acc" in x]
    assert [x["step"] for x in refreshed] == [2, 4]
    for x in refreshed:
        assert x["rm/pairs"] > 0 and 0.0 <= x["rm/onpolicy_acc"] <= 1.0 and x["rm/refresh_loss"] > 0
    # the policy is scored by the refreshed reward model: it no longer scores as the file it started from
    import torch
    from safetensors.torch import load_file

    start = load_file(os.path.join(straight, "rm", "final", "model.safetensors"))
    after = load_file(os.path.join(straight, "checkpoints", "step_5", "rm", "model.safetensors"))
    assert any(not torch.equal(start[k], after[k]) for k in start)

    assert run("rm", resumed) == 0
    assert run("train", resumed, "trainer.total_steps=3", "trainer.save_every=3", *online) == 0  # 1 pair batch pending
    assert run("train", resumed, "trainer.total_steps=5", "trainer.save_every=3", *online) == 0
    for x, y in zip(r, rows(resumed)):
        assert stable(x) == pytest.approx(stable(y), rel=1e-5, abs=1e-6)
    same_checkpoint(straight, resumed, 5)
    rb = load_file(os.path.join(resumed, "checkpoints", "step_5", "rm", "model.safetensors"))
    assert all(torch.equal(after[k], rb[k]) for k in after)


def test_the_adaptive_kl_controller_is_refused_where_it_has_no_meaning():
    from fastcrit.config import ConfigError, load_config

    assert load_config(CPU_CONFIG, [*ADAPTIVE, "algorithm.kl_horizon=13"]).algorithm.kl_ctrl == "adaptive"
    grpo = os.path.join(os.path.dirname(CPU_CONFIG), "grpo.yaml")
    with pytest.raises(ConfigError, match=r"algorithm.kl_ctrl=adaptive adapts the KL penalty in PPO's reward"):
        load_config(grpo, ADAPTIVE)  # GRPO's KL is a loss term: nothing in its reward to adapt
    with pytest.raises(ConfigError, match=r"multiplies ppo.kl_in_reward_coef.*set it > 0"):
        load_config(CPU_CONFIG, [*ADAPTIVE, "ppo.kl_in_reward_coef=0"])
    with pytest.raises(ConfigError, match=r"algorithm.kl_horizon \(12.0\) must exceed 0.2 x the step's sequences \(64"):
        load_config(CPU_CONFIG, [*ADAPTIVE, "algorithm.kl_horizon=12"])
    with pytest.raises(ConfigError, match="algorithm.kl_target: must be > 0"):
        load_config(CPU_CONFIG, [*ADAPTIVE, "algorithm.kl_target=0"])
    with pytest.raises(ConfigError, match="algorithm.kl_ctrl: expected one of"):
        load_config(CPU_CONFIG, ["algorithm.kl_ctrl=pid"])


def test_online_reward_model_needs_a_model_part_and_a_label():
    from fastcrit.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="rm.label_reward"):
        load_config(CPU_CONFIG, ["ppo.rm_refresh_every=5"])
    with pytest.raises(ConfigError, match="no `model` part"):
        load_config(
            CPU_CONFIG, ["ppo.rm_refresh_every=5", "reward.name=rule", "reward.weights=[]", "rm.label_reward=rule"]
        )


def test_ranked_pairs_prefer_the_higher_score_per_prompt():
    from fastcrit.recipes.rm import ranked_pairs

    pairs = ranked_pairs(["p", "p", "p", "q", "q"], ["a", "b", "c", "a", "a"], [1.0, 0.0, 1.0, 1.0, 0.0])
    assert [(x.prompt, x.chosen, x.rejected) for x in pairs] == [("p", "a", "b"), ("p", "c", "b")]


def test_rm_on_policy_sampling_is_dealt_over_ranks_and_reused(tmp_path, monkeypatch, capsys):
    """Two ranks sample a share each (chunks of rm.chunk_prompts, round robin) and end with the
    pairs of one process sampling every prompt in one call (an answer draws from its own seed in any
    chunk); a later run with the same settings samples nothing again."""
    import re
    import subprocess
    import sys

    (tmp_path / "label_fn.py").write_text(
        "def longer(prompt, response, answer, meta):\n    return float(len(response))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = [
        "rm.label_reward=label_fn:longer",
        "rm.samples_per_prompt=3",
        "rm.prompts=24",
        "rm.chunk_prompts=8",
        "rm.val_fraction=0.2",
        "rollout.temperature=1.5",
        "sft.steps=0",
        "trainer.compute_threads=1",
    ]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    assert run("rm", one, *extra, "rm.chunk_prompts=24") == 0
    argv = [sys.executable, "-m", "fastcrit.cli", "rm", CPU_CONFIG]
    for s in [*SETS, f"trainer.output_dir={two}", f"reward.model_path={two}/rm/final", *extra, "trainer.nproc=2"]:
        argv += ["--set", s]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",  # the ranks compute as this process does (compute_threads=1)
        PYTHONPATH=os.pathsep.join(
            [str(tmp_path), root, os.path.join(root, "kernels"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sampled = sorted(re.findall(r"rm: rank (\d): sampled prompts (\d+)-(\d+)\b", proc.stdout))  # ranks share stdout
    assert sampled == [("0", "0", "7"), ("0", "16", "23"), ("1", "8", "15")], proc.stdout
    pairs = open(os.path.join(two, "rm", "pairs.jsonl")).read()
    assert pairs and pairs == open(os.path.join(one, "rm", "pairs.jsonl")).read()

    capsys.readouterr()
    assert run("rm", two, *extra) == 0  # one process now, the same settings: the chunks are reused
    assert "sampled prompts" not in capsys.readouterr().out
    assert open(os.path.join(two, "rm", "pairs.jsonl")).read() == pairs
