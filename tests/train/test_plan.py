"""`fastcrit plan`: the arithmetic against budgets worked by hand (the 7B CTRL setting of issue 34
as the sanity reference), every GPU config fits on 80 GiB, a config that cannot fit is refused
with the keys that would make it fit, and `fastcrit train` runs the same check."""

import glob
import json
import os
import re

import pytest

from fastcrit.cli import main
from fastcrit.config import ConfigError, load_config
from fastcrit.train.plan import CONTEXTS, GIB, activation_bytes_per_token, find_model_config, make_plan, model_shape

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
# the training configs (configs/ctrl_eval_*.yaml are for `fastcrit critique` alone: nothing trains)
GPU_CONFIGS = sorted(
    p for p in glob.glob(os.path.join(ROOT, "configs", "*.yaml")) if not os.path.basename(p).startswith("ctrl_eval_")
)
CODER_7B = "/models/Qwen2.5-Coder-7B-Instruct"


def test_parameter_counts_are_the_published_ones():
    """Counted on a weightless (meta) copy of the architecture: Qwen2.5-7B has 7,615,616,512
    parameters and Qwen2.5-1.5B (tied embeddings) 1,543,714,304 (their model cards: 7.61B, 1.54B)."""
    m7 = model_shape(CODER_7B)
    assert m7.params == 7_615_616_512
    assert m7.root_params == 2 * 152064 * 3584 + 3584  # embeddings + lm_head + final norm
    assert m7.layer_params == 233_057_792
    assert (m7.layers, m7.hidden, m7.kv_heads, m7.head_dim, m7.tied) == (28, 3584, 4, 128, False)
    m15 = model_shape("/models/Qwen2.5-1.5B-Instruct")
    assert m15.params == 1_543_714_304 and m15.tied
    assert m15.root_params == 151936 * 1536 + 1536  # one embedding matrix, tied to the lm_head
    critic = model_shape(CODER_7B, value_head=True)  # the lm_head replaced by a 1-output score
    assert critic.params == m7.params - 152064 * 3584 + 3584


def test_a_missing_model_directory_uses_the_shipped_config_with_a_note_or_says_what_to_give(tmp_path):
    path, note = find_model_config(CODER_7B, "model.path")
    assert path.endswith("qwen2.5-coder-7b-instruct.json") and "not on this machine" in note
    with pytest.raises(ValueError, match="model.path=.*no config.json.*shipped for planning"):
        find_model_config(str(tmp_path / "Unknown-13B"), "model.path")
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(open(path).read())
    assert find_model_config(str(d), "model.path") == (str(d / "config.json"), "")


def test_the_7b_ctrl_budget_worked_by_hand():
    """configs/ctrl.yaml (7.6B policy, bf16, 8 ranks): the issue's reference budget per GPU, each
    term computed here from the published sizes."""
    cfg = load_config(os.path.join(ROOT, "configs", "ctrl.yaml"))
    plan = make_plan(cfg, 80.0)
    ph = {p.name: p.terms for p in plan.phases}
    P, W = 7_615_616_512, 8
    upd = ph["update"]
    assert upd["policy weights (fp32 shards)"] / GIB == pytest.approx(4 * P / W / GIB) == pytest.approx(3.546, abs=1e-3)
    assert upd["policy optimizer (AdamW, fp32)"] / GIB == pytest.approx(7.092, abs=1e-3)
    assert upd["policy: gradients (fp32 shards)"] / GIB == pytest.approx(3.546, abs=1e-3)
    assert upd["reference (shards)"] / GIB == pytest.approx(2 * P / W / GIB) == pytest.approx(1.773, abs=1e-3)
    # the reference's gathered root (embeddings + lm_head in bf16, 2.03 GiB) and two layers
    assert ph["ref"]["reference: gathered root + 2 layers"] == 2 * (2 * 152064 * 3584 + 3584 + 2 * 233_057_792)
    # SGLang engines: 0.4 and 0.2 of the device, awake together only while the proxy revises
    assert ph["reward"]["rollout engine: weights + KV cache (SGLang, 0.4 of the device)"] / GIB == pytest.approx(32.0)
    assert ph["reward"]["proxy engine: weights + KV cache (SGLang, 0.2 of the device)"] / GIB == pytest.approx(16.0)
    assert not any(k.startswith("proxy engine") for k in ph["update"])
    # 8 rows of 1536 + 768 tokens per micro-batch; 2 bytes x (28 layer inputs + 2 working layers + 2) x ...
    tokens = 8 * (1536 + 768)
    key = f"policy: activations, {tokens} tokens/micro-batch (checkpointed)"
    per_layer = 7 * 3584 + 2 * 4 * 128 + 3 * 18944
    assert upd[key] == tokens * 2 * (28 * 3584 + 2 * per_layer + 2 * 3584)
    # without checkpointing: ~4.4 MiB per token (the review: ~4.7), ~85 GiB per micro-batch
    plain = activation_bytes_per_token(model_shape(CODER_7B), 2, False)
    assert plain / 2**20 == pytest.approx(2 * (28 * per_layer + 2 * per_layer + 2 * 3584) / 2**20)
    assert 4.3 < 28 * per_layer * 2 / 2**20 < 4.8
    assert plan.fits()
    assert CONTEXTS in upd and upd[CONTEXTS] / GIB == pytest.approx(0.6 + 0.5 + 2 * 0.6)


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=os.path.basename)
def test_every_gpu_config_plans_to_fit_on_80_gib(path, capsys):
    assert main(["plan", path, "--gpu-memory-gib", "80"]) == 0
    out = capsys.readouterr().out
    assert "peak:" in out and "headroom" in out and "update" in out
    assert re.search(r"^peak: [\d.]+ GiB in \w+; fits: [\d.]+ GiB under the 76\.0 GiB a phase may use", out, re.M)


