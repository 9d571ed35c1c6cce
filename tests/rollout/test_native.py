import dataclasses
import math

import pytest
import torch
from native_params import greedy

from fastcrit.rollout.base import Engine
from fastcrit.rollout.batch import collate
from fastcrit.rollout.native import NativeEngine
from fastcrit.types import SamplingParams


def test_protocol_shapes_and_order(engine, prompts):
    assert isinstance(engine, Engine)
    out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6, temperature=1.0, seed=0))
    assert len(out) == len(prompts) * 3
    for k, r in enumerate(out):
        assert r.prompt_index == k // 3 and r.prompt_ids == prompts[k // 3]
        assert 1 <= len(r.output_ids) <= 6 and len(r.logprobs) == len(r.output_ids)
        assert all(math.isfinite(x) and x <= 0.0 for x in r.logprobs)
        assert r.finish_reason == ("length" if len(r.output_ids) == 6 else "stop")
    assert engine.generate([], greedy()) == []


@pytest.mark.parametrize("static", [True, False])
def test_n_samples_share_one_prefill(model_dir, prompts, static):
    engine = NativeEngine(model_dir, static_decode=static)
    assert (engine.static_decode_off is None) == static
    calls = []  # the token embedding sees every forward's input ids, on both decode paths
    hook = engine.model.model.embed_tokens.register_forward_pre_hook(
        lambda mod, args: calls.append(tuple(args[0].shape))
    )
    try:
        out = engine.generate(prompts, greedy(n=4, max_new=5))
    finally:
        hook.remove()
    prefills = [c for c in calls if c[1] > 1]
    assert prefills == [(len(prompts), max(map(len, prompts)))]  # one prefill, one row per prompt
    assert all(c == (len(prompts) * 4, 1) for c in calls[1:])  # decode runs all samples together
    for i in range(len(prompts)):  # greedy copies of a shared prefix must agree
        assert len({tuple(r.output_ids) for r in out[i * 4 : (i + 1) * 4]}) == 1


def test_static_decode_matches_the_hugging_face_forward(model_dir, prompts):
    """The lean static-cache decode path and Hugging Face's forward give the same samples: greedy,
    and sampled with one seed (the same random draws on near-identical logits), with log-probs
    within float rounding, through row compaction (stops) and n > 1."""
    fast, slow = NativeEngine(model_dir), NativeEngine(model_dir, static_decode=False)
    for params in (
        greedy(n=2, max_new=10),
        SamplingParams(n=3, max_new_tokens=12, temperature=1.0, seed=7),
        SamplingParams(n=2, max_new_tokens=9, temperature=0.8, top_p=0.9, top_k=20, seed=3),
    ):
        a, b = fast.generate(prompts, params), slow.generate(prompts, params)
        assert [r.output_ids for r in a] == [r.output_ids for r in b]
        assert [r.finish_reason for r in a] == [r.finish_reason for r in b]
        gaps = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra.logprobs, rb.logprobs)]
        assert gaps and max(gaps) < 1e-4


