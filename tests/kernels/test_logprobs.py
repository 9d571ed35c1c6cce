"""fused_logprobs against the full-logits fp64 reference, on both backends (Triton under the
interpreter on CPU), plus parity with Liger-Kernel's chunked log-prob forward."""

import pytest
import torch
from _triton_on_cuda import on_cuda

import fastcrit_kernels.logprobs as L
from fastcrit_kernels import fused_logprobs, resolve_backend
from fastcrit_kernels.logprobs import logprobs_reference

_fused = on_cuda(fused_logprobs)


def fused_logprobs(*args, backend="auto", **kw):
    """The kernel, with one more backend name for these tests: "torch-recompute" is the torch path
    with no logits kept (``keep_bytes=0``: the backward recomputes them), where "torch" keeps them
    under the CPU default budget."""
    if backend == "torch-recompute":
        backend, kw = "torch", {"keep_bytes": 0, **kw}
    return _fused(*args, backend=backend, **kw)


# One tolerance table for this module: input dtype -> (value atol, value rtol, grad atol, grad rtol).
# Values are computed in fp32 for every input dtype, so bf16 / fp16 only loosen the gradients, which
# come back in bf16 (8 mantissa bits) / fp16 (11), through a d_logits buffer of that dtype on the
# Triton path.
TOL = {
    torch.float32: (2e-5, 1e-5, 2e-5, 1e-4),
    torch.bfloat16: (2e-5, 1e-5, 2e-2, 2e-2),
    torch.float16: (2e-5, 1e-5, 4e-3, 4e-3),
}
# Triton on CPU tensors runs only under the interpreter, which tests/conftest.py turns on only where
# there is no GPU; on a GPU machine the "triton" cases run the compiled kernels on CUDA copies of the
# same inputs (_triton_on_cuda.on_cuda). Shapes the GPU launchers do not take (H not a multiple of 16)
# go to the torch path there, as they would for a user; test_cuda_* below keep to shapes that do.
BACKENDS = ["torch", "torch-recompute", "triton"]


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


def _compare(
    backend, dtype, lead, H, V, *, temperature=1.0, bias=False, entropy=True, ignore=(), chunk_bytes=None, scale=1.0
):
    hidden, weight, b, labels = _inputs(lead, H, V, dtype, bias=bias, ignore=ignore, scale=scale)
    kw = dict(temperature=temperature, bias=b, return_entropy=entropy)
    out = fused_logprobs(hidden, weight, labels, backend=backend, chunk_bytes=chunk_bytes, **kw)
    params = [hidden, weight] + ([b] if bias else [])
    # the oracle: fp64 copies of the same (possibly bf16-rounded) values
    p64 = [p.detach().double().requires_grad_() for p in params]
    ref = logprobs_reference(
        p64[0], p64[1], labels, temperature=temperature, bias=p64[2] if bias else None, return_entropy=entropy
    )
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case, backend, dtype):
    lead, H, V, temp, bias, ent, ignore = CASES[case]
    out, grads, labels = _compare(backend, dtype, lead, H, V, temperature=temp, bias=bias, entropy=ent, ignore=ignore)
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


@pytest.mark.parametrize("keep_bytes", [0, None], ids=["recompute", "kept"])
def test_torch_path_fp64_gradcheck(keep_bytes):
    """The hand-written backward (log-prob and entropy terms) against finite differences, in fp64,
    with the logits recomputed in the backward and with them kept from the forward."""
    g = torch.Generator().manual_seed(3)
    h = torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True)
    labels = torch.tensor([3, -100, 0, 10])

    def f(h, w, b):
        lp, ent = fused_logprobs(
            h,
            w,
            labels,
            bias=b,
            temperature=0.8,
            return_entropy=True,
            backend="torch",
            chunk_bytes=4 * 4 * 3,
            keep_bytes=keep_bytes,
        )
        return lp, ent

    assert torch.autograd.gradcheck(f, (h, w, b))


