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
    both = load_config(
        ctrl,
        ["proxy.rollout.engine=sglang", "proxy.rollout.engine_args={enable_nccl_nvls: true}", "rollout.engine=sglang"],
    )
    with pytest.raises(ConfigError, match="NCCL_NVLS_ENABLE to 0 and 1"):
        _engine_env(both)


def test_a_user_value_sglang_would_overwrite_is_a_config_error(clean_env, monkeypatch):
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "0")
    cfg = load_config(os.path.join(ROOT, "configs", "grpo.yaml"), ["rollout.engine_args={enable_symm_mem: true}"])
    with pytest.raises(ConfigError, match="rollout.engine_args: the environment has NCCL_CUMEM_ENABLE=0"):
        _engine_env(cfg)


# ---------------------------------------------------------------------------------------- a stopped run


def _args(command="train", sets=(), resume=None):
    from fastcrit.cli import build_parser

    argv = [command, "configs/cpu/grpo.yaml"]
    for s in sets:
        argv += ["--set", s]
    if resume:
        argv += ["--resume", resume]
    return build_parser().parse_args(argv)


def _complete(out, step):
    path = os.path.join(out, "checkpoints", f"step_{step}")
    os.makedirs(path)
    open(os.path.join(path, "COMPLETE"), "w").close()


def test_the_stop_report_gives_the_command_that_continues(tmp_path, monkeypatch):
    import shlex
    import signal

    from fastcrit.cli import _stop_report
    from fastcrit.train.preempt import Stopped

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    out = str(tmp_path / "my run")
    sets = [f"trainer.output_dir={out}", "rollout.n=4", "data.system_prompt=Be brief.", "trainer.resume=false"]
    cfg = load_config(os.path.join(ROOT, "configs", "cpu", "grpo.yaml"), sets)
    _complete(out, 3)
    # After the step: --resume the run directory; the output directory and resume flag it replaces go.
    text = _stop_report(_args(sets=sets), cfg, Stopped(signal.SIGTERM, 3))
    head, line = text.splitlines()
    assert head == f"fastcrit: stopped by SIGTERM; newest checkpoint: {out}/checkpoints/step_3"
    assert shlex.split(line.removeprefix("resume with: ")) == [
        "fastcrit",
        "train",
        "configs/cpu/grpo.yaml",
        "--resume",
        out,
        "--set",
        "rollout.n=4",
        "--set",
        "data.system_prompt=Be brief.",
    ]
    # Before the first step: the command as it was given.
    text = _stop_report(_args(sets=sets), cfg, Stopped(signal.SIGINT, None))
    assert text.startswith("fastcrit: stopped by SIGINT before the first RL step; nothing to resume from\n")
    assert shlex.split(text.splitlines()[1].removeprefix("start again with: "))[3:] == [
        x for s in sets for x in ("--set", s)
    ]
    sft = _stop_report(_args("sft", sets=sets), cfg, Stopped(signal.SIGTERM, None))
    assert "stopped by SIGTERM during `fastcrit sft`" in sft and "start again with: fastcrit sft" in sft
    # At once: resume from the newest checkpoint there is.
    _complete(out, 5)
    text = _stop_report(_args(sets=sets), cfg, Stopped(signal.SIGINT, None, at_once=True))
    assert text.startswith("fastcrit: stopped at once by a second SIGINT") and f"{out}/checkpoints/step_5" in text
    assert "resume with: fastcrit train" in text
    # Under torchrun: the user's torchrun command, with these arguments after -m fastcrit.cli.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    text = _stop_report(_args(sets=sets), cfg, Stopped(signal.SIGTERM, 3))
    assert "resume with: torchrun TORCHRUN_OPTIONS -m fastcrit.cli train configs/cpu/grpo.yaml --resume" in text