def test_static_decode_matches_hugging_face_on_qwen3(model_dir, prompts):
    """Qwen3's q/k norms take the path where q keeps its weight and is scaled in the step."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    base = NativeEngine(model_dir).model.config
    cfg = Qwen3Config(
        vocab_size=base.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        eos_token_id=base.eos_token_id,
        pad_token_id=base.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).float()
    with torch.no_grad():  # visible norms, not the ones they start at
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    _static_matches_hugging_face(model, prompts, n=3)


def _static_matches_hugging_face(model, prompts, n):
    """The static decoder samples what Hugging Face's forward does: the same tokens, log-probs
    within 1e-4, for ``n`` samples of each prompt."""
    fast = NativeEngine(model, tokenizer=None)
    assert fast.static_decode_off is None
    slow = NativeEngine(model, tokenizer=None, static_decode=False)
    params = SamplingParams(n=n, max_new_tokens=10, temperature=1.0, seed=5)
    a, b = fast.generate(prompts, params), slow.generate(prompts, params)
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    gaps = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra.logprobs, rb.logprobs)]
    assert gaps and max(gaps) < 1e-4


@pytest.mark.parametrize("hidden", [64, 256])  # 256: the MKL-packed projections (decode._PACK_MIN_HIDDEN)
def test_static_decode_matches_hugging_face_on_llama_with_biases(model_dir, prompts, hidden):
    """Llama's mlp_bias and attention_bias: the gate/up biases (outside the fused weights) and the
    q/k/v/o ones reach the step, packed or not."""
    from transformers import LlamaConfig, LlamaForCausalLM

    base = NativeEngine(model_dir).model.config
    cfg = LlamaConfig(
        vocab_size=base.vocab_size,
        hidden_size=hidden,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=base.eos_token_id,
        pad_token_id=base.pad_token_id,
        mlp_bias=True,
        attention_bias=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # biases start at zero, which would hide a dropped one
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    _static_matches_hugging_face(model, prompts, n=2)


def test_fixed_shape_decode_steps_match_the_sliced_ones(model_dir, prompts):
    """The fixed-shape step (whole cache width under the key mask, column and positions in buffers:
    what a CUDA graph captures) gives the sliced step's logits at every step, eagerly on CPU."""
    from fastcrit.rollout.decode import StaticDecoder

    engine = NativeEngine(model_dir)
    plen, new, n = max(len(p) for p in prompts), 7, 2
    ids = torch.full((len(prompts), plen), engine.pad_token_id)
    mask = torch.zeros((len(prompts), plen), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, plen - len(p) :], mask[r, plen - len(p) :] = torch.tensor(p), 1
    sliced = StaticDecoder(engine.model, len(prompts), plen, new)
    fixed = StaticDecoder(engine.model, len(prompts), plen, new, fixed=True)
    a, b = sliced.prefill(ids, mask), fixed.prefill(ids, mask)
    torch.testing.assert_close(a, b)
    sliced.repeat_interleave(n)
    fixed.repeat_interleave(n)
    a, b = a.repeat_interleave(n, 0), b.repeat_interleave(n, 0)
    for _ in range(new):
        tok = a.argmax(-1)
        a, b = sliced.step(tok), fixed.step(tok).clone()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="holds 7 generated tokens"):
        fixed.step(tok)
    with pytest.raises(RuntimeError, match="keeps its rows"):
        fixed.select(torch.tensor([0]))
    with pytest.raises(ValueError, match="needs fixed=True"):
        StaticDecoder(engine.model, 1, plen, new, graph=True)


def test_shared_prompt_cache_through_uneven_compaction(model_dir, prompts):
    """A prompt's cache is stored once for its n rows (stacked queries); after ``select`` drops a row
    before the first step, keeps 2, 3, 0 and 1 rows of the four prompts, and then drops a whole
    prompt more, every row's logits still equal Hugging Face's forward over a per-row cache."""
    from fastcrit.rollout.decode import StaticDecoder
    from fastcrit.rollout.native import _HFDecoder

    engine = NativeEngine(model_dir)
    plen, n = max(len(p) for p in prompts), 3
    ids = torch.full((len(prompts), plen), engine.pad_token_id)
    mask = torch.zeros((len(prompts), plen), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, plen - len(p) :], mask[r, plen - len(p) :] = torch.tensor(p), 1
    ours, ref = StaticDecoder(engine.model, len(prompts), plen, 8), _HFDecoder(engine.model)
    with torch.inference_mode():
        a, b = ours.prefill(ids, mask), ref.prefill(ids, mask)
        assert ours.kp[0].shape[0] == len(prompts)
        ours.repeat_interleave(n)
        ref.repeat_interleave(n)
        a = a.repeat_interleave(n, 0)
        assert ours.kp[0].shape[0] == len(prompts)  # the prompt part is not copied
        # before the first step (the engine compacts after sampling the first token), then twice more
        keeps = {
            0: torch.tensor([0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11]),
            2: torch.tensor([0, 2, 3, 4, 5, 10]),
            5: torch.tensor([0, 1, 5]),
        }
        for t in range(7):
            if t in keeps:
                ours.select(keeps[t])
                ref.select(keeps[t])
                a = a[keeps[t]]
            tok = a.argmax(-1)
            a, b = ours.step(tok), ref.step(tok)
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        assert ours.kp[0].shape[0] == 2 and ours.slot is not None  # prompts 0 and 3 are left, 2 rows and 1 row


