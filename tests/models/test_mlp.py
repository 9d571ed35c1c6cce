import pytest
import torch

from fastcrit.models import mlp as mlp_mod
from fastcrit.models.mlp import SwiGLUFunction, patch_swiglu_mlps


def _eager(x, wg, wu, wd):
    return torch.nn.functional.silu(x @ wg.t()) * (x @ wu.t()) @ wd.t()


@pytest.mark.parametrize("rows", [0, 1, 7, 200])
def test_function_matches_the_eager_formula(rows, monkeypatch):
    """In fp64 against the eager formula (values and all four gradients; gradcheck cannot run: it
    backpropagates many times through one graph), with
    element-wise blocks of 3 rows so that a partial last block is covered, and no rows at all; the saved tensors it
    overwrites make a second backward through the same graph an error, not wrong gradients."""
    monkeypatch.setattr(mlp_mod, "_BLOCK_BYTES", 3 * 4 * 24)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 5, 16, generator=g, dtype=torch.float64).requires_grad_()
    ws = [
        (torch.randn(*s, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
        for s in ((24, 16), (24, 16), (16, 24))
    ]
    dy = torch.randn(rows, 5, 16, generator=g, dtype=torch.float64)
    got = SwiGLUFunction.apply(x, *ws)
    want = _eager(x, *ws)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, (x, *ws), dy, retain_graph=True), torch.autograd.grad(want, (x, *ws), dy)):
        torch.testing.assert_close(a, b)
    if rows:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(got, (x, *ws), dy)


def test_keeps_fewer_tensors_for_backward():
    """Hugging Face's MLP keeps x and four [tokens, intermediate] tensors; the function keeps x, g
    and u (counted by autograd's saved-tensor hooks, weights left out)."""
    from types import SimpleNamespace

    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    m = Qwen2MLP(SimpleNamespace(hidden_size=16, intermediate_size=40, hidden_act="silu"))
    x = torch.randn(3, 7, 16, requires_grad=True)

    params = {p.data_ptr() for p in m.parameters()}

    def saved(f):  # distinct storages autograd keeps, parameters left out
        ptrs = set()

        def pack(t):
            if t.data_ptr() not in params:
                ptrs.add(t.untyped_storage().data_ptr())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            f()
        return len(ptrs)

    hf = saved(lambda: m(x))
    patch_swiglu_mlps(m)
    ours = saved(lambda: m(x))
    assert (hf, ours) == (5, 3)


def test_patched_model_gives_the_same_logprobs_and_gradients(model_dir, patched_matches_copy):
    """Every MLP of the tiny Qwen2 is patched, per instance; logits (with gradients, and without:
    the frozen reference's path) and every parameter's gradient match an unpatched copy in fp32; a
    bf16 input, a biased projection or another activation runs the module's own forward."""
    from fastcrit.models.hf import load_model

    lm = load_model(model_dir, dtype=torch.float32)
    assert patched_matches_copy(lm, patch_swiglu_mlps) == lm.config.num_hidden_layers
    mlp = lm.model.layers[0].mlp.bfloat16()
    x = torch.randn(2, 3, lm.config.hidden_size).bfloat16()
    torch.testing.assert_close(mlp(x), type(mlp).forward(mlp, x), atol=0, rtol=0)

    from types import SimpleNamespace

    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = SimpleNamespace(hidden_size=16, intermediate_size=40, hidden_act="silu", mlp_bias=True)
    assert patch_swiglu_mlps(LlamaMLP(cfg)) == 0
    assert patch_swiglu_mlps(LlamaMLP(SimpleNamespace(**{**vars(cfg), "mlp_bias": False}))) == 1
    assert patch_swiglu_mlps(LlamaMLP(SimpleNamespace(**{**vars(cfg), "mlp_bias": False, "hidden_act": "gelu"}))) == 0


def test_trainer_patches_on_cpu(model_dir):
    from fastcrit.train.actor import build_actor

    actor = build_actor(model_dir, dtype="float32", device=torch.device("cpu"), world_size=1)
    mlps = [m for m in actor.module.modules() if type(m).__name__ == "Qwen2MLP"]
    assert mlps and all("forward" in vars(m) for m in mlps)
