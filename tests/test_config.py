import glob
import os

import pytest

from fastcrit.cli import main
from fastcrit.config import Config, ConfigError, load_config, parse_set

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True))


def test_defaults_have_the_required_keys():
    c = Config()
    for path in (
        "model.path",
        "trainer.total_steps",
        "trainer.output_dir",
        "trainer.save_every",
        "trainer.seed",
        "rollout.n",
        "rollout.temperature",
        "rollout.max_new_tokens",
        "algorithm.name",
        "algorithm.kl_coef",
    ):
        node = c
        for part in path.split("."):
            node = getattr(node, part)


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.relpath(p, ROOT) for p in CONFIGS])
def test_every_shipped_config_loads_and_names_its_hardware(path):
    load_config(path)
    with open(path) as f:
        first = f.readline()
    assert first.startswith("#"), f"{path}: the first line must be a comment naming the hardware"
    assert "fastcrit " in open(path).read().split("\n\n")[0], f"{path}: name its command up top"


def test_configs_exist_for_cpu_and_gpu():
    rel = {os.path.relpath(p, ROOT) for p in CONFIGS}
    assert {"configs/grpo.yaml", "configs/cpu/grpo.yaml"} <= rel


def test_yaml_overrides_and_set_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("rollout:\n  n: 4\noptim:\n  lr: 1\n")
    c = load_config(str(p), ["rollout.n=6", "algorithm.clip_c=3", "trainer.output_dir=/x"])
    assert c.rollout.n == 6 and c.optim.lr == 1.0 and isinstance(c.optim.lr, float)
    assert c.algorithm.clip_c == 3.0 and c.trainer.output_dir == "/x"


