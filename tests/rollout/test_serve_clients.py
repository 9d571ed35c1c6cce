"""``fastcrit serve`` against requests real clients send that test_serve.py does not cover: lm-eval's
loglikelihood payload (completions with echo + logprobs, token-id prompts, max_tokens 1 or 0),
out-of-range values that must be a 400 and not a 500, a streaming client that leaves early, the
bytes of split characters in logprobs, and vLLM's / SGLang's extra parameters."""

import http.client
import json
import math

import pytest

openai = pytest.importorskip("openai")

NAME = "tiny"
HI = [{"role": "user", "content": "Write a short poem about the sea."}]


def test_lm_eval_loglikelihood_payload_gets_the_prompt_scored(client, server):
    # lm-eval's local-completions loglikelihood request, as it sends it: token ids of context +
    # continuation, echo, logprobs=1, max_tokens=1, temperature 0, seed 1234. It then reads
    # token_logprobs[ctxlen:-1] (the continuation) and compares each to max(top_logprobs) (greedy?).
    from fastcrit.types import SamplingParams

    ctx = server.tokenizer.encode("The sea is")
    # the greedy next token and its log-prob, from the engine (idle: the server is between requests)
    g = server.engine.generate([ctx], SamplingParams(max_new_tokens=1, temperature=0.0))[0]
    greedy_id = g.output_ids[0]
    other = (greedy_id + 1) % server.engine.vocab_size
    prompts = [ctx + [greedy_id], ctx + [other]]
    r = client.completions.create(
        model=NAME, prompt=prompts, max_tokens=1, temperature=0, logprobs=1, seed=1234, echo=True
    )
    assert r.usage.prompt_tokens == 2 * (len(ctx) + 1) and r.usage.completion_tokens == 2
    for ch, p in zip(sorted(r.choices, key=lambda c: c.index), prompts):
        lp = ch.logprobs
        # one entry per prompt token, then the generated one; nothing predicts the first token
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(p) + 1
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(v <= 0 for v in lp.token_logprobs[1:])
        assert ch.text.startswith(server.tokenizer.decode(p, skip_special_tokens=True))
        assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[-1] <= len(ch.text)
    cont = [(c.logprobs.token_logprobs[len(ctx) : -1], c.logprobs.top_logprobs[len(ctx) : -1]) for c in r.choices]
    (lp_g, top_g), (lp_o, top_o) = cont
    # the prompt's score of the greedy token is what the engine gave it when it drew it
    assert lp_g[0] == pytest.approx(g.logprobs[0], abs=1e-4)
    assert lp_g[0] == max(top_g[0].values()) and lp_o[0] < max(top_o[0].values())  # lm-eval's is_greedy
    # max_tokens=0 with echo scores the prompt alone (and only with echo)
    z = client.completions.create(model=NAME, prompt=prompts[0], max_tokens=0, temperature=0, logprobs=1, echo=True)
    assert z.usage.completion_tokens == 0 and z.choices[0].finish_reason == "length"
    assert z.choices[0].logprobs.token_logprobs == pytest.approx(r.choices[0].logprobs.token_logprobs[:-1])
    assert z.choices[0].text == server.tokenizer.decode(prompts[0], skip_special_tokens=True)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="x", max_tokens=0)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=HI, extra_body={"echo": True})
    assert e.value.body["param"] == "echo"


def test_echo_sends_the_prompt_first_also_when_streamed(client):
    plain = client.completions.create(model=NAME, prompt="The sea is", max_tokens=4, temperature=0)
    echoed = client.completions.create(model=NAME, prompt="The sea is", max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == "The sea is" + plain.choices[0].text
    for kw in ({}, {"logprobs": 2}):
        chunks = list(
            client.completions.create(
                model=NAME, prompt="The sea is", max_tokens=4, temperature=0, echo=True, stream=True, **kw
            )
        )
        assert "".join(c.choices[0].text for c in chunks if c.choices) == echoed.choices[0].text, kw


def test_non_finite_sampling_values_are_a_400(server):
    # json.loads reads NaN, and NaN passes every range comparison: it reached the sampler (a 500)
    for field in ("temperature", "presence_penalty", "frequency_penalty", "top_p", "repetition_penalty"):
        body = json.dumps({"model": NAME, "messages": HI, "max_tokens": 2, field: math.nan}).encode()
        conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=60)
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        err = json.loads(resp.read())["error"]
        conn.close()
        assert resp.status == 400 and err["param"] == field, (field, err)


def test_a_logit_bias_token_outside_the_vocabulary_is_a_400(client):
    # the engine refused the whole call for it: a 500 "generation failed"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=HI, max_tokens=2, logit_bias={"99999999": 5})
    assert e.value.body["param"] == "logit_bias"
    assert client.chat.completions.create(model=NAME, messages=HI, max_tokens=2, logit_bias={"7": 5}).choices