def test_mkl_packed_projections_decode_as_the_plain_ones(model_dir, prompts):
    """On a CPU torch with MKL the decode step runs its projections on weights pre-packed for the
    row count (decode.mkl_packing): the same logits as the plain linears, through a compaction;
    packs follow the rows (dropped by select, made again while enough steps are left)."""
    from fastcrit.rollout.decode import StaticDecoder, mkl_packing

    engine = NativeEngine(model_dir)
    if not mkl_packing(engine.model):
        pytest.skip("this torch has no MKL (torch.ops.mkl._mkl_linear): the decode runs plain linears")
    plen, n, new = max(len(p) for p in prompts), 2, 10
    ids = torch.full((len(prompts), plen), engine.pad_token_id)
    mask = torch.zeros((len(prompts), plen), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, plen - len(p) :], mask[r, plen - len(p) :] = torch.tensor(p), 1
    packed, plain = (
        StaticDecoder(engine.model, len(prompts), plen, new),
        StaticDecoder(engine.model, len(prompts), plen, new),
    )
    assert not packed.packing  # hidden 64: too narrow for packing to pay (decode._PACK_MIN_HIDDEN)
    packed.packing = True
    with torch.inference_mode():
        a, b = packed.prefill(ids, mask), plain.prefill(ids, mask)
        for d in (packed, plain):
            d.repeat_interleave(n)
        a, b = a.repeat_interleave(n, 0), b.repeat_interleave(n, 0)
        rows = []
        for t in range(new):
            if t == 3:
                keep = torch.tensor([0, 2, 3, 5, 6])
                for d in (packed, plain):
                    d.select(keep)
                assert packed._packs is None  # packed for 8 rows, not 5
                a, b = a[keep], b[keep]
            tok = a.argmax(-1)
            a, b = packed.step(tok), plain.step(tok)
            rows.append(packed._packed_rows)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert plain._packs is None
    # 8 rows, then 5 after the compaction; no new packs are made with fewer than 4 steps left
    assert rows == [8, 8, 8, 5, 5, 5, 5, 5, 5, 5]
    late = StaticDecoder(engine.model, len(prompts), plen, new)
    late.packing = True
    with torch.inference_mode():
        late.prefill(ids, mask)
        late.t = new - 3  # three steps left: packing would not pay
        late.step(torch.zeros(len(prompts), dtype=torch.long))
    assert late._packs is None and late._packed_rows == 0


def test_cuda_graph_needs_a_cuda_device(model_dir):
    with pytest.raises(ValueError, match="needs a CUDA device"):
        NativeEngine(model_dir, cuda_graph=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_cuda_graph_decode_matches_eager(model_dir, prompts):
    graphed = NativeEngine(model_dir, device="cuda", cuda_graph=True)
    eager = NativeEngine(model_dir, device="cuda")
    for params in (greedy(n=2, max_new=10), SamplingParams(n=3, max_new_tokens=12, temperature=1.0, seed=7)):
        a, b = graphed.generate(prompts, params), eager.generate(prompts, params)
        assert [r.output_ids for r in a] == [r.output_ids for r in b]
        gaps = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra.logprobs, rb.logprobs)]
        assert max(gaps) < 1e-3


