"""``fastcrit serve`` through the official ``openai`` client: the OpenAI chat and completions APIs as
clients use them (n, stop, logprobs, streaming, seeds, penalties, content parts, roles, models,
API keys) and OpenAI-shaped JSON errors for every method and path."""

import http.client
import json

import pytest

from fastcrit.rollout.serve import serve

openai = pytest.importorskip("openai")

NAME = "tiny"
HI = [{"role": "user", "content": "Write a short poem about the sea."}]


def greedy(client, **kw):
    return client.chat.completions.create(model=NAME, messages=kw.pop("messages", HI), temperature=0, **kw)


def _raw(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=60)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp, data


def test_n_choices_for_chat_and_for_every_completions_prompt(client):
    r = client.chat.completions.create(model=NAME, messages=HI, n=3, max_tokens=6, seed=1)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1  # three samples, not one copied
    assert r.usage.completion_tokens <= 3 * 6
    r = client.completions.create(model=NAME, prompt=["The sea", "A ship"], n=2, max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text  # greedy
    assert r.choices[0].text != r.choices[2].text


def test_stop_strings_end_generation_in_the_engine_and_are_cut(client):
    full = greedy(client, max_tokens=40)
    text = full.choices[0].message.content
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 40
    k = len(text) // 2
    stop = text[k : k + 2]
    cut = text.find(stop)
    for given in (stop, [stop, "never seen in this text \x00"]):
        r = greedy(client, max_tokens=40, stop=given)
        assert r.choices[0].message.content == text[:cut]
        assert r.choices[0].finish_reason == "stop"
        # fewer tokens were generated: the engine stopped at the string, the server did not just cut text
        assert r.usage.completion_tokens < 40
    r = client.completions.create(model=NAME, prompt="The sea", max_tokens=30, temperature=0)
    t = r.choices[0].text
    s = client.completions.create(model=NAME, prompt="The sea", max_tokens=30, temperature=0, stop=[t[5:7]])
    assert s.choices[0].text == t[: t.find(t[5:7])] and s.choices[0].finish_reason == "stop"


def test_chat_logprobs_and_top_logprobs(client):
    r = greedy(client, max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8
    for e in content:
        assert e.logprob <= 0
        # a token holding part of a character shows "\ufffd" but lists its own bytes
        assert e.bytes == list(e.token.encode("utf-8")) or (e.token == "\ufffd" and len(e.bytes) < 4)
        assert len(e.top_logprobs) == 3
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob)
    plain = greedy(client, max_tokens=8)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == r.choices[0].message.content


def test_completions_logprobs_format(client):
    r = client.completions.create(model=NAME, prompt="The sea", max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[-1] <= len(r.choices[0].text)
    for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert v <= 0 and tok in top and max(top.values()) == pytest.approx(v)  # greedy: the top token


def test_chat_stream_with_usage_equals_the_whole_answer(client):
    whole = greedy(client, max_tokens=12)
    chunks = list(greedy(client, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert all(c.usage is None for c in chunks[:-1])
    # without include_usage there is no usage chunk
    plain = list(greedy(client, max_tokens=12, stream=True))
    assert plain[-1].choices and plain[-1].choices[0].finish_reason


def test_completions_stream_with_usage(client):
    whole = client.completions.create(model=NAME, prompt="The sea", max_tokens=10, temperature=0)
    chunks = list(
        client.completions.create(
            model=NAME,
            prompt="The sea",
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_take_strings_and_token_ids(client, server):
    ids = server.tokenizer.encode("The sea")
    a = client.completions.create(model=NAME, prompt="The sea", max_tokens=5, temperature=0)
    b = client.completions.create(model=NAME, prompt=ids, max_tokens=5, temperature=0)
    assert a.object == "text_completion" and a.choices[0].text == b.choices[0].text
    assert a.usage.prompt_tokens == len(ids)
    d = client.completions.create(model=NAME, prompt="The sea", temperature=0)  # OpenAI's default: 16
    assert d.usage.completion_tokens <= 16


def test_models_list_and_retrieve(client):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found"


def test_without_a_served_name_the_id_is_the_model_path_as_given(tiny_model_path):
    """README, "Serving a model": the id is MODEL_DIR exactly as given; another `model` is a 404."""
    with serve(tiny_model_path, "127.0.0.1", 0) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in c.models.list().data] == [str(tiny_model_path)]
        r = c.completions.create(model=str(tiny_model_path), prompt="The sea", max_tokens=2, temperature=0)
        assert r.model == str(tiny_model_path)
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="final", prompt="The sea", max_tokens=2)


def test_seed_makes_sampling_reproducible(client):
    def chat(seed):
        r = client.chat.completions.create(model=NAME, messages=HI, max_tokens=10, temperature=1.0, seed=seed, n=2)
        return [c.message.content for c in r.choices]

    def text(seed):
        r = client.completions.create(model=NAME, prompt="The sea", max_tokens=10, temperature=1.0, seed=seed)
        return r.choices[0].text

    a = chat(7)
    assert a == chat(7) and a != chat(8) and a[0] != a[1]  # choice j draws from seed + j
    assert text(7) == text(7) and text(7) != text(8)


def test_penalties_and_logit_bias_change_the_output(client):
    base = greedy(client, max_tokens=24).choices[0].message.content
    for kw in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"extra_body": {"repetition_penalty": 1.8}}):
        assert greedy(client, max_tokens=24, **kw).choices[0].message.content != base, kw
    r = greedy(client, max_tokens=3, logit_bias={"88": 100}, logprobs=True)
    first = r.choices[0].logprobs.content[0]
    assert first.logprob > -0.01  # token 88 became all but certain


def test_content_parts_and_every_role(client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}]
    joined = [{"role": "user", "content": "Hello\nthere"}]
    assert (
        greedy(client, messages=parts, max_tokens=8).choices[0].message.content
        == greedy(client, messages=joined, max_tokens=8).choices[0].message.content
    )
    dev = [{"role": "developer", "content": "Be brief."}] + HI
    sys_ = [{"role": "system", "content": "Be brief."}] + HI
    assert (
        greedy(client, messages=dev, max_tokens=8).choices[0].message.content
        == greedy(client, messages=sys_, max_tokens=8).choices[0].message.content
    )
    convo = sys_ + [
        {"role": "assistant", "content": "A wave."},
        {"role": "tool", "content": "42"},
        {"role": "user", "content": "Again."},
    ]
    assert greedy(client, messages=convo, max_tokens=4).choices[0].finish_reason in ("stop", "length")


def test_chunked_request_body(server):
    body = json.dumps({"model": NAME, "messages": HI, "max_tokens": 3, "temperature": 0}).encode()
    conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=60)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for i in range(0, len(body), 17):
        piece = body[i : i + 17]
        conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    conn.send(b"0\r\n\r\n")
    resp = conn.getresponse()
    out = json.loads(resp.read())
    conn.close()
    assert resp.status == 200 and out["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize(
    "method,path,status",
    [
        ("DELETE", "/v1/chat/completions", 405),
        ("OPTIONS", "/v1/chat/completions", 405),
        ("GET", "/v1/completions", 405),
        ("PUT", "/v1/models", 405),
        ("GET", "/v1/nothing", 404),
        ("POST", "/v2/chat", 404),
        ("BREW", "/v1/models", 405),
        ("PATCH", "/", 404),
    ],
)
def test_json_errors_for_every_method_and_path(server, method, path, status):
    resp, data = _raw(server, method, path, body=b"{}", headers={"Content-Type": "application/json"})
    assert resp.status == status and resp.getheader("Content-Type") == "application/json"
    err = json.loads(data)["error"]
    assert set(err) == {"message", "type", "param", "code"} and path in err["message"]
    if status == 405:
        assert resp.getheader("Allow") in ("GET, HEAD", "POST")