def test_a_stream_the_client_leaves_stops_holding_the_engine(client, server):
    # The batcher runs one engine call at a time: an abandoned stream that ran to max_tokens held
    # every request queued behind it. Now its call stops once the client is gone, unfinished.
    before = server.stats["requests"]
    stream = client.chat.completions.create(model=NAME, messages=HI, max_tokens=1900, temperature=0, stream=True)
    next(c for c in stream if c.choices and c.choices[0].delta.content)
    stream.close()
    r = client.chat.completions.create(model=NAME, messages=HI, max_tokens=2, temperature=0)
    assert r.choices[0].message.content
    # only the short request was answered: the abandoned one never ran to its end
    assert server.stats["requests"] == before + 1


def test_an_abandoned_seeded_stream_leaves_the_rest_of_its_group_answered(server):
    # Seeded requests of one batch group run one generate call each; the abandoned one's call
    # stops, and the request after it in the group is still generated (not failed with it).
    import queue

    from fastcrit.rollout.serve import _Pending
    from fastcrit.types import SamplingParams

    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=11, stop_token_ids=[])
    ids = server.tokenizer.encode("The sea is")
    left, stays = _Pending(ids, params, stream=queue.Queue()), _Pending(ids, params, stream=queue.Queue())
    left.abandoned = True
    server._run([left, stays])  # the batcher's own step, called while the server is idle
    assert left.error is None and stays.error is None
    assert left.output[0].output_ids == []
    want = server.engine.generate([ids], params)[0]
    assert stays.output[0].output_ids == want.output_ids and len(want.output_ids) > 0


def test_chat_logprob_bytes_join_to_the_text(client, server):
    # A token holding part of a character decodes alone to "\ufffd"; its `bytes` were that
    # character's, so a client joining them (what the field is for) never got the text back.
    e_bytes = server.tokenizer.encode("é")  # byte-level BPE: one token per byte
    assert len(e_bytes) == 2
    r = client.chat.completions.create(
        model=NAME,
        messages=HI,
        max_tokens=12,
        temperature=1,
        seed=3,
        logit_bias={str(t): 100 for t in e_bytes},
        logprobs=True,
    )
    content = r.choices[0].logprobs.content
    assert {bytes(e.bytes) for e in content} <= {b"\xc3", b"\xa9"}
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == r.choices[0].message.content
    assert "é" in r.choices[0].message.content


def test_stop_token_ids_stop_and_other_vllm_extras_are_refused_not_ignored(client, server):
    from fastcrit.types import SamplingParams

    ids = server.tokenizer.encode("The sea")
    out = server.engine.generate([ids], SamplingParams(max_new_tokens=10, temperature=0.0)).pop().output_ids
    k = next(k for k in range(1, len(out)) if out[k] not in out[:k])
    r = client.completions.create(
        model=NAME, prompt=ids, max_tokens=10, temperature=0, extra_body={"stop_token_ids": [out[k]]}
    )
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == k + 1
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="x", max_tokens=2, extra_body={"stop_token_ids": [10**9]})
    assert e.value.body["param"] == "stop_token_ids"
    # each would change what is generated; answering as if it were absent returned the wrong thing
    for field, value in [
        ("ignore_eos", True),
        ("min_tokens", 4),
        ("include_stop_str_in_output", True),
        ("skip_special_tokens", False),
        ("continue_final_message", True),
        ("add_generation_prompt", False),
        ("prompt_logprobs", 1),
        ("best_of", 3),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=NAME, messages=HI, max_tokens=2, extra_body={field: value})
        assert e.value.body["param"] == field
    extras = {"ignore_eos": False, "min_tokens": 0, "skip_special_tokens": True, "best_of": 1}
    assert client.chat.completions.create(model=NAME, messages=HI, max_tokens=2, extra_body=extras).choices


def test_chat_template_kwargs_reach_the_template(client, server):
    # vLLM's chat_template_kwargs (e.g. Qwen3's enable_thinking) were dropped: the prompt ignored them
    saved = server.tokenizer.chat_template
    server.tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if shout %}!!!!{% endif %}"
    )
    try:

        def prompt_tokens(**kw):
            return client.chat.completions.create(model=NAME, messages=HI, max_tokens=1, **kw).usage.prompt_tokens

        plain = prompt_tokens()
        assert prompt_tokens(extra_body={"chat_template_kwargs": {"shout": True}}) > plain
        assert prompt_tokens(extra_body={"chat_template_kwargs": {"shout": False}}) == plain
        with pytest.raises(openai.BadRequestError) as e:
            prompt_tokens(extra_body={"chat_template_kwargs": {"tokenize": True}})
        assert e.value.body["param"] == "chat_template_kwargs"
    finally:
        server.tokenizer.chat_template = saved