def test_a_config_that_cannot_fit_is_refused_naming_keys(tmp_path, capsys):
    ctrl = os.path.join(ROOT, "configs", "ctrl.yaml")
    js = str(tmp_path / "plan.json")
    rc = main(
        [
            "plan",
            ctrl,
            "--gpu-memory-gib",
            "80",
            "--json",
            js,
            "--set",
            "trainer.gradient_checkpointing=false",
            "--set",
            "trainer.micro_batch_size=16",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 1
    assert "update does not fit" in captured.out and "trainer.gradient_checkpointing=true" in captured.out
    # the peak line says plainly that it does not fit, and by how much
    peak = next(ln for ln in captured.out.splitlines() if ln.startswith("peak: "))
    assert re.fullmatch(
        r"peak: [\d.]+ GiB in update; DOES NOT FIT: [\d.]+ GiB over the 76\.0 GiB a phase may use "
        r"\(80 GiB less the 5% kept free\); over: .*update.*",
        peak,
    ), peak
    assert "fits:" not in peak and "fits when" not in peak
    assert "trainer.max_tokens_per_micro_batch=" in captured.out
    assert "does not fit on 80 GiB per GPU" in captured.err and "Traceback" not in captured.err
    saved = json.load(open(js))
    assert saved["fits"] is False and "update" in saved["fixes"]
    # a smaller device: the engines' shares are named
    rc = main(["plan", ctrl, "--gpu-memory-gib", "40"])
    assert rc == 1 and "rollout.mem_fraction_static=" in capsys.readouterr().out


def test_a_suggested_token_budget_makes_the_update_fit():
    cfg = load_config(
        os.path.join(ROOT, "configs", "ctrl.yaml"),
        ["trainer.gradient_checkpointing=false", "trainer.micro_batch_size=16"],
    )
    plan = make_plan(cfg, 80.0)
    fix = next(k for k in plan.fixes["update"] if k.startswith("trainer.max_tokens_per_micro_batch="))
    budget = int(fix.split("=")[1].split()[0])
    cfg2 = load_config(
        os.path.join(ROOT, "configs", "ctrl.yaml"),
        [
            "trainer.gradient_checkpointing=false",
            "trainer.micro_batch_size=16",
            f"trainer.max_tokens_per_micro_batch={budget}",
        ],
    )
    assert "update" not in {p.name for p in make_plan(cfg2, 80.0).over()}


def test_train_on_cuda_runs_the_check_before_loading_anything(monkeypatch):
    """`fastcrit train` on CUDA refuses a config the plan says cannot fit, with the keys, before
    any weights load (the check needs no GPU: it is called here with an 80 GiB device)."""
    import fastcrit.cli as cli
    import fastcrit.train.plan as plan_mod

    monkeypatch.setattr(plan_mod, "device_capacity_gib", lambda default=80.0: 80.0)
    cfg = load_config(os.path.join(ROOT, "configs", "ctrl.yaml"), ["trainer.gradient_checkpointing=false"])
    with pytest.raises(ConfigError, match="does not fit.*trainer.gradient_checkpointing=true.*skip_plan"):
        cli._check_plan(cfg, "configs/ctrl.yaml")
    cli._check_plan(load_config(os.path.join(ROOT, "configs", "ctrl.yaml")), "configs/ctrl.yaml")