@pytest.mark.parametrize("backend", ["torch", "torch-recompute"])
@pytest.mark.parametrize("case", ["batch_plain", "odd_shapes_bias_temp", "all_ignored_row"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_path_row_blocks(monkeypatch, case, dtype, backend):
    """The torch path's element-wise passes over blocks of vocab rows of each chunk (blocks that
    stay in cache on a CPU; on the kept path without entropy each block has its own shift): with
    blocks of 2 rows and chunks of 7 (a bf16 weight cast into the reused buffer chunk by chunk),
    the same values and gradients as the fp64 reference, and as whole-chunk passes to fp32
    rounding (the online max and sum see the rows in other groups)."""
    import fastcrit_kernels._fused_linear_torch as tp

    lead, H, V, temperature, bias, entropy, ignore = CASES[case]
    tokens = lead[0] if len(lead) == 1 else lead[0] * lead[1]
    kw = dict(temperature=temperature, bias=bias, entropy=entropy, ignore=ignore, chunk_bytes=4 * 7 * tokens)
    whole = _compare(backend, dtype, lead, H, V, **kw)
    monkeypatch.setattr(tp, "_BLOCK_BYTES", 4 * tokens * 2)  # 2 vocab rows of a chunk
    assert tp.block_rows(tokens, torch.float32) == 2
    blocked = _compare(backend, dtype, lead, H, V, **kw)
    _, _, gatol, grtol = TOL[dtype]  # bf16 gradients may round one ulp apart
    for a, b in zip(whole[0] + whole[1], blocked[0] + blocked[1]):
        torch.testing.assert_close(a, b, atol=gatol * max(1.0, a.abs().max().item()), rtol=grtol)


def test_frozen_weight_and_entropy_only_for_logging():
    hidden, weight, _, labels = _inputs((2, 3), 8, 40, torch.float32)
    weight.requires_grad_(False)
    lp, ent = fused_logprobs(hidden, weight, labels, return_entropy=True, backend="torch")
    lp.sum().backward()  # entropy unused: its gradient is None, not a zero pass
    assert weight.grad is None
    ref = logprobs_reference(hidden.detach().requires_grad_(), weight, labels)
    assert hidden.grad.shape == hidden.shape and torch.isfinite(hidden.grad).all()
    torch.testing.assert_close(lp.double(), ref.detach(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "bad, msg",
    [
        (dict(labels=torch.tensor([0, 99])), "labels must lie in"),
        (dict(labels=torch.tensor([0])), "labels must have shape"),
        (dict(labels=torch.tensor([0.0, 1.0])), "integer"),
        (dict(weight=torch.randn(10, 3)), "does not match weight"),
        (dict(temperature=0.0), "temperature"),
        (dict(bias=torch.randn(9)), "bias must be"),
        (dict(backend="cuda"), "backend must be one of"),
    ],
)
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


def test_fp32_accumulating_gemm_overload_is_on_for_this_torch():
    """bf16 / fp16 gradients on CUDA add each GEMM product into fp32 through addmm's out_dtype
    overload (no product-sized fp32 temporary). It is on for every torch from 2.10, and the calls as
    written resolve to fp32 results in place (meta tensors: CPU has no kernel for the overload)."""
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert L._ADDMM_OUT_DTYPE == ((major, minor) >= (2, 10))
    if not L._ADDMM_OUT_DTYPE:
        pytest.skip(f"torch {torch.__version__} has no fp32-accumulating addmm for 16-bit operands")
    acc = torch.empty(6, 5, device="meta")
    a = torch.empty(6, 4, device="meta", dtype=torch.bfloat16)
    b = torch.empty(4, 5, device="meta", dtype=torch.bfloat16)
    for r in (torch.addmm(acc, a, b, torch.float32, out=acc), torch.mm(a, b, torch.float32, out=acc)):
        assert r.dtype == torch.float32 and r.shape == (6, 5) and r.data_ptr() == acc.data_ptr()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_cuda_add_mm_fp32_into_row_blocks(dtype):
    """_add_mm_fp32 on CUDA: the first product written, the next ones added, into row blocks of an
    fp32 buffer (as d_W's vocab blocks and d_hidden's token chunks are), against fp64 products of the
    same 16-bit operands."""
    torch.manual_seed(0)
    acc = torch.full((96, 40), float("nan"), device="cuda")
    a = [torch.randn(96, 64, device="cuda").to(dtype) for _ in range(3)]
    b = [torch.randn(64, 40, device="cuda").to(dtype) for _ in range(3)]
    for v0, v1 in ((0, 32), (32, 96)):
        for i in range(3):
            L._add_mm_fp32(acc[v0:v1], a[i][v0:v1], b[i], first=i == 0)
    want = sum(x.double() @ y.double() for x, y in zip(a, b))
    torch.testing.assert_close(acc.double(), want, atol=1e-3, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_cuda_kernels_at_gpu_shapes(dtype):
    """test_matches_reference's check at a shape the GPU launchers take (H a multiple of 16; V not a
    multiple of any tile, so the last tile is padded), with bias, temperature and ignored labels,
    forced into several vocab splits and backward chunks."""
    _compare(
        "triton", dtype, (4, 75), 128, 3001, temperature=0.8, bias=True, ignore=(0, 5, 299), chunk_bytes=4 * 300 * 512
    )


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
    lp, ent = fused_logprobs(
        hidden, weight, labels, temperature=0.9, return_entropy=True, backend="triton", chunk_bytes=4 * N * 1024
    )
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
    torch.testing.assert_close(
        lp.double(), logprobs_reference(hidden, weight, labels.long()).detach(), atol=2e-5, rtol=1e-5
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_minus_inf_bias_masks_whole_tiles(backend):
    """A bias of -inf over the first 150 of 200 columns: the first vocab split, whole Triton tiles and
    whole torch chunks hold only -inf, where an unguarded online log-sum-exp gives NaN (exp(-inf -
    -inf)). Log-probs must be torch's log_softmax (-inf for a masked label), entropies torch's
    Categorical entropy, and gradients finite and equal to the reference's."""
    N, H, V = 9, 16, 200
    hidden, weight, _, labels = _inputs((N,), H, V, torch.float32, seed=7)
    b = torch.zeros(V)
    b[:150] = float("-inf")
    b = b.requires_grad_()
    labels = 150 + labels % 50
    labels[2] = 10  # a masked label: log-prob -inf, as torch's
    lp, ent = fused_logprobs(
        hidden, weight, labels, bias=b, temperature=0.9, return_entropy=True, backend=backend, chunk_bytes=4 * N * 50
    )
    z = (hidden.detach().double() @ weight.detach().double().t() + b.detach().double()) / 0.9
    want_lp = torch.log_softmax(z, -1).gather(-1, labels[:, None]).squeeze(-1)
    want_ent = torch.distributions.Categorical(logits=z).entropy()
    assert want_lp[2] == float("-inf") and lp[2] == float("-inf")
    torch.testing.assert_close(lp.double(), want_lp, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), want_ent, atol=2e-5, rtol=1e-5)

    keep = torch.arange(N) != 2  # the -inf log-prob cannot enter a finite loss
    u = torch.randn(N, generator=torch.Generator().manual_seed(2)) * 1.7 + 0.3
    got = torch.autograd.grad((lp * u)[keep].sum() + (ent * u).sum(), [hidden, weight, b])
    p64 = [t.detach().double().requires_grad_() for t in (hidden, weight, b)]
    rlp, rent = logprobs_reference(p64[0], p64[1], labels, bias=p64[2], temperature=0.9, return_entropy=True)
    want = torch.autograd.grad((rlp * u.double())[keep].sum() + (rent * u.double()).sum(), p64)
    for a, e in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), e, atol=2e-5 * max(1.0, e.abs().max().item()), rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_minus_inf_row_is_nan_like_torch(backend):
    """Every logit -inf: torch's log_softmax and entropy are NaN, and so are ours (not a number
    that looks valid)."""
    hidden, weight, _, labels = _inputs((4,), 8, 70, torch.float32)
    b = torch.full((70,), float("-inf"))
    lp, ent = fused_logprobs(hidden, weight, labels, bias=b, return_entropy=True, backend=backend)
    z = hidden.detach() @ weight.detach().t() + b
    assert torch.log_softmax(z, -1).isnan().all()
    assert lp.isnan().all() and ent.isnan().all()


@pytest.mark.parametrize("backend", ["auto", "triton", "torch"])
def test_fp64_takes_the_torch_path(backend):
    """fp64 inputs always run the fp64 torch path: exact to fp64 rounding (the kernels compute in
    fp32, and fp64 tiles would not fit a GPU's shared memory)."""
    g = torch.Generator().manual_seed(4)
    h = torch.randn(7, 12, dtype=torch.float64, generator=g)
    w = torch.randn(90, 12, dtype=torch.float64, generator=g)
    labels = torch.randint(0, 90, (7,), generator=g)
    assert resolve_backend(backend, h, w) == "torch"
    lp = fused_logprobs(h, w, labels, backend=backend)
    assert lp.dtype == torch.float64
    torch.testing.assert_close(lp, logprobs_reference(h, w, labels), atol=1e-12, rtol=1e-12)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is off on a GPU machine")
@pytest.mark.parametrize("tiles", ["_TILES_16BIT", "_TILES_FP32"])
def test_gpu_launch_path_every_tile_under_the_interpreter(monkeypatch, tiles):
    """The GPU branch of the launchers (the triton.autotune wrapper, grids from the chosen tile,
    vocab splits and chunks in steps of the largest tile) run under the interpreter on CPU tensors,
    with each GPU tile in turn as the only config. The operands are fp32 for both tile sets (the
    interpreter's tl.dot mis-reads bf16 unless upcast, which the GPU branch does not do). Whether
    the tiles compile for sm_80 / sm_90a is test_gpu_compile.py's business."""
    monkeypatch.setenv("FASTCRIT_KERNELS_AUTOTUNE", "0")  # one config: nothing to benchmark
    monkeypatch.setattr(L, "_on_gpu", lambda t: True)
    monkeypatch.setattr(L, "_sm_count", lambda device: 3)
    launched = []
    real_tuned = L.tuned
    monkeypatch.setattr(
        L, "tuned", lambda kernel, tiles, key: (launched.append(tiles[0]), real_tuned(kernel, tiles, key))[1]
    )
    tile_set = getattr(L, tiles)
    for i in range(len(tile_set)):
        monkeypatch.setattr(L, "_gpu_tiles", lambda dtype, i=i: tile_set[i:] + tile_set[:i])
        launched.clear()
        _compare(
            "triton",
            torch.float32,
            (3, 47),
            48,
            700,
            temperature=0.8,
            bias=True,
            ignore=(5,),
            chunk_bytes=4 * 141 * 256,
        )
        assert set(launched) == {tile_set[i]} and len(launched) == 1 + 3  # forward, 3 chunks
    # H = 40 is not a multiple of 16: a GPU sends it to the torch path (no kernel compiled for it)
    launched.clear()
    _compare("triton", torch.float32, (3, 5), 40, 100)
    assert not launched


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is off on a GPU machine")
def test_fp32_dot_is_exact_unless_tf32_is_asked_for(monkeypatch):
    """fp32 inputs launch with input_precision "ieee" (no tensor cores) by default; allow_tf32=True
    or FASTCRIT_KERNELS_ALLOW_TF32=1 asks for "tf32"; bf16/fp16 ignore the setting. (The
    interpreter ignores input_precision; test_gpu_compile.py checks what each one compiles to.)"""
    seen = []
    real = L._launch
    monkeypatch.setattr(
        L,
        "_launch",
        lambda kernel, h, grid, args, precision: (seen.append(precision), real(kernel, h, grid, args, precision))[1],
    )

    def run(dtype, **kw):
        seen.clear()
        hidden, weight, _, labels = _inputs((5,), 16, 40, dtype)
        fused_logprobs(hidden, weight, labels, backend="triton", **kw).sum().backward()
        assert len(seen) == 2  # forward and backward
        return set(seen)

    assert run(torch.float32) == {"ieee"}
    assert run(torch.float32, allow_tf32=True) == {"tf32"}
    monkeypatch.setenv("FASTCRIT_KERNELS_ALLOW_TF32", "1")
    assert run(torch.float32) == {"tf32"}
    assert run(torch.float32, allow_tf32=False) == {"ieee"}
    assert run(torch.bfloat16) == {"ieee"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_out_of_range_label_gives_nan(monkeypatch, backend):
    """Where the label check is skipped (a GPU without FASTCRIT_KERNELS_VALIDATE=1: it would sync
    on every call), an out-of-range label gives NaN at its position, never a plausible number, and
    the other positions and the gradient are untouched."""
    monkeypatch.setattr(L, "check_on_host", lambda t: False)
    hidden, weight, _, labels = _inputs((6,), 16, 50, torch.float32)
    labels[1], labels[4] = 50, -3
    lp = fused_logprobs(hidden, weight, labels, backend=backend)
    assert lp[1].isnan() and lp[4].isnan()
    ok = torch.tensor([True, False, True, True, False, True])
    ref = logprobs_reference(hidden, weight, torch.where(ok, labels, 0))
    torch.testing.assert_close(lp[ok].double(), ref[ok].detach(), atol=2e-5, rtol=1e-5)
    lp[ok].sum().backward()
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is off on a GPU machine")
def test_triton_backward_reads_no_unwritten_d_logits(monkeypatch):
    """The backward's d_logits buffer, poisoned with NaN before the kernel writes it, gives finite
    gradients equal to the torch path's: the GEMMs read only what the kernel wrote. (torch's bf16
    GEMM on CPUs with AMX / AVX512-BF16 reads past K into a sliced buffer's unwritten columns: the
    last, narrower vocab chunk made d_hidden NaN now and then, wherever torch.empty's memory held a
    NaN. On other CPUs this test passes either way.)"""

    class Poisoned:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*shape, **kw):
            return torch.full(
                shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape, float("nan"), **kw
            )

    hidden, weight, b, labels = _inputs((37,), 33, 203, torch.bfloat16, bias=True, ignore=(3, 20))
    want = torch.autograd.grad(
        fused_logprobs(hidden, weight, labels, temperature=0.7, bias=b, backend="torch").sum(), [hidden, weight, b]
    )
    monkeypatch.setattr(L, "torch", Poisoned())
    got = torch.autograd.grad(
        fused_logprobs(hidden, weight, labels, temperature=0.7, bias=b, backend="triton").sum(), [hidden, weight, b]
    )
    for g, w in zip(got, want):
        assert torch.isfinite(g.float()).all()
        torch.testing.assert_close(g.float(), w.float(), atol=0.1, rtol=0.05)


def test_auto_sends_exact_fp32_on_a_gpu_to_cublas(monkeypatch):
    """``auto`` with fp32 operands and no TF32 on a GPU takes the torch path (cuBLAS's fp32 GEMMs run
    faster than Triton's exact-fp32 dot: benchmarks/README.md, "On a GPU"); 16-bit operands, TF32,
    an explicit "triton" (argument or environment) and CPU tensors keep their choice."""
    h = torch.zeros(2, 16)
    assert not L._cublas_is_faster("auto", h, torch.float32, False)  # a CPU tensor: no GPU launch
    monkeypatch.setattr(L, "_on_gpu", lambda t: True)
    assert L._cublas_is_faster("auto", h, torch.float32, False)
    assert not L._cublas_is_faster("auto", h, torch.float32, True)
    assert not L._cublas_is_faster("auto", h, torch.bfloat16, False)
    assert not L._cublas_is_faster("auto", h, torch.float16, False)
    assert not L._cublas_is_faster("triton", h, torch.float32, False)
    monkeypatch.setenv("FASTCRIT_KERNELS_BACKEND", "triton")
    assert not L._cublas_is_faster("auto", h, torch.float32, False)


@pytest.mark.parametrize("entropy", [True, False], ids=["logits_kept", "exps_kept"])
def test_logits_are_kept_within_the_budget_and_only_for_a_gradient(monkeypatch, entropy):
    """The torch path keeps the [N, V] logits (with the entropy; without it, their exps against each
    row block's shift) when N x V x 4 bytes fit keep_bytes and a gradient will be taken (a no-grad
    pass keeps nothing); kept or recomputed, the same values and gradients, and a second backward
    through the same graph (retain_graph) reads the kept buffer unchanged. The bias masks a third
    of the vocabulary with -inf, whole chunks and rows inside chunks."""
    import fastcrit_kernels._logprobs_torch as T

    seen = []
    real = T._torch_forward

    def spy(*args):
        seen.append(args[-1])
        return real(*args)

    monkeypatch.setattr(L, "_torch_forward", spy)
    N, H, V = 12, 16, 90
    hidden, weight, b, labels = _inputs((N,), H, V, torch.float32, bias=True, seed=4)
    with torch.no_grad():
        b[:25] = float("-inf")  # the first chunk of 20 and 5 rows of the next
        b[60:65] = float("-inf")
    labels = 30 + labels % 30
    results = {}
    for budget in (0, 4 * N * V - 1, 4 * N * V):
        out = fused_logprobs(
            hidden,
            weight,
            labels,
            bias=b,
            return_entropy=entropy,
            backend="torch",
            keep_bytes=budget,
            chunk_bytes=4 * N * 20,
        )
        out = out if entropy else (out,)
        loss = (out[0] * 1.3).sum() + (out[1].sum() if entropy else 0.0)
        first = torch.autograd.grad(loss, [hidden, weight, b], retain_graph=True)
        second = torch.autograd.grad(loss, [hidden, weight, b])
        for a, c in zip(first, second):
            torch.testing.assert_close(a, c, atol=0, rtol=0)
        results[budget] = (out, first)
        assert all(torch.isfinite(t).all() for t in out + first)
    assert seen == [False, False, True]  # 0 and one byte short recompute; exactly N x V x 4 keeps
    kept, recomputed = results[4 * N * V], results[0]
    for a, c in zip(kept[0] + kept[1], recomputed[0] + recomputed[1]):
        torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-5)
    seen.clear()
    with torch.no_grad():
        fused_logprobs(hidden, weight, labels, backend="torch", keep_bytes=1 << 30)
    fused_logprobs(hidden.detach(), weight.detach(), labels, backend="torch", keep_bytes=1 << 30)
    assert seen == [False, False]  # nothing will take a gradient: nothing kept
    assert L.keeps_logits(N, V, hidden, weight, None, 4 * N * V) and not L.keeps_logits(
        N, V, hidden.double(), weight, None, 4 * N * V
    )  # fp64 logits take twice the bytes