@pytest.mark.parametrize("path", ["/health", "/v1/models", f"/v1/models/{NAME}"])
def test_head_answers_where_get_does(server, path):
    # `curl -I` and load balancers' health checks send HEAD: GET's status and headers, no body
    get, data = _raw(server, "GET", path)
    head, nothing = _raw(server, "HEAD", path)
    assert head.status == get.status == 200 and nothing == b""
    assert head.getheader("Content-Type") == "application/json"
    assert head.getheader("Content-Length") == str(len(data))


def test_json_errors_for_bad_bodies(server, client):
    resp, data = _raw(server, "POST", "/v1/chat/completions", b"{oops", {"Content-Type": "application/json"})
    assert resp.status == 400 and "not valid JSON" in json.loads(data)["error"]["message"]
    resp, data = _raw(server, "POST", "/v1/completions", b"{}", {"Content-Length": str(10**9)})
    assert resp.status == 413 and json.loads(data)["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=HI, tools=[{"type": "function", "function": {"name": "f"}}])
    assert e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="x", suffix="y")
    assert e.value.body["param"] == "suffix"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=HI, presence_penalty=3)
    assert e.value.body["param"] == "presence_penalty"


def test_api_key_guards_every_route_but_health(tiny_model_path, capsys):
    with serve(tiny_model_path, "127.0.0.1", 0, served_model_name=NAME, api_key="sesame") as srv:
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="sesame", max_retries=0)
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        assert good.chat.completions.create(model=NAME, messages=HI, max_tokens=2).choices
        for call in (lambda c: c.models.list(), lambda c: c.chat.completions.create(model=NAME, messages=HI)):
            with pytest.raises(openai.AuthenticationError) as e:
                call(bad)
            assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        resp, _ = _raw(srv, "GET", "/v1/models")
        assert resp.status == 401
        resp, _ = _raw(srv, "GET", "/v1/models", headers={"Authorization": "bearer sesame"})
        assert resp.status == 200
        resp, _ = _raw(srv, "GET", "/health")
        assert resp.status == 200
    assert "WARNING" not in capsys.readouterr().err
    with serve(tiny_model_path, "0.0.0.0", 0, served_model_name=NAME):
        pass
    assert "without an API key" in capsys.readouterr().err


