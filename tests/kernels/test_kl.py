"""kl_penalty against the fp64 reference (verl's kl_penalty), both backends, values and gradients."""

import math

import pytest
import torch

from fastcrit_kernels import kl_penalty
from fastcrit_kernels._reference import ref_kl_penalty

# dtype: (atol, rtol) for values and gradients. Both paths compute in float32 on the same (rounded)
# inputs as the fp64 oracle, so only the output rounding differs: float32 ulps, or bf16's 8 bits.
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 1e-2),
}
KINDS = ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"]
BACKENDS = ["torch", "triton"]


def _device(backend):
    """Triton runs compiled on CUDA tensors where a GPU exists, else under the interpreter on CPU."""
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(shape, generator=g) * 4
    ref = lp + torch.randn(shape, generator=g) * 3
    flat_lp, flat_ref = lp.view(-1), ref.view(-1)
    # hit every clamp of k3: d = ref - lp beyond +-20, and exp(d) - d - 1 above 10 (d > ~2.6)
    special = [(0.0, 25.0), (0.0, -25.0), (-1.0, 3.0), (-2.0, -2.0), (-0.5, 0.5)]
    for i, (a, b) in enumerate(special[: flat_lp.numel()]):
        flat_lp[i], flat_ref[i] = a, a + b
    return lp.to(dtype), ref.to(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1), (3, 37), (2, 5, 7)])
def test_kl_matches_reference(backend, kind, dtype, shape):
    atol, rtol = TOL[dtype]
    dev = _device(backend)
    lp, ref = (t.to(dev).requires_grad_(True) for t in _inputs(shape, dtype))
    out = kl_penalty(lp, ref, kind, backend=backend)
    assert out.shape == lp.shape and out.dtype == dtype
    upstream = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 1.7
    out.backward(upstream.to(dtype).to(dev))

    lp64 = lp.detach().cpu().double().requires_grad_(True)
    ref64 = ref.detach().cpu().double().requires_grad_(True)
    want = ref_kl_penalty(lp64, ref64, kind)
    want.backward(upstream.to(dtype).double())
    torch.testing.assert_close(out.detach().cpu().double(), want.detach(), atol=atol, rtol=rtol)
    torch.testing.assert_close(lp.grad.cpu().double(), lp64.grad, atol=atol, rtol=rtol)
    torch.testing.assert_close(ref.grad.cpu().double(), ref64.grad, atol=atol, rtol=rtol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_k3_clamps_and_detached_reference(backend):
    dev = _device(backend)
    lp = torch.tensor([0.0, 0.0, -1.0, -1.0], device=dev, requires_grad=True)
    # d = ref - lp: 25 (d clamped to 20, then kl to 10), -25 (d -> -20, kl = 19 -> 10), 3 (kl > 10), 0.5
    ref = torch.tensor([25.0, -25.0, 2.0, -0.5], device=dev)
    out = kl_penalty(lp, ref, "k3", backend=backend)
    expect = [10.0, 10.0, 10.0, math.exp(0.5) - 0.5 - 1.0]
    torch.testing.assert_close(out.detach().cpu(), torch.tensor(expect), atol=1e-6, rtol=1e-6)
    out.sum().backward()
    # clamped entries pass no gradient; the live one has d kl / d lp = 1 - exp(d)
    torch.testing.assert_close(lp.grad.cpu(), torch.tensor([0.0, 0.0, 0.0, 1.0 - math.exp(0.5)]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_abs_gradient_zero_at_equal(backend):
    dev = _device(backend)
    lp = torch.tensor([-1.0, -1.0, -2.0], device=dev, requires_grad=True)
    ref = torch.tensor([-1.0, -3.0, -1.0], device=dev)
    kl_penalty(lp, ref, "abs", backend=backend).backward(torch.full((3,), 2.0, device=dev))
    torch.testing.assert_close(lp.grad.cpu(), torch.tensor([0.0, 2.0, -2.0]))


def test_backends_agree_and_no_grad():
    lp, ref = _inputs((4, 33), torch.float32, seed=3)
    for kind in ("k1", "abs", "k2", "k3"):
        a = kl_penalty(lp, ref, kind, backend="torch")
        dev = _device("triton")
        b = kl_penalty(lp.to(dev), ref.to(dev), kind, backend="triton")
        torch.testing.assert_close(a, b.cpu(), atol=1e-6, rtol=1e-6)
        assert not a.requires_grad


def test_bad_inputs_name_the_argument():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="kind"):
        kl_penalty(lp, lp, "k4")
    with pytest.raises(ValueError, match="ref_logp"):
        kl_penalty(lp, torch.zeros(2, 4), "k1")
    with pytest.raises(ValueError, match="logp"):
        kl_penalty(torch.zeros(2, 3, dtype=torch.long), lp, "k1")
    with pytest.raises(ValueError, match="backend"):
        kl_penalty(lp, lp, "k1", backend="cuda")


def test_torch_path_chunks(monkeypatch):
    """The torch path walks the flattened tensors in chunks; force 4 uneven chunks and compare."""
    import fastcrit_kernels.kl as kl_mod

    lp, ref = _inputs((3, 11), torch.float32, seed=5)
    upstream = torch.randn(3, 11, generator=torch.Generator().manual_seed(6))

    def run():
        a, b = lp.clone().requires_grad_(True), ref.clone().requires_grad_(True)
        out = kl_penalty(a, b, "k3", backend="torch")
        out.backward(upstream)
        return out.detach(), a.grad, b.grad

    want = run()
    monkeypatch.setattr(kl_mod, "_CHUNK", 10)
    for x, y in zip(run(), want):
        torch.testing.assert_close(x, y, atol=0, rtol=0)
