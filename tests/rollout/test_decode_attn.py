"""The native engine's C decode attention (fastcrit/rollout/decode_attn.py, native/decode_attn.c)
against an fp64 reference, and the decoder's two paths (C and torch ops) against each other."""

import pytest
import torch

from fastcrit.rollout import decode_attn
from fastcrit.rollout.native import NativeEngine
from fastcrit.types import SamplingParams

needs_lib = pytest.mark.skipif(
    not decode_attn.available(),
    reason="the C decode attention was not built (pip install builds it with cmake and OpenMP)",
)


def _reference(q, kp, vp, bias_p, group, kg, vg, scale):
    """fp64 attention of each row's queries over its prompt's keys (under the bias) and its own
    generated keys, as the torch path computes it."""
    rows, heads, d = q.shape
    kv = kp.shape[1]
    k = torch.cat([kp[group], kg], 2).double()  # [rows, kv, P + n, d]
    v = torch.cat([vp[group], vg], 2).double()
    bias = torch.cat([bias_p[group], torch.zeros(rows, kg.shape[2], dtype=bias_p.dtype)], 1).double()
    qq = q.double().view(rows, kv, heads // kv, d) * scale
    s = qq @ k.transpose(-1, -2) + bias[:, None, None, :]
    return (torch.softmax(s, -1) @ v).view(rows, heads, d)


@needs_lib
@pytest.mark.parametrize("heads, kv, d", [(4, 2, 16), (6, 2, 32), (7, 1, 64), (8, 8, 128), (3, 3, 16)])
@pytest.mark.parametrize("prompt_len", [16, 21])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_matches_an_fp64_reference(heads, kv, d, prompt_len, threads):
    """Steps 0-18 (across a block of 16 keys) for rows of uneven prompts (a prompt with 1 row, one
    with 3, one with 2; left padding under -inf), with scores large enough that the softmax spans
    ~40 nats: every output to fp32 rounding, and each step's key and value land in the caches."""
    g = torch.Generator().manual_seed(heads * 100 + d + prompt_len)
    group = torch.tensor([0, 1, 1, 1, 2, 2])
    rows, prompts, steps = len(group), 3, 19
    kp = torch.randn(prompts, kv, prompt_len, d, generator=g)
    vp = torch.randn(prompts, kv, prompt_len, d, generator=g)
    bias_p = torch.zeros(prompts, prompt_len)
    bias_p[0, :5] = float("-inf")
    bias_p[2, :1] = float("-inf")
    kp_t = decode_attn.key_cache((prompts, kv), prompt_len, d, torch.float32)
    decode_attn.store_keys(kp_t, kp)
    kg_t = decode_attn.key_cache((rows, kv), steps, d, torch.float32)
    vg = torch.zeros(rows, kv, decode_attn.padded(steps), d)
    scale = d**-0.5
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        scratch = torch.empty(threads * 2 * (kp_t.shape[2] + kg_t.shape[2]) * decode_attn.BLOCK)
        ks, vs = [], []
        for t in range(steps):
            q = torch.randn(rows, heads, 1, d, generator=g) * 3
            k, v = torch.randn(rows, kv, 1, d, generator=g), torch.randn(rows, kv, 1, d, generator=g)
            ks.append(k)
            vs.append(v)
            out = decode_attn.attend(q, k, v, kp_t, vp, bias_p, group, kg_t, vg, t, scale, scratch)
            ref = _reference(q[:, :, 0], kp, vp, bias_p, group, torch.cat(ks, 2), torch.cat(vs, 2), scale)
            torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-4)
    finally:
        torch.set_num_threads(old)
    # the caches hold every step's key and value (the keys in the blocked layout)
    got_k = kg_t.transpose(-1, -2).reshape(rows, kv, -1, d)[:, :, :steps]
    torch.testing.assert_close(got_k, torch.cat(ks, 2))
    torch.testing.assert_close(vg[:, :, :steps], torch.cat(vs, 2))


@needs_lib
def test_strided_queries_and_keys_are_read_in_place():
    """q and k as the decoder has them (head slices of one rotated [rows, heads + kv, 1, d] tensor,
    v a view of the fused projection's output): the same result as contiguous copies."""
    rows, heads, kv, d, plen = 4, 4, 2, 32, 9
    g = torch.Generator().manual_seed(0)
    qk = torch.randn(rows, heads + kv, 1, d, generator=g)
    qkv = torch.randn(rows, 1, (heads + 2 * kv) * d, generator=g)
    v = qkv[..., (heads + kv) * d :].view(rows, 1, kv, d).transpose(1, 2)
    kp = torch.randn(2, kv, plen, d, generator=g)
    vp = torch.randn(2, kv, plen, d, generator=g)
    bias_p, group = torch.zeros(2, plen), torch.tensor([0, 0, 1, 1])
    outs = []
    for contiguous in (False, True):
        kp_t = decode_attn.key_cache((2, kv), plen, d, torch.float32)
        decode_attn.store_keys(kp_t, kp)
        kg_t = decode_attn.key_cache((rows, kv), 4, d, torch.float32)
        vg = torch.zeros(rows, kv, 16, d)
        q, k, vv = qk[:, :heads], qk[:, heads:], v
        if contiguous:
            q, k, vv = q.contiguous(), k.contiguous(), vv.contiguous()
        outs.append(decode_attn.attend(q, k, vv, kp_t, vp, bias_p, group, kg_t, vg, 0, 0.2, torch.empty(4096)))
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)