def test_concurrent_requests_with_different_settings_get_their_own_answers(client, server):
    from concurrent.futures import ThreadPoolExecutor

    asks = [
        dict(max_tokens=6),
        dict(max_completion_tokens=3),
        dict(max_tokens=8, stop=["e"]),
        dict(max_tokens=5, n=2),
        dict(max_tokens=6, logprobs=True, top_logprobs=1),
        dict(max_tokens=6, frequency_penalty=1.0),
        dict(max_tokens=6, temperature=0.9, seed=5),
    ]

    def ask(kw):
        kw = {"temperature": 0, **kw}
        r = client.chat.completions.create(model=NAME, messages=HI, **kw)
        return [(c.message.content, c.finish_reason) for c in r.choices], r.usage.completion_tokens

    alone = [ask(kw) for kw in asks]
    server.batch_window_s = 0.3  # so that the concurrent ones surely share a batch
    try:
        with ThreadPoolExecutor(len(asks)) as pool:
            together = list(pool.map(ask, asks))
    finally:
        server.batch_window_s = 0.01
    assert together == alone
    assert server.stats["max_batch_seen"] > 1  # they shared engine batches
    assert alone[1][1] <= 3  # max_completion_tokens


def _joined(chunks) -> dict[int, str]:
    out: dict[int, str] = {}
    for c in chunks:
        for ch in c.choices:
            piece = ch.delta.content if hasattr(ch, "delta") else ch.text
            out[ch.index] = out.get(ch.index, "") + (piece or "")
    return out


def test_streams_are_live_and_join_to_the_whole_answer(client, server):
    # the first piece arrives while the engine is still generating (the request is not yet counted)
    before = server.stats["requests"]
    stream = greedy(client, max_tokens=1500, stream=True)
    first = next(c for c in stream if c.choices and c.choices[0].delta.content)
    assert first.choices[0].delta.content and server.stats["requests"] == before
    stream.close()
    # stop strings held back and cut, n > 1 interleaved, seeds: the same texts as without streaming
    whole = greedy(client, max_tokens=40)
    text = whole.choices[0].message.content
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    for kw in ({"stop": [stop]}, {"n": 2, "temperature": 0.9, "seed": 4}, {"stop": stop, "n": 3}):
        kw = {"temperature": 0, "max_tokens": 40, **kw}
        want = client.chat.completions.create(model=NAME, messages=HI, **kw)
        got = _joined(client.chat.completions.create(model=NAME, messages=HI, stream=True, **kw))
        assert got == {c.index: c.message.content for c in want.choices}, kw
    want = client.completions.create(model=NAME, prompt=["The sea", "A ship"], max_tokens=20, temperature=0, stop=[" "])
    got = _joined(
        client.completions.create(
            model=NAME, prompt=["The sea", "A ship"], max_tokens=20, temperature=0, stop=[" "], stream=True
        )
    )
    assert got == {c.index: c.text for c in want.choices}


def test_a_stream_with_logprobs_carries_them_per_token(client):
    chunks = list(greedy(client, max_tokens=6, stream=True, logprobs=True, top_logprobs=2))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    whole = greedy(client, max_tokens=6, logprobs=True, top_logprobs=2)
    assert [(e.token, e.logprob) for e in entries] == [(e.token, e.logprob) for e in whole.choices[0].logprobs.content]
