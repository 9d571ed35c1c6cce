import glob
import os

import pytest

from fastcrit.cli import main
from fastcrit.config import Config, ConfigError, load_config, parse_set

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True))


def test_defaults_have_the_required_keys():
    c = Config()
    for path in ("model.path", "trainer.total_steps", "trainer.output_dir", "trainer.save_every",
                 "trainer.seed", "rollout.n", "rollout.temperature", "rollout.max_new_tokens",
                 "algorithm.name", "algorithm.kl_coef"):
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


def test_gpu_config_on_a_cpu_machine_points_to_the_cpu_config(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal only happens without it")
    rc = main(["train", os.path.join(ROOT, "configs", "grpo.yaml")])
    err = capsys.readouterr().err
    assert rc == 2 and "configs/cpu/grpo.yaml" in err and "no CUDA" in err


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
