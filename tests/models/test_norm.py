import torch

from fastcrit.models.norm import RMSNormFunction, patch_rms_norms


def test_function_matches_the_eager_formula_and_hugging_face():
    """In fp64 against the eager formula (values and both gradients, and gradcheck); in fp32
    against Hugging Face's Qwen2RMSNorm (which computes in fp32 whatever comes in)."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    g = torch.Generator().manual_seed(0)
    w = (torch.rand(48, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
    x = (torch.randn(3, 5, 48, generator=g, dtype=torch.float64) * 3).requires_grad_()
    dy = torch.randn(3, 5, 48, generator=g, dtype=torch.float64)
    want = w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    got = RMSNormFunction.apply(x, w, 1e-5)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, (x, w), dy), torch.autograd.grad(want, (x, w), dy)):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(lambda a, v: RMSNormFunction.apply(a, v, 1e-5), (x[:1, :2], w))
    norm = Qwen2RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(w.float())
    x32 = x.detach().float().requires_grad_()
    hf = norm(x32)
    hf_grads = torch.autograd.grad(hf, (x32, norm.weight), dy.float())
    ours = RMSNormFunction.apply(x32, norm.weight, 1e-5)
    torch.testing.assert_close(ours, hf)
    for a, b in zip(torch.autograd.grad(ours, (x32, norm.weight), dy.float()), hf_grads):
        torch.testing.assert_close(a, b)


def test_patched_model_gives_the_same_logprobs_and_gradients(model_dir, patched_matches_copy):
    """Every RMSNorm of the tiny Qwen2 (two per layer and the final one) is patched, per instance;
    logits (with and without gradients) and every parameter's gradient match an unpatched copy in
    fp32; a bf16 input runs the module's own forward."""
    from fastcrit.models.hf import load_model

    lm = load_model(model_dir, dtype=torch.float32)
    assert patched_matches_copy(lm, patch_rms_norms) == 2 * lm.config.num_hidden_layers + 1
    x = torch.randn(2, 3, lm.config.hidden_size).bfloat16()
    norm = lm.model.norm
    torch.testing.assert_close(norm(x), type(norm).forward(norm, x))


def test_trainer_patches_on_cpu(model_dir):
    from fastcrit.train.actor import build_actor

    actor = build_actor(model_dir, dtype="float32", device=torch.device("cpu"), world_size=1)
    norms = [m for m in actor.module.modules() if type(m).__name__ == "Qwen2RMSNorm"]
    assert norms and all("forward" in vars(m) for m in norms)
