import os

import pytest

from fastcrit.config import ConfigError, load_config
from fastcrit.recipes.common import check_hardware

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU_GRPO = os.path.join(ROOT, "configs", "grpo.yaml")


def test_packing_on_cuda_without_flash_attn_2_stops_before_anything_loads(flash_attn_site, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # past the no-CUDA refusal
    cfg = load_config(GPU_GRPO)
    assert cfg.trainer.pack_sequences and cfg.trainer.device == "cuda"
    with pytest.raises(ConfigError) as err:
        check_hardware(cfg, GPU_GRPO)
    msg = str(err.value)
    assert msg.startswith(GPU_GRPO) and "flash-attn is not installed" in msg
    assert "pip install flash-attn --no-build-isolation" in msg and "trainer.pack_sequences=false" in msg
    check_hardware(load_config(GPU_GRPO, ["trainer.pack_sequences=false"]), GPU_GRPO)  # the way out


def test_packing_on_cuda_needs_a_half_precision_model():
    with pytest.raises(ConfigError, match="flash-attn 2, which takes bf16 / fp16 only"):
        load_config(GPU_GRPO, ["model.dtype=float32"])
    load_config(GPU_GRPO, ["model.dtype=float32", "trainer.pack_sequences=false"])