def test_unsupported_architectures_fall_back_with_a_reason(model_dir):
    from fastcrit.rollout.decode import unsupported

    engine = NativeEngine(model_dir)
    assert unsupported(engine.model) is None
    engine.model.config.model_type = "gpt2"
    assert "gpt2" in unsupported(engine.model)
    engine.model.config.model_type = "qwen2"
    engine.model.config.layer_types = ["sliding_attention"] * engine.model.config.num_hidden_layers
    assert "full attention" in unsupported(engine.model)


def test_liger_style_mlp_without_act_fn_decodes_the_same(model_dir, prompts):
    """Liger's SwiGLU MLP (put into every Qwen2 loaded after the trainer's model.liger patch) has
    gate/up/down but no act_fn: the static decoder (and so the CUDA-graph one) takes SiLU from
    hidden_act and gives the same tokens; another activation without act_fn falls back, named."""
    from fastcrit.rollout.decode import unsupported

    engine = NativeEngine(model_dir)
    before = engine.generate(prompts, greedy(max_new=8))
    for layer in engine.model.model.layers:
        del layer.mlp.act_fn
    assert unsupported(engine.model) is None
    assert [r.output_ids for r in engine.generate(prompts, greedy(max_new=8))] == [r.output_ids for r in before]
    engine.model.config.hidden_act = "gelu"
    assert "other than SiLU" in unsupported(engine.model)


def test_greedy_matches_hf_generate(engine, tok, prompts):
    out = engine.generate(prompts, greedy(max_new=12))
    enc = tok.pad([{"input_ids": p} for p in prompts], return_tensors="pt")
    with torch.no_grad():
        ref = engine.model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    ref = ref[:, enc["input_ids"].shape[1] :].tolist()
    for r, h in zip(out, ref):
        if tok.eos_token_id in h:
            h = h[: h.index(tok.eos_token_id) + 1]
        assert r.output_ids == h
    # Batching and padding change nothing: each prompt alone gives the same tokens.
    for p, r in zip(prompts, out):
        assert engine.generate([p], greedy(max_new=12))[0].output_ids == r.output_ids


def test_stop_tokens_and_max_new_tokens(engine, prompts):
    free = engine.generate(prompts, greedy(max_new=10))
    assert all(r.finish_reason == "length" and len(r.output_ids) == 10 for r in free)
    stop = free[0].output_ids[3]
    cut = free[0].output_ids.index(stop) + 1
    out = engine.generate(prompts, greedy(max_new=10, stop_token_ids=[stop]))
    assert out[0].output_ids == free[0].output_ids[:cut] and out[0].finish_reason == "stop"
    assert out[0].output_ids[-1] == stop  # the stop token is part of the output
    for f, r in zip(free, out):  # every sample ends at its first stop token or at the limit
        k = f.output_ids.index(stop) + 1 if stop in f.output_ids else 10
        assert r.output_ids == f.output_ids[:k]
        assert r.logprobs == pytest.approx(f.logprobs[:k], abs=1e-6)
    one = engine.generate(prompts[:1], greedy(max_new=1))
    assert len(one[0].output_ids) == 1 and one[0].finish_reason == "length"


def test_finished_rows_leave_the_batch_without_changing_results(model_dir, prompts):
    lazy = NativeEngine(model_dir, compact_fraction=1.0)
    eager = NativeEngine(model_dir, compact_fraction=0.01)
    free = lazy.generate(prompts, greedy(n=2, max_new=10))
    # A stop token that ends some samples early and never appears in others.
    stop = next(t for r in free for t in r.output_ids[:5] if any(t not in o.output_ids for o in free))
    params = greedy(n=2, max_new=10, stop_token_ids=[stop])
    sizes = []
    hook = eager.model.model.embed_tokens.register_forward_pre_hook(lambda mod, args: sizes.append(args[0].shape[0]))
    a, b = lazy.generate(prompts, params), eager.generate(prompts, params)
    hook.remove()
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert min(sizes[1:]) < len(prompts) * 2  # decoding continued with fewer rows


