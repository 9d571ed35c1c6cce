import json
import socket
import threading
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from fastcrit.rollout.chat import (
    ChatError,
    ChatModel,
    ChatOutput,
    ConversationError,
    HTTPChat,
    LocalChat,
    _unbroken_runs,
    chat_completions_url,
)
from fastcrit.rollout.native import NativeEngine
from fastcrit.rollout.serve import serve
from fastcrit.types import SamplingParams

FINALIZE = "Please finalize your answer accordingly using the same format."
MAX_NEW = 12
SOME = 3


def ctrl_conversation(problem: str, solution: str, critique: str) -> list[dict]:
    return [
        {"role": "user", "content": problem},
        {"role": "assistant", "content": solution},
        {"role": "user", "content": f"{critique}\n\n{FINALIZE}"},
    ]


# Eight conversations of clearly different lengths (CTRL's revision prompt, plus two short chats).
CONVERSATIONS = [
    ctrl_conversation("Reverse the letters: a b c d e", "e d c b a", "Analysis: correct.\nOverall judgment: Correct"),
    [{"role": "user", "content": "hi"}],
    ctrl_conversation(
        "What is 12 + 35?",
        "Answer: 48",
        "Analysis: 12 + 35 is 47, not 48.\nImprovement suggestions: add again.\nOverall judgment: Incorrect",
    ),
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "x"}],
    ctrl_conversation(
        "Write a function add(a, b) that returns the sum.\n" * 3,
        "def add(a, b):\n    return a - b\n",
        "Analysis: the loop misses the last element and the sign is wrong. " * 4 + "\nOverall judgment: Incorrect",
    ),
    ctrl_conversation('Reverse "abcde".', "edcba", "Overall judgment: Correct"),
    ctrl_conversation("The quick brown fox jumps over the lazy dog. " * 6, "dog lazy the over", "Incorrect"),
    [{"role": "user", "content": "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 50 100 1000"}],
]


def prompt_ids(tok) -> list[list[int]]:
    return [
        tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in CONVERSATIONS
    ]


@pytest.fixture(scope="module")
def model_dir(tiny_model_path, tmp_path_factory):
    """The tiny test model changed so that greedy decoding stops on some conversations: EOS's output
    row becomes 1.5x the row of a token the model emits late in some answers, so EOS wins wherever that
    one would have (with a positive logit). Without this the random tiny model never emits EOS."""
    from fastcrit.models.hf import load_model, load_tokenizer, save_pretrained_safetensors

    tok = load_tokenizer(tiny_model_path)
    model = load_model(tiny_model_path)
    outs = NativeEngine(model, tok).generate(prompt_ids(tok), SamplingParams(max_new_tokens=MAX_NEW, temperature=0))
    early = {t for r in outs for t in r.output_ids[:SOME]}
    rows_with = Counter(t for r in outs for t in set(r.output_ids[SOME:]) - early)
    # A token no row emits in its first SOME steps (so every text has those), that some rows emit
    # later (they stop) and others never (they run to the length limit).
    chosen = max(rows_with, key=lambda t: min(rows_with[t], len(outs) - rows_with[t]))
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] = 1.5 * model.lm_head.weight[chosen]
    return save_pretrained_safetensors(model, tok, str(tmp_path_factory.mktemp("chat") / "eos-model"))


@pytest.fixture(scope="module")
def tok(model_dir):
    from fastcrit.models.hf import load_tokenizer

    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir, tok):
    return NativeEngine(model_dir, tok)


@pytest.fixture(scope="module")
def local(engine, tok):
    return LocalChat(engine, tok, max_prompt_len=1024)


@pytest.fixture(scope="module")
def local_outputs(local):
    return local.chat(CONVERSATIONS, max_new_tokens=MAX_NEW)


@pytest.fixture(scope="module")
def server(model_dir):
    # A wide batching window so that the concurrent test requests surely land in one engine batch.
    srv = serve(model_dir, "127.0.0.1", 0, max_batch=16, batch_window_s=0.3)
    yield srv
    srv.close()


def test_local_chat_equals_direct_engine_decode(engine, tok, local, local_outputs):
    assert isinstance(local, ChatModel)
    ids = prompt_ids(tok)
    assert len(set(map(len, ids))) >= 6  # the lengths really differ, so left padding is exercised
    rollouts = engine.generate(ids, SamplingParams(n=1, max_new_tokens=MAX_NEW, temperature=0.0))
    expected = [
        ChatOutput(tok.decode(r.output_ids, skip_special_tokens=True), r.finish_reason, len(p), len(r.output_ids))
        for p, r in zip(ids, rollouts)
    ]
    assert local_outputs == expected
    assert any(o.text for o in local_outputs)
    assert {o.finish_reason for o in local_outputs} == {"stop", "length"}  # both ends are exercised
    assert all(tok.eos_token not in o.text for o in local_outputs)