@needs_lib
def test_bad_shapes_are_refused_by_name():
    kp_t = decode_attn.key_cache((1, 1), 4, 16, torch.float32)
    kg_t = decode_attn.key_cache((1, 1), 4, 16, torch.float32)
    args = (torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16))
    rest = (kp_t, torch.randn(1, 1, 4, 16), torch.zeros(1, 4), torch.zeros(1, dtype=torch.long), kg_t)
    vg = torch.zeros(1, 1, 16, 16)
    with pytest.raises(ValueError, match="scratch holds 3 floats"):
        decode_attn.attend(*args, *rest, vg, 0, 1.0, torch.empty(3))
    with pytest.raises(ValueError, match="refused by the C kernel"):
        decode_attn.attend(*args, *rest, vg, 16, 1.0, torch.empty(4096))  # step 16 of a 16-column cache
    with pytest.raises(ValueError, match="vg must be contiguous"):
        decode_attn.attend(*args, *rest, torch.zeros(1, 1, 16, 32)[..., :16], 0, 1.0, torch.empty(4096))
    with pytest.raises(ValueError, match="refused by the C kernel"):
        decode_attn.attend(*args, *rest, vg, -1, 1.0, torch.empty(4096))
    with pytest.raises(ValueError, match=r"group is torch.int32 \(1,\) on cpu, expected torch.int64"):
        decode_attn.attend(*args, *rest[:3], torch.zeros(1, dtype=torch.int32), kg_t, vg, 0, 1.0, torch.empty(4096))
    with pytest.raises(
        ValueError, match=r"kg_t is torch.float32 \(1, 1, 2, 16, 16\) on cpu, expected .* \(1, 1, 1, 16"
    ):
        decode_attn.attend(
            *args, *rest[:4], decode_attn.key_cache((1, 1), 32, 16, torch.float32), vg, 0, 1.0, torch.empty(4096)
        )
    with pytest.raises(ValueError, match="q is torch.bfloat16"):
        decode_attn.attend(args[0].bfloat16(), *args[1:], *rest, vg, 0, 1.0, torch.empty(4096))
    assert not decode_attn.usable(torch.float32, torch.device("cpu"), 24)  # not a multiple of 16
    assert not decode_attn.usable(torch.bfloat16, torch.device("cpu"), 32)
    assert not decode_attn.usable(torch.float32, torch.device("cpu"), 1024)


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("FASTCRIT_DECODE_ATTN", "0")
    assert not decode_attn.available()
    assert not decode_attn.usable(torch.float32, torch.device("cpu"), 32)


@needs_lib
def test_engine_samples_the_same_tokens_on_both_paths(model_dir, prompts, monkeypatch):
    """The whole engine with the C attention and with the torch ops (FASTCRIT_DECODE_ATTN=0):
    the same tokens, greedy and seeded-sampled, with a stop token that ends some samples early
    (their rows leave the batch mid-generation), and log-probs equal to fp32 rounding."""
    engine = NativeEngine(model_dir, compact_fraction=0.01)
    free = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=40, temperature=1.0, seed=5))
    stop = next(t for r in free for t in r.output_ids[2:8] if any(t not in o.output_ids for o in free))
    results = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("FASTCRIT_DECODE_ATTN", flag)
        for temp in (0.0, 1.0):
            params = SamplingParams(n=3, max_new_tokens=40, temperature=temp, seed=5, stop_token_ids=[stop])
            results[flag, temp] = engine.generate(prompts, params)
    for temp in (0.0, 1.0):
        a, b = results["1", temp], results["0", temp]
        assert [r.output_ids for r in a] == [r.output_ids for r in b]
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
    lengths = [len(r.output_ids) for r in results["1", 1.0]]
    assert min(lengths) < 10 and max(lengths) == 40  # rows left the batch while others went on


@needs_lib
def test_decoder_uses_it_where_it_applies(model_dir):
    from fastcrit.rollout.decode import StaticDecoder, c_attention

    engine = NativeEngine(model_dir)
    assert c_attention(engine.model) and not c_attention(engine.model, fixed=True)
    assert StaticDecoder(engine.model, 2, 5, 4).native_attn  # fp32 on a CPU, head size 16
    assert not StaticDecoder(engine.model, 2, 5, 4, fixed=True).native_attn  # a fixed step keeps torch ops


@needs_lib
def test_a_library_of_another_interface_is_not_called(monkeypatch):
    """A library built from another version of decode_attn.c (a pull without a reinstall) is
    refused with a warning naming both versions; the torch ops run instead."""
    monkeypatch.setattr(decode_attn, "_lib", None)
    monkeypatch.setattr(decode_attn, "ABI", decode_attn.ABI + 1)
    with pytest.warns(UserWarning, match=f"has interface {decode_attn.ABI - 1}, this fastcrit needs {decode_attn.ABI}"):
        assert not decode_attn.available()
    assert not decode_attn.usable(torch.float32, torch.device("cpu"), 32)