def test_logprobs_match_full_forward(engine, tok, prompts):
    for params in (
        SamplingParams(n=3, max_new_tokens=10, temperature=0.7, top_k=20, top_p=0.9, seed=3),
        SamplingParams(n=2, max_new_tokens=10, temperature=1.3, seed=4),
        greedy(max_new=10, stop_token_ids=[engine.generate(prompts[:1], greedy())[0].output_ids[2]]),
    ):
        rollouts = engine.generate(prompts, params)
        batch = collate(rollouts, tok.pad_token_id)
        temp = params.temperature or 1.0
        with torch.no_grad():
            logits = engine.model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
            ).logits.float()
        P, R = batch.prompts.shape[1], batch.responses.shape[1]
        lp = torch.log_softmax(logits[:, P - 1 : P + R - 1] / temp, dim=-1)
        lp = lp.gather(2, batch.responses[:, :, None]).squeeze(2)
        m = batch.response_mask.bool()
        assert torch.allclose(lp[m], batch.old_logprobs[m], atol=1e-4, rtol=0)


def test_top_k_one_is_greedy_and_top_p_restricts(engine, prompts):
    g = engine.generate(prompts, greedy(max_new=6))
    k1 = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.8, top_k=1, seed=0))
    assert [r.output_ids for r in k1] == [r.output_ids for r in g]
    p0 = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.8, top_p=1e-6, seed=0))
    assert [r.output_ids for r in p0] == [r.output_ids for r in g]


def test_one_greedy_rule_for_engines_and_trainer(engine, prompts):
    """Below GREEDY_BELOW (SGLang's 1e-6) is greedy and scored at T = 1; at it, sampling at T."""
    from fastcrit.types import GREEDY_BELOW, is_greedy, scoring_temperature

    assert GREEDY_BELOW == 1e-6
    assert is_greedy(0.0) and is_greedy(9.9e-7) and not is_greedy(1e-6) and not is_greedy(1e-5)
    assert scoring_temperature(0.0) == scoring_temperature(5e-7) == 1.0 and scoring_temperature(0.7) == 0.7
    g = engine.generate(prompts, greedy(max_new=6))
    tiny = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=5e-7, seed=0))
    assert [(r.output_ids, r.logprobs) for r in tiny] == [(r.output_ids, r.logprobs) for r in g]
    # 1e-5 is no longer greedy: its log-probs are scored at T = 1e-5 (near 0 for the drawn argmax)
    cold = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1e-5, seed=0))
    assert max(-lp for r in cold for lp in r.logprobs) < max(-lp for r in g for lp in r.logprobs)


def test_stop_set_is_the_one_sglang_is_sent(model_dir):
    """Tokenizer EOS | config EOS | generation-config EOS: what the native engine stops on and what
    the SGLang engine sends as stop_token_ids (SGLang without a tokenizer knows only the configs')."""
    from types import SimpleNamespace

    from fastcrit.models.hf import eos_token_ids, model_eos_token_ids

    assert eos_token_ids(
        SimpleNamespace(eos_token_id=5), SimpleNamespace(eos_token_id=[7, 5]), SimpleNamespace(eos_token_id=None), None
    ) == [5, 7]
    assert NativeEngine(model_dir).eos_token_ids == model_eos_token_ids(model_dir)


def test_seeded_sampling_is_reproducible(engine, prompts):
    params = SamplingParams(n=4, max_new_tokens=8, temperature=1.0, top_p=0.95, seed=123)
    a, b = engine.generate(prompts, params), engine.generate(prompts, params)
    assert [(r.output_ids, r.logprobs) for r in a] == [(r.output_ids, r.logprobs) for r in b]
    c = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=8, temperature=1.0, top_p=0.95, seed=124))
    assert [r.output_ids for r in a] != [r.output_ids for r in c]
    # n samples of one prompt are different draws, not copies.
    assert len({tuple(r.output_ids) for r in a[:4]}) > 1