def test_http_chat_through_serve_equals_local_chat(server, local_outputs):
    before = dict(server.stats)
    client = HTTPChat(server.url, server.model_name, concurrency=8)
    out = client.chat(CONVERSATIONS, max_new_tokens=MAX_NEW)
    assert out == local_outputs  # texts, finish reasons and token counts, in input order
    assert server.stats["requests"] - before["requests"] == len(CONVERSATIONS)
    assert server.stats["max_batch_seen"] > 1  # concurrent requests were gathered into one batch
    # The endpoint may already end with /v1 (as OpenAI clients' base_url does).
    again = HTTPChat(server.url + "/v1/", server.model_name).chat(CONVERSATIONS[:1], max_new_tokens=MAX_NEW)
    assert again == local_outputs[:1]
    client.close()


def test_prompt_too_long_is_reported_not_sent(model_dir, engine, tok, local):
    lengths = [len(p) for p in prompt_ids(tok)]
    limit = sorted(lengths)[4]  # the three longest prompts do not fit
    long = [i for i, n in enumerate(lengths) if n > limit]
    short = [i for i, n in enumerate(lengths) if n <= limit]
    assert len(long) == 3
    calls = []
    real_generate = engine.generate
    engine.generate = lambda prompts, params: calls.append(len(prompts)) or real_generate(prompts, params)
    try:
        out = LocalChat(engine, tok, max_prompt_len=limit).chat(CONVERSATIONS, max_new_tokens=MAX_NEW)
    finally:
        del engine.generate
    assert calls == [len(short)]  # one batched call holding only the prompts that fit
    fitting = local.chat([CONVERSATIONS[i] for i in short], max_new_tokens=MAX_NEW)
    for i in long:
        assert out[i] == ChatOutput("", "prompt_too_long", lengths[i], 0)
    assert [out[i] for i in short] == fitting
    # Over HTTP: the server refuses the long ones with context_length_exceeded; the client maps that.
    srv = serve(model_dir, "127.0.0.1", 0, max_prompt_len=limit, batch_window_s=0.3)
    try:
        remote = HTTPChat(srv.url, srv.model_name).chat(CONVERSATIONS, max_new_tokens=MAX_NEW)
    finally:
        srv.close()
    for i in long:
        assert remote[i] == ChatOutput("", "prompt_too_long", 0, 0)
    assert [remote[i] for i in short] == fitting


def test_sampled_conversation_draws_from_its_seed_and_place_when_others_are_too_long(engine, tok, local):
    lengths = [len(p) for p in prompt_ids(tok)]
    limit = sorted(lengths)[4]  # three do not fit, so the fitting ones come in broken runs
    calls = []
    real_generate = engine.generate
    engine.generate = lambda prompts, params: calls.append(params.seed) or real_generate(prompts, params)
    try:
        out = LocalChat(engine, tok, max_prompt_len=limit).chat(
            CONVERSATIONS, max_new_tokens=MAX_NEW, temperature=1.0, seed=100
        )
    finally:
        del engine.generate
    everyone = local.chat(CONVERSATIONS, max_new_tokens=MAX_NEW, temperature=1.0, seed=100)
    fits = [i for i, n in enumerate(lengths) if n <= limit]
    assert calls == [100 + run[0] for run in _unbroken_runs(fits)] and len(calls) > 1
    assert [out[i] for i in fits] == [everyone[i] for i in fits]  # the same draws as with nothing left out
    alone = local.chat([CONVERSATIONS[fits[-1]]], max_new_tokens=MAX_NEW, temperature=1.0, seed=100 + fits[-1])
    assert alone == [everyone[fits[-1]]]
    assert len({o.text for o in everyone}) > 1


