import os

import pytest
import torch
from safetensors.torch import load_file


def _assert_same_checkpoint(run_a: str, run_b: str, step: int) -> None:
    """Two runs' checkpoints at `step` hold bit-identical weights."""
    name = os.path.join("checkpoints", f"step_{step}", "model.safetensors")
    wa, wb = load_file(os.path.join(run_a, name)), load_file(os.path.join(run_b, name))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=0, rtol=0)


@pytest.fixture
def same_checkpoint():
    return _assert_same_checkpoint