def test_a_seeded_sample_does_not_depend_on_its_batch(model_dir, prompts):
    """Sample k of a call draws from seed + k alone: a prompt split off into its own call with the
    seed moved by its samples' offset (what each rank does with its share of a step's prompts), or
    generated under another max_batch, gives the same samples."""
    params = SamplingParams(n=3, max_new_tokens=8, temperature=1.0, top_k=50, seed=2**40 + 5)
    whole = NativeEngine(model_dir).generate(prompts, params)
    small = NativeEngine(model_dir, max_batch=2)
    parts = [
        r
        for i, p in enumerate(prompts)
        for r in small.generate([p], dataclasses.replace(params, seed=params.seed + 3 * i))
    ]
    assert [r.output_ids for r in whole] == [r.output_ids for r in parts]
    for a, b in zip(whole, parts):
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def test_counter_based_uniforms_are_uniform_and_independent():
    from fastcrit.rollout.sampling import uniforms

    u = uniforms(-7, torch.arange(4000), 50)  # a negative seed wraps mod 2**64
    assert u.dtype == torch.float64 and u.min() >= 0 and u.max() < 1
    counts = torch.histc(u.flatten(), bins=20, min=0, max=1) / u.numel()
    torch.testing.assert_close(counts, torch.full((20,), 0.05, dtype=counts.dtype), atol=0.003, rtol=0)
    flat = u.flatten() - 0.5
    for a, b in ((u[:, :-1], u[:, 1:]), (u[:-1], u[1:])):  # neighbouring positions, neighbouring rows
        assert abs(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1]) < 0.01
    assert abs(flat.mean()) < 0.005
    # the key is seed + k: row k of seed s is row 0 of seed s + k, also across the 32-bit carry
    s = 2**32 - 2
    torch.testing.assert_close(uniforms(s, torch.arange(5), 7)[3], uniforms(s + 3, torch.arange(1), 7)[0])
    assert not torch.equal(uniforms(0, torch.arange(2), 7)[1], uniforms(2**32 + 1, torch.arange(1), 7)[0])


def test_chunking_by_max_batch(model_dir, prompts):
    small = NativeEngine(model_dir, max_batch=3)
    big = NativeEngine(model_dir)
    a, b = small.generate(prompts, greedy(n=2, max_new=6)), big.generate(prompts, greedy(n=2, max_new=6))
    assert [(r.prompt_index, r.output_ids) for r in a] == [(r.prompt_index, r.output_ids) for r in b]


def test_load_weights(engine, model_dir, tok, prompts):
    from fastcrit.models.hf import load_model

    before = engine.generate(prompts, greedy(max_new=6))
    other = load_model(model_dir)
    state = other.state_dict()
    # Swap the head rows of EOS and of prompt 0's first greedy token: that sample must now stop at
    # once with EOS (EOS is a stop token without being asked for).
    first, eos = before[0].output_ids[0], tok.eos_token_id
    head = state["lm_head.weight"].clone()
    head[[first, eos]] = head[[eos, first]]
    engine.load_weights([("lm_head.weight", head)])
    out = engine.generate(prompts, greedy(max_new=6))
    assert out[0].output_ids == [eos] and out[0].finish_reason == "stop"
    # The trainer's full state dict, in two buckets, restores the original behaviour.
    items = list(state.items())
    engine.load_weights(items[:5])
    engine.load_weights(items[5:])
    assert [r.output_ids for r in engine.generate(prompts, greedy(max_new=6))] == [r.output_ids for r in before]
    with torch.no_grad():
        perturbed = {k: v + 0.05 * torch.randn_like(v) for k, v in state.items() if k.endswith("proj.weight")}
    engine.load_weights(perturbed.items())
    assert [r.output_ids for r in engine.generate(prompts, greedy(max_new=6))] != [r.output_ids for r in before]
    with pytest.raises(KeyError, match="no weight named 'model.nope'"):
        engine.load_weights([("model.nope", head)])
    with pytest.raises(ValueError, match="lm_head.weight"):
        engine.load_weights([("lm_head.weight", head[:3])])