def test_local_chat_rejects_bad_conversations(local):
    with pytest.raises(ConversationError, match=r"conversations\[1\]\.messages\[0\]\.role: 'bot'"):
        local.chat([CONVERSATIONS[0], [{"role": "bot", "content": "x"}]], max_new_tokens=2)
    with pytest.raises(ConversationError, match=r"messages\[0\]\.content\[0\]\.type: 'str': only text parts"):
        local.chat([[{"role": "user", "content": ["part"]}]], max_new_tokens=2)
    with pytest.raises(ConversationError, match=r"messages\[0\]\.content: must be a string or a list of text parts"):
        local.chat([[{"role": "user", "content": 3}]], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        local.chat(CONVERSATIONS[:1], max_new_tokens=0)
    with pytest.raises(ValueError, match="max_new_tokens=2048 leaves no room for a prompt"):
        local.chat(CONVERSATIONS[:1], max_new_tokens=2048)  # the tiny model has 2048 positions
    assert local.chat([], max_new_tokens=2) == []


def _post(url: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_serve_validates_requests_and_lists_the_model(server):
    url = server.url + "/v1/chat/completions"
    ok = [{"role": "user", "content": "hi"}]
    cases = [
        ({"model": server.model_name}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": []}, "messages"),
        ({"messages": ok, "max_tokens": 0}, "max_tokens"),
        ({"messages": ok, "max_tokens": "8"}, "max_tokens"),
        ({"messages": ok, "stream": "yes"}, "stream"),
        ({"messages": ok, "n": 0}, "n"),
        ({"messages": ok, "stop": [5]}, "stop"),
        ({"messages": ok, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"messages": ok, "response_format": {"type": "json_schema"}}, "response_format"),
        ({"messages": ok, "top_logprobs": 2}, "top_logprobs"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": ok, "temperature": -0.5}, "temperature"),
    ]
    for body, param in cases:
        status, obj = _post(url, body)
        assert status == 400, (body, obj)
        assert obj["error"]["param"] == param and obj["error"]["type"] == "invalid_request_error"
        assert param.split(".")[-1].split("[")[0] in obj["error"]["message"]
    status, obj = _post(url, b"{not json")
    assert status == 400 and "not valid JSON" in obj["error"]["message"]
    status, obj = _post(url, {"model": "other", "messages": ok, "max_tokens": 2})
    assert status == 404 and obj["error"]["code"] == "model_not_found"
    status, obj = _post(url, {"model": server.model_name, "messages": ok, "max_tokens": 3, "temperature": 0})
    assert status == 200 and obj["choices"][0]["message"]["role"] == "assistant"
    assert obj["choices"][0]["finish_reason"] in ("stop", "length") and 1 <= obj["usage"]["completion_tokens"] <= 3
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as resp:
        assert [m["id"] for m in json.loads(resp.read())["data"]] == [server.model_name]
    with urllib.request.urlopen(server.url + "/health", timeout=10) as resp:
        assert resp.status == 200


def test_http_chat_400_carries_the_server_message(server):
    client = HTTPChat(server.url, server.model_name, retries=0)
    with pytest.raises(ChatError) as info:
        client.chat(CONVERSATIONS[:2], max_new_tokens=4, temperature=3.0)
    msg = str(info.value)
    assert "HTTP 400" in msg and "temperature=3.0 must be in [0.0, 2.0]" in msg
    assert server.url + "/v1/chat/completions" in msg


def test_http_chat_server_down_fails_after_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = HTTPChat(f"http://127.0.0.1:{port}", "m", retries=2, backoff_s=0.01, timeout_s=5)
    with pytest.raises(
        ChatError,
        match=rf"POST http://127\.0\.0\.1:{port}/v1/chat/completions: no answer "
        r"\(.*\) after 3 attempt\(s\)",
    ):
        client.chat(CONVERSATIONS[:1], max_new_tokens=4)


class ScriptedServer:
    """A throwaway HTTP server answering POSTs with scripted (status, body) pairs, in order (the last
    one repeats), and recording every request it got."""

    def __init__(self, script: list[tuple[int, bytes | dict]]):
        self.script = list(script)
        self.requests: list[tuple[str, dict, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # the name BaseHTTPRequestHandler dispatches POST to
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, dict(self.headers), body))
                status, reply = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def answer(content="fixed", finish="stop", usage=None):
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return body


def test_http_chat_retries_503_and_429_then_succeeds():
    script = [(503, b"overloaded"), (429, {"error": {"message": "slow down"}}), (200, answer("revised", "eos_token"))]
    with ScriptedServer(script) as fake:
        client = HTTPChat(fake.url + "/v1", "gen", api_key="k1", retries=3, backoff_s=0.01)
        out = client.chat(CONVERSATIONS[:1], max_new_tokens=7, seed=5)
        assert out == [ChatOutput("revised", "stop", 0, 0)]  # TGI's eos_token means stop; no usage -> 0
        assert len(fake.requests) == 3
        path, headers, body = fake.requests[-1]
        assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer k1"
        assert body == {
            "model": "gen",
            "messages": CONVERSATIONS[0],
            "max_tokens": 7,
            "temperature": 0.0,
            "n": 1,
            "seed": 5,
        }
    with ScriptedServer([(200, answer("a", "length", {"prompt_tokens": 9, "completion_tokens": 4}))]) as fake:
        out = HTTPChat(fake.url, "gen").chat(CONVERSATIONS[:2], max_new_tokens=4)
        assert out == [ChatOutput("a", "length", 9, 4)] * 2
        assert all("seed" not in body for _, _, body in fake.requests)
    with ScriptedServer([(200, answer("s"))]) as fake:  # conversation k asks for seed + k, as LocalChat draws
        HTTPChat(fake.url, "gen", concurrency=1).chat(CONVERSATIONS[:3], max_new_tokens=4, temperature=1.0, seed=40)
        assert sorted((body["seed"], json.dumps(body["messages"])) for _, _, body in fake.requests) == sorted(
            (40 + k, json.dumps(c)) for k, c in enumerate(CONVERSATIONS[:3])
        )
    with ScriptedServer([(502, b"<html>bad gateway</html>")]) as fake:
        with pytest.raises(ChatError, match=r"HTTP 502 after 3 attempt\(s\); body '<html>bad gateway</html>'"):
            HTTPChat(fake.url, "gen", retries=2, backoff_s=0.01).chat(CONVERSATIONS[:1], max_new_tokens=4)
        assert len(fake.requests) == 3


@pytest.mark.parametrize(
    "status, reply, what",
    [
        (200, b"<html>not json</html>", "the body is not JSON"),
        (200, [1, 2], "the body is a JSON list"),
        (200, {"object": "chat.completion"}, "no choices list"),
        (200, {"choices": []}, "no choices list"),
        (
            200,
            {"choices": [{"message": {"role": "assistant"}, "finish_reason": "stop"}]},
            r"choices\[0\]\.message\.content is missing",
        ),
        (200, {"choices": [{"text": "completion-style"}]}, r"choices\[0\]\.message is missing"),
        (200, answer(finish="abort"), r"finish_reason='abort'"),
        (200, answer(finish=None), r"finish_reason=None"),
        (200, answer(usage={"prompt_tokens": "9", "completion_tokens": 1}), r"usage\.prompt_tokens='9'"),
        (404, {"error": {"message": "The model `gen` does not exist."}}, "HTTP 404; server says: The model `gen`"),
    ],
)
def test_http_chat_malformed_answers_raise_clear_errors(status, reply, what):
    with ScriptedServer([(status, reply)]) as fake:
        with pytest.raises(ChatError, match=what) as info:
            HTTPChat(fake.url, "gen", retries=0).chat(CONVERSATIONS[:1], max_new_tokens=4)
        assert f"conversation 0: POST {fake.url}/v1/chat/completions" in str(info.value)
        assert len(fake.requests) == 1  # never retried


def test_http_chat_maps_context_length_400_to_prompt_too_long():
    vllm = {
        "object": "error",
        "message": "This model's maximum context length is 4096 tokens. However, you "
        "requested 5000 tokens (4990 in the messages, 10 in the completion).",
        "type": "BadRequestError",
        "code": 400,
    }
    with ScriptedServer([(400, vllm)]) as fake:
        out = HTTPChat(fake.url, "gen").chat(CONVERSATIONS[:2], max_new_tokens=10)
    assert out == [ChatOutput("", "prompt_too_long", 0, 0)] * 2


def test_endpoint_urls():
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("https://h/api/v1") == "https://h/api/v1/chat/completions"
    with pytest.raises(ValueError, match="endpoint 'h:8000'"):
        HTTPChat("h:8000", "m")


def test_top_p_reaches_the_engine_and_the_server(engine, tok):
    """Nucleus sampling (the paper's critic samples at temperature 0.7, top-p 0.8)."""
    seen = []
    real_generate = engine.generate
    engine.generate = lambda prompts, params: seen.append(params.top_p) or real_generate(prompts, params)
    try:
        LocalChat(engine, tok, max_prompt_len=4096).chat(
            CONVERSATIONS[:2], max_new_tokens=MAX_NEW, temperature=0.7, seed=3, top_p=0.8
        )
    finally:
        del engine.generate
    assert seen and set(seen) == {0.8}
    with ScriptedServer([(200, answer("s"))]) as fake:
        HTTPChat(fake.url, "gen", concurrency=1).chat(CONVERSATIONS[:2], max_new_tokens=4, temperature=0.7, top_p=0.8)
        HTTPChat(fake.url, "gen", concurrency=1).chat(CONVERSATIONS[:1], max_new_tokens=4, temperature=0.7)
        assert [body.get("top_p") for _, _, body in fake.requests] == [0.8, 0.8, None]  # 1 is left to the server
    for bad in (0, 1.5, True, "0.8"):
        with pytest.raises(ValueError, match="top_p="):
            HTTPChat("http://127.0.0.1:1", "gen").chat(CONVERSATIONS[:1], max_new_tokens=4, top_p=bad)
