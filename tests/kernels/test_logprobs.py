"""fused_logprobs against the full-logits fp64 reference, on both backends (Triton under the
interpreter on CPU), plus parity with Liger-Kernel's chunked log-prob forward."""
import pytest
import torch

from fastcrit_kernels import fused_logprobs
from fastcrit_kernels.logprobs import logprobs_reference

# One tolerance table for this module: input dtype -> (value atol, value rtol, grad atol, grad rtol).
# Values are computed in fp32 for every input dtype, so bf16 only loosens the gradients, which come
# back in bf16 (8 mantissa bits).
TOL = {
    torch.float32: (2e-5, 1e-5, 2e-5, 1e-4),
    torch.bfloat16: (2e-5, 1e-5, 2e-2, 2e-2),
}
# Triton on CPU tensors runs only under the interpreter, which tests/conftest.py turns on only where
# there is no GPU; on a GPU machine the compiled kernels are tested on CUDA tensors instead.
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    torch.cuda.is_available(), reason="interpreter is off on a GPU machine; CUDA tests cover Triton"))]


def _inputs(lead, H, V, dtype, *, bias=False, seed=0, scale=1.0, ignore=()):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(*lead, H, generator=g) * scale).to(dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=g) / H**0.5 * 2).to(dtype).requires_grad_()
    b = (torch.randn(V, generator=g)).to(dtype).requires_grad_() if bias else None
    labels = torch.randint(0, V, lead, generator=g)
    flat = labels.view(-1)
    for i in ignore:
        flat[i] = -100
    return hidden, weight, b, labels


def _compare(backend, dtype, lead, H, V, *, temperature=1.0, bias=False, entropy=True, ignore=(),
             chunk_bytes=None, scale=1.0):
    hidden, weight, b, labels = _inputs(lead, H, V, dtype, bias=bias, ignore=ignore, scale=scale)
    kw = dict(temperature=temperature, bias=b, return_entropy=entropy)
    out = fused_logprobs(hidden, weight, labels, backend=backend, chunk_bytes=chunk_bytes, **kw)
    params = [hidden, weight] + ([b] if bias else [])
    # the oracle: fp64 copies of the same (possibly bf16-rounded) values
    p64 = [p.detach().double().requires_grad_() for p in params]
    ref = logprobs_reference(p64[0], p64[1], labels, temperature=temperature,
                             bias=p64[2] if bias else None, return_entropy=entropy)
    out = out if entropy else (out,)
    ref = ref if entropy else (ref,)
    g = torch.Generator().manual_seed(1)
    ups = [torch.randn(lead, generator=g) * 1.7 + 0.3 for _ in out]  # non-unit upstream gradients
    got = torch.autograd.grad(sum((o * u).sum() for o, u in zip(out, ups)), params)
    want = torch.autograd.grad(sum((r * u.double()).sum() for r, u in zip(ref, ups)), p64)
    vatol, vrtol, gatol, grtol = TOL[dtype]
    for o, r in zip(out, ref):
        assert o.dtype == torch.float32 and o.shape == tuple(lead)
        torch.testing.assert_close(o.double(), r, atol=vatol, rtol=vrtol)
    for p, a, e in zip(params, got, want):
        assert a.dtype == p.dtype and a.shape == p.shape
        torch.testing.assert_close(a.double(), e, atol=gatol * max(1.0, e.abs().max().item()), rtol=grtol)
    return out, got, labels


CASES = {
    # lead shape, H, V, temperature, bias, entropy, ignored flat positions
    "batch_plain": ((2, 5), 32, 130, 1.0, False, False, ()),
    "one_token": ((1,), 17, 70, 0.5, False, True, ()),
    "odd_shapes_bias_temp": ((37,), 33, 203, 0.7, True, True, (3, 20)),
    "all_ignored_row": ((3, 6), 24, 97, 1.3, True, True, tuple(range(6, 12))),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case, backend, dtype):
    lead, H, V, temp, bias, ent, ignore = CASES[case]
    out, grads, labels = _compare(backend, dtype, lead, H, V, temperature=temp, bias=bias,
                                  entropy=ent, ignore=ignore)
    ignored = labels == -100
    for o in out:
        assert (o[ignored] == 0).all()
        assert (o[~ignored] != 0).any() or not (~ignored).any()
    if ignored.any():
        # ignored rows get exactly no gradient
        assert (grads[0][ignored] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_vocab_chunks(backend):
    """A chunk budget far below V forces many vocab chunks (odd-sized for torch) in forward and backward."""
    N = 9
    _compare(backend, torch.float32, (N,), 20, 203, temperature=0.9, bias=True, chunk_bytes=4 * N * 7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_vocab_counts_as_minus_inf(backend):
    """V = 65 leaves 63 padded columns in the last Triton block. With all real logits near -50, padded
    columns read as 0 instead of -inf would dominate the log-sum-exp."""
    hidden, weight, _, labels = _inputs((12,), 16, 65, torch.float32)
    b = torch.full((65,), -50.0)
    out = fused_logprobs(hidden, weight, labels, bias=b, backend=backend)
    ref = logprobs_reference(hidden, weight, labels, bias=b)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_peaked_distribution_never_positive_and_finite_entropy_grad(backend):
    """Huge logits: p underflows to exactly 0 for most of the vocabulary and to ~1 for one token."""
    hidden, weight, _, labels = _inputs((10,), 16, 90, torch.float32, scale=400.0)
    z = hidden.detach() @ weight.detach().t()
    labels = z.argmax(-1)  # the dominant token: log-prob ~ -1e-30, must not round above 0
    lp, ent = fused_logprobs(hidden, weight, labels, return_entropy=True, backend=backend)
    assert (lp <= 0).all() and (ent >= 0).all()
    (ent * 0.5 + lp).sum().backward()
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()
    ref_lp, ref_ent = logprobs_reference(hidden, weight, labels, return_entropy=True)
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-4, rtol=1e-4)


def test_torch_path_fp64_gradcheck():
    """The hand-written backward (log-prob and entropy terms) against finite differences, in fp64."""
    g = torch.Generator().manual_seed(3)
    h = torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True)
    labels = torch.tensor([3, -100, 0, 10])

    def f(h, w, b):
        lp, ent = fused_logprobs(h, w, labels, bias=b, temperature=0.8, return_entropy=True,
                                 backend="torch", chunk_bytes=4 * 4 * 3)
        return lp, ent

    assert torch.autograd.gradcheck(f, (h, w, b))


