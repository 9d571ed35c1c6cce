"""fastcrit.cli's own pieces: the environment a run's ranks get for its SGLang engines."""
import os

import pytest

from fastcrit.cli import _engine_env
from fastcrit.config import ConfigError, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"):
        monkeypatch.delenv(k, raising=False)


def test_an_sglang_run_exports_what_sglang_will_set(clean_env):
    gpu = load_config(os.path.join(ROOT, "configs", "grpo.yaml"), [])
    assert gpu.rollout.engine == "sglang"
    assert _engine_env(gpu) == {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
    cpu = load_config(os.path.join(ROOT, "configs", "cpu", "grpo.yaml"), [])
    assert _engine_env(cpu) == {}  # no SGLang engine: NCCL keeps its own defaults
    # CTRL's local proxy on SGLang counts, and two engines must agree.
    ctrl = os.path.join(ROOT, "configs", "cpu", "ctrl.yaml")
    proxy = load_config(ctrl, ["proxy.rollout.engine=sglang", "proxy.rollout.engine_args={enable_nccl_nvls: true}"])
    assert _engine_env(proxy) == {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "1"}
    both = load_config(ctrl, ["proxy.rollout.engine=sglang", "proxy.rollout.engine_args={enable_nccl_nvls: true}",
                              "rollout.engine=sglang"])
    with pytest.raises(ConfigError, match="NCCL_NVLS_ENABLE to 0 and 1"):
        _engine_env(both)


def test_a_user_value_sglang_would_overwrite_is_a_config_error(clean_env, monkeypatch):
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "0")
    cfg = load_config(os.path.join(ROOT, "configs", "grpo.yaml"), ["rollout.engine_args={enable_symm_mem: true}"])
    with pytest.raises(ConfigError, match="rollout.engine_args: the environment has NCCL_CUMEM_ENABLE=0"):
        _engine_env(cfg)