def _load_weights_with_a_dtensor(ctx, engine):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    before = engine.model.lm_head.weight.detach().clone()
    sharded = distribute_tensor(before + 1.0, init_device_mesh("cpu", (1,)), [Shard(0)])
    with pytest.raises(TypeError, match="'lm_head.weight' is a sharded DTensor"):
        engine.load_weights([("lm_head.weight", sharded)])
    assert torch.equal(engine.model.lm_head.weight, before)
    engine.load_weights([("lm_head.weight", sharded.full_tensor())])  # what train/ hands over
    assert torch.equal(engine.model.lm_head.weight, before + 1.0)


def test_load_weights_refuses_a_dtensor(engine):
    """Gathering is a collective, which stays in train/: the engine names a DTensor and copies nothing."""
    from fastcrit.train.dist import launch

    launch(_load_weights_with_a_dtensor, (engine,), 1, "cpu")


def test_sleep_wake_close(engine, prompts):
    """sleep frees every weight's memory (the engine's own count drops to its few buffer bytes) and
    keeps no copy; wake allocates it again and, as SGLang, generate waits for every weight to be
    loaded; then it samples what it sampled before."""
    held = engine.held_bytes()
    weights = {k: v.clone() for k, v in engine.model.state_dict().items()}
    before = engine.generate(prompts, greedy(max_new=4))
    engine.sleep()
    assert engine.held_bytes() < 0.01 * held
    assert all(p.numel() == 0 for p in engine.model.parameters())
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(prompts, greedy())
    with pytest.raises(RuntimeError, match="asleep"):
        engine.load_weights(weights.items())
    engine.wake()
    assert engine.held_bytes() == held
    with pytest.raises(RuntimeError, match="without their values"):
        engine.generate(prompts, greedy())
    names = list(weights)
    engine.load_weights((k, weights[k]) for k in names[:-1])  # one weight short: still refused
    with pytest.raises(RuntimeError, match="1 missing"):
        engine.generate(prompts, greedy())
    engine.load_weights([(names[-1], weights[names[-1]])])
    assert engine.generate(prompts, greedy(max_new=4)) == before
    engine.close()


def test_sleep_with_a_host_copy_wakes_with_its_weights(model_dir, prompts):
    """cpu_backup (a frozen model no trainer reloads, CTRL's proxy): sleep frees the weights' device
    memory as without it, and wake restores their values: generate needs no load_weights."""
    eng = NativeEngine(model_dir, cpu_backup=True)
    held = eng.held_bytes()
    before = eng.generate(prompts, greedy(max_new=4))
    eng.sleep()
    assert eng.held_bytes() < 0.01 * held
    eng.wake()
    assert eng.held_bytes() == held
    assert eng.generate(prompts, greedy(max_new=4)) == before
    eng.sleep()  # again: a second backup of the restored weights
    eng.wake()
    assert eng.generate(prompts, greedy(max_new=4)) == before
    eng.close()


@pytest.mark.gpu
def test_sleep_gives_cuda_memory_back(model_dir, prompts):
    """On CUDA what sleep frees is the allocator's: memory_allocated drops by the weights' bytes (and
    whatever the engine keeps between calls), and wake takes the weights' bytes back."""
    eng = NativeEngine(model_dir, device="cuda")
    weights = {k: v.clone() for k, v in eng.model.state_dict().items()}
    eng.generate(prompts, greedy(max_new=2))
    held, alloc = eng.held_bytes(), torch.cuda.memory_allocated()
    eng.sleep()
    slept = torch.cuda.memory_allocated()
    assert alloc - slept >= 0.99 * held
    eng.wake()
    assert 0.99 * held <= torch.cuda.memory_allocated() - slept <= alloc - slept
    eng.load_weights(weights.items())
    assert len(eng.generate(prompts, greedy(max_new=2))) == len(prompts)
    eng.close()
    with pytest.raises(RuntimeError, match="closed"):
        eng.generate(prompts, greedy())


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(n=0), "n=0"),
        (dict(max_new_tokens=0), "max_new_tokens=0"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(stop_token_ids=[10**6]), "stop_token_ids"),
        (dict(max_new_tokens=10**5), "max_position_embeddings"),
    ],
)
def test_bad_params_are_named(engine, prompts, bad, match):
    with pytest.raises(ValueError, match=match):
        engine.generate(prompts, SamplingParams(**bad))