def test_frozen_weight_and_entropy_only_for_logging():
    hidden, weight, _, labels = _inputs((2, 3), 8, 40, torch.float32)
    weight.requires_grad_(False)
    lp, ent = fused_logprobs(hidden, weight, labels, return_entropy=True, backend="torch")
    lp.sum().backward()  # entropy unused: its gradient is None, not a zero pass
    assert weight.grad is None
    ref = logprobs_reference(hidden.detach().requires_grad_(), weight, labels)
    assert hidden.grad.shape == hidden.shape and torch.isfinite(hidden.grad).all()
    torch.testing.assert_close(lp.double(), ref.detach(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("bad, msg", [
    (dict(labels=torch.tensor([0, 99])), "labels must lie in"),
    (dict(labels=torch.tensor([0])), "labels must have shape"),
    (dict(labels=torch.tensor([0.0, 1.0])), "integer"),
    (dict(weight=torch.randn(10, 3)), "does not match weight"),
    (dict(temperature=0.0), "temperature"),
    (dict(bias=torch.randn(9)), "bias must be"),
    (dict(backend="cuda"), "backend must be one of"),
])
def test_bad_inputs_name_the_problem(bad, msg):
    args = dict(hidden=torch.randn(2, 4), weight=torch.randn(10, 4), labels=torch.tensor([1, 2]))
    args.update(bad)
    h, w, lab = args.pop("hidden"), args.pop("weight"), args.pop("labels")
    with pytest.raises(ValueError, match=msg):
        fused_logprobs(h, w, lab, **args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_parity_with_liger_chunk_forward(backend):
    """Same log-probs and gradients as Liger-Kernel 0.8's chunked selective log-prob (fp32)."""
    fp = pytest.importorskip("liger_kernel.chunked_loss.fused_linear_ppo")
    hidden, weight, b, labels = _inputs((2, 9), 24, 150, torch.float32, bias=True, seed=5)
    ours = fused_logprobs(hidden, weight, labels, bias=b, temperature=0.8, backend=backend)
    h2, w2, b2 = (t.detach().clone().requires_grad_() for t in (hidden, weight, b))
    theirs = fp.LigerFusedLinearPPOBase.chunk_forward(h2, w2, labels, bias=b2, temperature=0.8)
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-5)
    up = torch.randn(2, 9)
    ga = torch.autograd.grad((ours * up).sum(), [hidden, weight, b])
    gb = torch.autograd.grad((theirs * up).sum(), [h2, w2, b2])
    for a, e in zip(ga, gb):
        torch.testing.assert_close(a, e, atol=2e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_triton_matches_reference(dtype):
    """The compiled kernels (bf16 tensor-core dot, vocab splits, several backward chunks) on a GPU."""
    torch.manual_seed(0)
    N, H, V = 300, 256, 5003
    hidden = torch.randn(N, H, device="cuda").to(dtype).requires_grad_()
    weight = (torch.randn(V, H, device="cuda") / 8).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (N,), device="cuda")
    labels[::7] = -100
    lp, ent = fused_logprobs(hidden, weight, labels, temperature=0.9, return_entropy=True,
                             backend="triton", chunk_bytes=4 * N * 1024)
    p64 = [hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()]
    rlp, rent = logprobs_reference(p64[0], p64[1], labels, temperature=0.9, return_entropy=True)
    torch.testing.assert_close(lp.double(), rlp, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(ent.double(), rent, atol=1e-3, rtol=1e-4)
    up = torch.randn(N, device="cuda")
    got = torch.autograd.grad((lp * up).sum() + ent.sum(), [hidden, weight])
    want = torch.autograd.grad((rlp * up.double()).sum() + rent.sum(), p64)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for a, e in zip(got, want):
        torch.testing.assert_close(a.double(), e, atol=tol * max(1.0, e.abs().max().item()), rtol=tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_everything_ignored_strided_hidden_int32_labels(backend):
    """A batch where every label is ignored gives zeros and zero gradients; a non-contiguous hidden
    and int32 labels are accepted and give the reference values."""
    base = torch.randn(6, 2 * 12)
    hidden = base[:, ::2].requires_grad_()  # [6, 12], column stride 2
    weight = torch.randn(50, 12, requires_grad=True)
    ignored = torch.full((6,), -100, dtype=torch.int32)
    lp, ent = fused_logprobs(hidden, weight, ignored, return_entropy=True, backend=backend)
    assert (lp == 0).all() and (ent == 0).all()
    (lp.sum() + ent.sum()).backward()
    assert (hidden.grad == 0).all() and (weight.grad == 0).all()
    labels = torch.tensor([0, 49, 7, 7, 30, 1], dtype=torch.int32)
    lp = fused_logprobs(hidden, weight, labels, backend=backend)
    torch.testing.assert_close(lp.double(), logprobs_reference(hidden, weight, labels.long()).detach(),
                               atol=2e-5, rtol=1e-5)
