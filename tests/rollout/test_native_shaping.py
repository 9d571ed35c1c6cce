"""The native engine's serving extras: stop strings, penalties and logit bias, top log-probs, and
the per-step callback `fastcrit serve` streams with."""

import pytest
import torch
from native_params import greedy

from fastcrit.rollout.native import NativeEngine
from fastcrit.types import SamplingParams


def test_stop_strings_end_a_sample_at_the_token_that_completes_them(engine, tok, prompts):
    free = engine.generate(prompts, greedy(max_new=12))
    stop = tok.decode(free[0].output_ids[4:6], skip_special_tokens=False)
    engine.tokenizer = tok
    out = engine.generate(prompts, greedy(max_new=12, stop=[stop, "never in these texts \x00"]))
    for f, r in zip(free, out):  # the slow oracle: the first prefix whose text holds the string
        k = next((k for k in range(1, 13) if stop in tok.decode(f.output_ids[:k], skip_special_tokens=False)), 12)
        assert r.output_ids == f.output_ids[:k]
        assert r.finish_reason == ("stop" if k < 12 or stop in tok.decode(f.output_ids) else "length")
    assert out[0].finish_reason == "stop" and len(out[0].output_ids) <= 6
    engine.tokenizer = None
    with pytest.raises(ValueError, match="stop strings need the engine's tokenizer"):
        engine.generate(prompts, greedy(stop=["x"]))


def _penalised_greedy_oracle(model, prompt, max_new, *, presence, frequency, repetition, bias):
    """Greedy decoding with a full forward pass per token and the penalties written out per token id."""
    ids, out, logps = list(prompt), [], []
    for _ in range(max_new):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        for t, v in bias.items():
            logits[t] += v
        for t in set(ids):  # the prompt's tokens and the output's so far
            logits[t] = logits[t] / repetition if logits[t] > 0 else logits[t] * repetition
        for t in set(out):
            logits[t] -= frequency * out.count(t) + presence
        nxt = int(logits.argmax())
        logps.append(float(torch.log_softmax(logits, -1)[nxt]))
        ids.append(nxt)
        out.append(nxt)
    return out, logps


def test_penalties_and_logit_bias_match_a_plain_loop(engine, prompts):
    for kw in (
        {"presence_penalty": 1.5},
        {"frequency_penalty": 0.7},
        {"repetition_penalty": 1.6},
        {
            "frequency_penalty": -0.5,
            "presence_penalty": 0.5,
            "repetition_penalty": 0.8,
            "logit_bias": {7: 3.0, 11: -2.0},
        },
    ):
        got = engine.generate(prompts, greedy(max_new=10, **kw))
        assert got != engine.generate(prompts, greedy(max_new=10)) or kw.get("logit_bias")
        for p, r in zip(prompts, got):
            toks, logps = _penalised_greedy_oracle(
                engine.model,
                p,
                10,
                presence=kw.get("presence_penalty", 0.0),
                frequency=kw.get("frequency_penalty", 0.0),
                repetition=kw.get("repetition_penalty", 1.0),
                bias=kw.get("logit_bias", {}),
            )
            k = len(r.output_ids)  # a sample may stop at EOS first
            assert r.output_ids == toks[:k], kw
            assert r.logprobs == pytest.approx(logps[:k], abs=1e-4)


def test_top_logprobs_are_the_distribution_the_logprobs_read(engine, prompts):
    out = engine.generate(prompts, greedy(max_new=6, top_logprobs=4))
    for r in out:
        assert len(r.top_logprobs) == len(r.output_ids)
        for t, lp, top in zip(r.output_ids, r.logprobs, r.top_logprobs):
            assert len(top) == 4 and top[0][0] == t and top[0][1] == pytest.approx(lp)
            assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
    sampled = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=6, temperature=0.8, seed=3, top_logprobs=2))
    for r in sampled:
        for t, lp, top in zip(r.output_ids, r.logprobs, r.top_logprobs):
            assert lp <= top[0][1] + 1e-6 and (t not in dict(top) or dict(top)[t] == pytest.approx(lp))
    assert engine.generate(prompts[:1], greedy())[0].top_logprobs is None


def test_on_step_reports_every_drawn_token_in_order(model_dir, prompts):
    eng = NativeEngine(model_dir, max_batch=3)  # two chunks, and rows leave the batch as they stop
    params = SamplingParams(n=2, max_new_tokens=9, temperature=0.9, seed=2, stop_token_ids=[5, 9, 17])
    seen: dict[int, list[int]] = {}

    def on_step(ks, tokens):
        for k, t in zip(ks, tokens):
            seen.setdefault(k, []).append(t)

    out = eng.generate(prompts, params, on_step=on_step)
    assert {k: r.output_ids for k, r in enumerate(out)} == seen
    assert out == eng.generate(prompts, params)  # reporting changes nothing