def test_bad_prompts_are_named(engine):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1, 2], []], greedy())
    with pytest.raises(ValueError, match="prompt 0 holds token id 99999"):
        engine.generate([[1, 99999]], greedy())


def test_bfloat16_engine_generates(model_dir, prompts):
    eng = NativeEngine(model_dir, dtype="bfloat16")
    out = eng.generate(prompts, SamplingParams(n=2, max_new_tokens=4, temperature=1.0, seed=0))
    assert len(out) == 8 and all(math.isfinite(x) for r in out for x in r.logprobs)


def _full_forward_logits(engine, tok, rollouts):
    batch = collate(rollouts, tok.pad_token_id)
    with torch.no_grad():
        logits = engine.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits.float()
    P, R = batch.prompts.shape[1], batch.responses.shape[1]
    return logits[:, P - 1 : P + R - 1], batch


@pytest.mark.parametrize("top_k, top_p", [(3, 1.0), (-1, 0.3), (5, 0.5)])
def test_samples_stay_inside_top_k_top_p(engine, tok, prompts, top_k, top_p):
    params = SamplingParams(n=6, max_new_tokens=8, temperature=1.5, top_k=top_k, top_p=top_p, seed=11)
    logits, batch = _full_forward_logits(engine, tok, engine.generate(prompts, params))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    rank = (order == batch.responses[:, :, None]).float().argmax(dim=-1)  # [B, R] rank of the drawn token
    mass_before = (sorted_p.cumsum(-1) - sorted_p).gather(2, rank[:, :, None]).squeeze(2)
    m = batch.response_mask.bool()
    if top_k > 0:
        assert int(rank[m].max()) < top_k
    if top_p < 1.0:
        assert float(mass_before[m].max()) <= top_p + 1e-5
    # Filtering must bite: without it, draws at T=1.5 from a near-uniform model land far down the list.
    free = engine.generate(prompts, SamplingParams(n=6, max_new_tokens=8, temperature=1.5, seed=11))
    flogits, fbatch = _full_forward_logits(engine, tok, free)
    frank = (flogits.argsort(dim=-1, descending=True) == fbatch.responses[:, :, None]).float().argmax(dim=-1)
    assert int(frank[fbatch.response_mask.bool()].max()) >= 5


def test_inverse_cdf_draw_follows_the_distribution_and_skips_zeros():
    from fastcrit.rollout.sampling import draw

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.2, 0.3, 0.0]]).repeat(40000, 1)
    got = draw(probs, torch.rand(40000, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    counts = torch.bincount(got, minlength=6).float() / len(got)
    assert counts[[0, 2, 5]].sum() == 0  # zero entries, the last one included, are never drawn
    torch.testing.assert_close(counts, probs[0], atol=0.01, rtol=0)
    # unnormalised rows and a row whose mass sits on its last entry
    odd = torch.tensor([[2.0, 0.0, 6.0], [0.0, 0.0, 1e-30]])
    out = draw(odd.repeat(2000, 1), torch.rand(4000, generator=torch.Generator().manual_seed(1))).view(2000, 2)
    assert set(out[:, 1].tolist()) == {2}
    assert 0.70 < (out[:, 0] == 2).float().mean() < 0.80 and (out[:, 0] == 1).sum() == 0
    # u that rounds to 1 in the cdf's dtype picks the last positive entry, not past the end or a zero
    edge = draw(
        torch.tensor([[0.25, 0.75, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]),
        torch.tensor([1.0 - 2.0**-60, 0.0], dtype=torch.float64),
    )
    assert edge.tolist() == [1, 1]