def test_unknown_key_names_full_path_and_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("rollout:\n  nn: 4\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(p))
    assert str(p) in str(e.value) and "rollout.nn" in str(e.value)


def test_wrong_type_names_full_path_and_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("trainer:\n  total_steps: ten\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(p))
    assert str(p) in str(e.value) and "trainer.total_steps" in str(e.value) and "int" in str(e.value)
    with pytest.raises(ConfigError, match=r"--set: rollout.temperature"):
        load_config(None, ["rollout.temperature=hot"])
    with pytest.raises(ConfigError, match=r"algorithm.name"):
        load_config(None, ["algorithm.name=dpo"])
    with pytest.raises(ConfigError, match=r"model: expected a mapping"):
        load_config(None, ["model=3"])


def test_missing_file_and_bad_set():
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_config("nope.yaml")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_set("rollout.n")
    with pytest.raises(ConfigError, match="prompts_per_step"):
        load_config(None, ["trainer.nproc=3"])


@pytest.mark.parametrize("name,twin", [("grpo", "grpo"), ("pacs_beta2", "pacs")])
def test_gpu_config_on_a_cpu_machine_points_to_the_cpu_config(capsys, name, twin):
    """configs/<algo>.yaml and a variant configs/<algo>_<variant>.yaml point to configs/cpu/<algo>.yaml."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal only happens without it")
    rc = main(["train", os.path.join(ROOT, "configs", f"{name}.yaml")])
    err = capsys.readouterr().err
    assert rc == 2 and f"configs/cpu/{twin}.yaml" in err and "no CUDA" in err


def test_pacs_beta2_is_the_pacs_config_with_beta_2():
    from fastcrit.config import to_dict

    one, two = (to_dict(load_config(os.path.join(ROOT, "configs", n))) for n in ("pacs.yaml", "pacs_beta2.yaml"))
    assert (one["pacs"]["beta"], two["pacs"]["beta"]) == (1.0, 2.0)
    assert two["trainer"]["output_dir"] != one["trainer"]["output_dir"]  # the two runs keep apart
    for d in (one, two):
        del d["pacs"]["beta"], d["trainer"]["output_dir"]
    assert one == two


def test_cli_reports_config_errors_without_a_traceback(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text("trainer: [1, 2]\n")
    assert main(["train", str(p)]) == 2
    assert "trainer: expected a mapping" in capsys.readouterr().err


def test_yaml_exponent_floats_without_a_dot_are_floats(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("optim:\n  lr: 1e-6\n")
    assert load_config(str(p)).optim.lr == 1e-6


def test_sandbox_section_is_part_of_the_tree(tmp_path):
    c = load_config(None, ["sandbox.isolation=none", "sandbox.preimport=[math]", "sandbox.timeout_s=3"])
    assert c.sandbox.isolation == "none" and c.sandbox.preimport == ("math",)
    with pytest.raises(ConfigError, match="sandbox.isolation"):
        load_config(None, ["sandbox.isolation=maybe"])
    with pytest.raises(ConfigError, match="sandbox.workers"):
        load_config(None, ["sandbox.workers=x"])
    from fastcrit.config import dump_yaml

    dump_yaml(c, str(tmp_path / "c.yaml"))
    assert load_config(str(tmp_path / "c.yaml")).sandbox.preimport == ("math",)


def test_lr_schedule_is_checked():
    assert load_config(None, ["optim.lr_schedule=cosine"]).optim.lr_schedule == "cosine"
    with pytest.raises(ConfigError, match="optim.lr_schedule"):
        load_config(None, ["optim.lr_schedule=linear-ish"])
    with pytest.raises(ConfigError, match="optim.min_lr_ratio"):
        load_config(None, ["optim.min_lr_ratio=1.5"])


def test_token_budget_and_packing_are_checked():
    cfg = load_config(None, ["trainer.max_tokens_per_micro_batch=4096", "trainer.pack_sequences=true"])
    assert cfg.trainer.max_tokens_per_micro_batch == 4096 and cfg.trainer.pack_sequences
    with pytest.raises(ConfigError, match="trainer.pack_sequences: needs trainer.max_tokens_per_micro_batch"):
        load_config(None, ["trainer.pack_sequences=true"])
    with pytest.raises(ConfigError, match="trainer.max_tokens_per_micro_batch: must be >= 0"):
        load_config(None, ["trainer.max_tokens_per_micro_batch=-1"])


def test_forward_micro_batch_size_falls_back_to_the_update_s():
    assert load_config(None, ["trainer.micro_batch_size=8"]).trainer.forward_micro_batch_size == 8
    cfg = load_config(None, ["trainer.micro_batch_size=8", "trainer.logprob_micro_batch_size=32"])
    assert cfg.trainer.forward_micro_batch_size == 32 and cfg.trainer.micro_batch_size == 8
    with pytest.raises(ConfigError, match="trainer.logprob_micro_batch_size: must be >= 0"):
        load_config(None, ["trainer.logprob_micro_batch_size=-1"])


def test_old_logprob_recomputation_resolves_and_tis_needs_it(tmp_path):
    from fastcrit.config import dump_yaml
    from fastcrit.config_values import loss_scale, recompute_old_logprobs

    assert not recompute_old_logprobs(load_config(None))  # fp32 native: the engine's are the trainer's
    assert recompute_old_logprobs(load_config(None, ["model.dtype=bfloat16"]))
    assert recompute_old_logprobs(load_config(None, ["rollout.engine=sglang"]))
    assert recompute_old_logprobs(load_config(None, ["algorithm.recompute_old_logprobs=true"]))
    assert not recompute_old_logprobs(
        load_config(None, ["model.dtype=bfloat16", "algorithm.recompute_old_logprobs=false"])
    )
    with pytest.raises(ConfigError, match="algorithm.recompute_old_logprobs"):
        load_config(None, ["algorithm.recompute_old_logprobs=sometimes"])
    with pytest.raises(ConfigError, match="recompute_old_logprobs=true"):
        load_config(None, ["algorithm.tis_cap=2"])
    with pytest.raises(ConfigError, match="algorithm.tis_cap: must be > 0"):
        load_config(None, ["algorithm.tis_cap=0", "algorithm.recompute_old_logprobs=true"])
    c = load_config(None, ["algorithm.tis_cap=2", "model.dtype=bfloat16"])
    assert c.algorithm.tis_cap == 2.0
    dump_yaml(c, str(tmp_path / "c.yaml"))  # the resolved config reloads
    assert load_config(str(tmp_path / "c.yaml")).algorithm.recompute_old_logprobs == "auto"
    assert loss_scale(load_config(None, ["rollout.max_new_tokens=24"])) == 24.0
    assert loss_scale(load_config(None, ["algorithm.loss_scale_factor=100"])) == 100.0


@pytest.mark.parametrize(
    "path", [p for p in CONFIGS if os.sep + "cpu" + os.sep not in p], ids=lambda p: os.path.relpath(p, ROOT)
)
def test_gpu_configs_recompute_old_logprobs(path):
    from fastcrit.config_values import recompute_old_logprobs

    assert recompute_old_logprobs(load_config(path))


# AdamW weight decay of the GPU configs as their papers' code sets it: verl's FSDP workers default to
# 0.01 for the actor and the critic (GRPO, PPO, CTRL's RL); PACS's scripts set 0.01 (docs/ANCHORS).
PAPER_WEIGHT_DECAY = {
    "grpo.yaml": 0.01,
    "ppo.yaml": 0.01,
    "pacs.yaml": 0.01,
    "pacs_beta2.yaml": 0.01,
    "ctrl.yaml": 0.01,
}


@pytest.mark.parametrize("name", sorted(PAPER_WEIGHT_DECAY))
def test_gpu_configs_use_their_papers_weight_decay(name):
    assert load_config(os.path.join(ROOT, "configs", name)).optim.weight_decay == PAPER_WEIGHT_DECAY[name]
