"""A small OpenAI-compatible server for a local Hugging Face model, backed by the NativeEngine.

``fastcrit serve MODEL`` (or ``serve(model, host, port)`` in-process) answers
``POST /v1/chat/completions`` (non-streaming), ``GET /v1/models`` and ``GET /health``. It is meant for
tests, recipes and small proxy generators on one machine; vLLM or SGLang serve large ones.

Requests that arrive together are gathered into one engine batch: after the first request of a batch
the server waits ``batch_window_s`` for more (up to ``max_batch``), and requests that come while the
engine is busy form the next batch. Requests with the same sampling settings (max_tokens,
temperature, top_p, seed) share one ``generate`` call. Prompts are rendered exactly as
fastcrit.rollout.chat.LocalChat renders them, so a batch of greedy requests gets the texts LocalChat
gets for the same conversations in one call.

Departures from the OpenAI API: no streaming, n must be 1, no stop strings, tools, logprobs,
penalties or response formats (each is refused with a 400 naming the field rather than ignored);
roles are system / user / assistant with string content only; max_tokens defaults to
``default_max_tokens`` (not "until the context is full"); ``temperature`` defaults to 1 as in OpenAI.
A prompt over ``max_prompt_len`` tokens, or one that leaves no room for max_tokens within the
model's positions, gets a 400 with ``code: context_length_exceeded`` as OpenAI sends.
A seeded sampled (temperature > 0) request goes to the engine in a call of its own, so with the
native engine its answer depends on the seed and the prompt, not on the requests around it.
Not covered: there is no authentication, and no bound on queued requests beyond the threads the
HTTP server starts.
"""
from __future__ import annotations

import json
import queue
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fastcrit.rollout.chat import ConversationError, check_conversation, render_conversation

MAX_BODY_BYTES = 16 * 1024 * 1024
# Sampling fields the server does not implement; a request that sets one to anything but its
# neutral value gets a 400 naming it, so nobody silently gets other behaviour than they asked for.
_UNSUPPORTED = {"stop": (None, [], ""), "logprobs": (None, False), "top_logprobs": (None, 0),
                "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
                "response_format": (None, {"type": "text"}), "logit_bias": (None, {}),
                "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0)}


class RequestError(Exception):
    """A request the server refuses; becomes an OpenAI-style error JSON with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class _Pending:
    ids: list[int]
    key: tuple  # (max_tokens, temperature, top_p, seed): requests with equal keys share a generate call
    done: threading.Event = field(default_factory=threading.Event)
    output: tuple | None = None  # (text, finish_reason, completion_tokens)
    error: str | None = None


def _number(body: dict, name: str, default, lo: float, hi: float, *, lo_open: bool = False) -> float:
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RequestError(400, f"{name} must be a number, got {type(v).__name__}", name)
    if v < lo or (lo_open and v == lo) or v > hi:
        raise RequestError(400, f"{name}={v} must be in {'(' if lo_open else '['}{lo}, {hi}]", name)
    return float(v)


def parse_request(body, default_max_tokens: int) -> tuple[list[dict], int, float, float, int | None]:
    """Validate a chat-completions body; return (messages, max_tokens, temperature, top_p, seed).
    Raises RequestError(400) naming the first bad field."""
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    if body.get("stream"):
        raise RequestError(400, "stream=true is not supported; send stream=false or leave it out", "stream")
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or n != 1):
        raise RequestError(400, f"n={n!r} is not supported; this server returns exactly one choice (n=1)", "n")
    for name, neutral in _UNSUPPORTED.items():
        if name in body and body[name] not in neutral:
            raise RequestError(400, f"{name} is not supported by this server", name)
    if "messages" not in body:
        raise RequestError(400, "messages is missing", "messages")
    try:
        check_conversation(body["messages"])
    except ConversationError as e:
        raise RequestError(400, str(e), e.param) from None
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if max_tokens is None:
        max_tokens = default_max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(400, f"{name}={max_tokens!r} must be an integer >= 1", name)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(400, f"seed must be an integer, got {type(seed).__name__}", "seed")
    return body["messages"], max_tokens, temperature, top_p, seed


class ChatServer:
    """A running server: ``url`` (http://host:port), ``model_name``, ``stats`` and ``close()``.

    ``engine`` and ``tokenizer`` are the NativeEngine and tokenizer it answers with; ``stats`` counts
    ``requests`` answered by the engine and engine ``batches`` and keeps ``max_batch_seen``.
    """

    def __init__(self, engine, tokenizer, *, model_name: str, host: str, port: int, max_batch: int,
                 batch_window_s: float, max_prompt_len: int | None, default_max_tokens: int,
                 log_requests: bool = False):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.max_positions = getattr(engine, "max_positions", None)
        self.max_prompt_len = max_prompt_len
        self.default_max_tokens = default_max_tokens
        self.log_requests = log_requests
        self.created = int(time.time())
        self.stats = {"requests": 0, "batches": 0, "max_batch_seen": 0}
        self._tok_lock = threading.Lock()  # fast tokenizers may refuse concurrent use from threads
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._closing = threading.Event()
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.app = self
        h, p = self._httpd.server_address[:2]
        self.url = f"http://{h}:{p}"
        self._batcher = threading.Thread(target=self._batch_loop, name="fastcrit-serve-batcher", daemon=True)
        self._http_thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                             name="fastcrit-serve-http", daemon=True)
        self._batcher.start()
        self._http_thread.start()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop listening, fail queued requests with 503, and release the engine."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._queue.put(None)
        self._batcher.join(timeout=60)
        while True:  # anything queued after the batcher stopped
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item.error = "the server is shutting down"
                item.done.set()
        self.engine.close()

    def wait(self) -> None:
        """Block until close() (or Ctrl-C, which closes)."""
        try:
            while self._http_thread.is_alive():
                self._http_thread.join(timeout=0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def __enter__(self) -> "ChatServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ requests

    def complete(self, body) -> dict:
        """Answer one chat-completions body (already JSON-decoded); raises RequestError."""
        from fastcrit.types import is_greedy

        messages, max_tokens, temperature, top_p, seed = parse_request(body, self.default_max_tokens)
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise RequestError(404, f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                               "model", "model_not_found")
        try:
            with self._tok_lock:
                ids = render_conversation(self.tokenizer, messages)
        except ConversationError as e:
            raise RequestError(400, str(e), e.param) from None
        if self.max_prompt_len is not None and len(ids) > self.max_prompt_len:
            raise RequestError(400, f"the prompt has {len(ids)} tokens, more than the server's "
                               f"max_prompt_len={self.max_prompt_len}", "messages", "context_length_exceeded")
        if self.max_positions and len(ids) + max_tokens > self.max_positions:
            raise RequestError(400, f"this model's maximum context length is {self.max_positions} tokens; the "
                               f"prompt has {len(ids)} and max_tokens={max_tokens}", "messages",
                               "context_length_exceeded")
        item = _Pending(ids, (max_tokens, temperature, top_p, None if is_greedy(temperature) else seed))
        if self._closing.is_set():
            raise RequestError(503, "the server is shutting down", kind="server_error")
        self._queue.put(item)
        while not item.done.wait(0.5):
            if not self._batcher.is_alive():  # closed between the check above and the put
                raise RequestError(503, "the server is shutting down", kind="server_error")
        if item.error is not None:
            raise RequestError(500 if not self._closing.is_set() else 503, item.error, kind="server_error")
        text, finish, completion_tokens = item.output
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": completion_tokens,
                      "total_tokens": len(ids) + completion_tokens},
        }

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "fastcrit", "max_model_len": self.max_positions}]}

    # ------------------------------------------------------------------ batching

    def _batch_loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = [first], False
            deadline = time.monotonic() + self.batch_window_s
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            self._run(batch)
            if stop:
                return

    def _run(self, batch: list[_Pending]) -> None:
        from fastcrit.types import SamplingParams

        groups: dict[tuple, list[_Pending]] = {}
        for item in batch:
            groups.setdefault(item.key, []).append(item)
        self.stats["batches"] += 1
        self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], len(batch))
        for (max_tokens, temperature, top_p, seed), items in groups.items():
            try:
                params = SamplingParams(n=1, max_new_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                        seed=seed)
                if seed is None:
                    rollouts = self.engine.generate([it.ids for it in items], params)
                else:  # request k of a call draws from seed + k: alone, each answer is the seed's
                    rollouts = [r for it in items for r in self.engine.generate([it.ids], params)]
                with self._tok_lock:
                    texts = [self.tokenizer.decode(r.output_ids, skip_special_tokens=True) for r in rollouts]
                for it, r, text in zip(items, rollouts, texts):
                    it.output = (text, r.finish_reason, len(r.output_ids))
                self.stats["requests"] += len(items)
            except Exception as e:  # one bad group must not take the server down; its requests get a 500
                for it in items:
                    it.error = f"generation failed: {type(e).__name__}: {e}"
            finally:
                for it in items:
                    it.done.set()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many clients connect at once (HTTPChat's concurrency); 5 would drop SYNs
    app: ChatServer


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's signature)
        if self.server.app.log_requests:
            sys.stderr.write(f"fastcrit serve: {self.address_string()} {format % args}\n")

    def _send(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, err: RequestError) -> None:
        self._send(err.status, err.body())

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            self._send(200, {"status": "ok"})
        elif path == "/v1/models":
            self._send(200, self.server.app.models())
        else:
            self._error(RequestError(404, f"no route GET {self.path}", kind="not_found_error"))

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0].rstrip("/")
        length_header = self.headers.get("Content-Length")
        try:
            length = int(length_header) if length_header is not None else -1
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            return self._error(RequestError(411, "a Content-Length header is required"))
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return self._error(RequestError(413, f"the body has {length} bytes, more than {MAX_BODY_BYTES}"))
        raw = self.rfile.read(length)
        if path != "/v1/chat/completions":
            return self._error(RequestError(404, f"no route POST {self.path}", kind="not_found_error"))
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            return self._error(RequestError(400, f"the body is not valid JSON: {e}"))
        try:
            self._send(200, self.server.app.complete(body))
        except RequestError as e:
            self._error(e)
        except Exception as e:  # answer rather than drop the connection (a client would retry a drop)
            self._error(RequestError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"))


def serve(model: str, host: str = "127.0.0.1", port: int = 8000, *, max_batch: int = 64,
          dtype: str = "float32", device: str = "cpu", max_prompt_len: int | None = None,
          default_max_tokens: int = 512, batch_window_s: float = 0.01, served_model_name: str | None = None,
          log_requests: bool = False) -> ChatServer:
    """Load ``model`` (a Hugging Face directory or model spec such as ``tiny``) into a NativeEngine and
    start serving it in background threads; port 0 picks a free port (see ``.url``).

    The served model name is ``served_model_name`` or ``model`` as given (vLLM does the same); a
    request naming another model gets a 404, one naming none is served.
    """
    from fastcrit.models.hf import load_tokenizer, resolve_model_path
    from fastcrit.rollout.native import NativeEngine

    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"serve: max_batch={max_batch!r} must be an integer >= 1")
    if max_prompt_len is not None and max_prompt_len < 1:
        raise ValueError(f"serve: max_prompt_len={max_prompt_len!r} must be >= 1 (or None for no limit)")
    if default_max_tokens < 1:
        raise ValueError(f"serve: default_max_tokens={default_max_tokens!r} must be >= 1")
    if batch_window_s < 0:
        raise ValueError(f"serve: batch_window_s={batch_window_s!r} must be >= 0")
    path = resolve_model_path(model)
    tokenizer = load_tokenizer(path)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"serve: the tokenizer at {path!r} has no chat template; a chat server needs one")
    engine = NativeEngine(path, tokenizer, dtype=dtype, device=device, max_batch=max_batch)
    try:
        return ChatServer(engine, tokenizer, model_name=served_model_name or str(model), host=host, port=port,
                          max_batch=max_batch, batch_window_s=batch_window_s, max_prompt_len=max_prompt_len,
                          default_max_tokens=default_max_tokens, log_requests=log_requests)
    except OSError:
        engine.close()
        raise


def cmd_serve(args) -> int:
    server = serve(args.model, args.host, args.port, max_batch=args.max_batch, dtype=args.dtype,
                   device=args.device, max_prompt_len=args.max_prompt_len,
                   default_max_tokens=args.default_max_tokens, served_model_name=args.served_model_name,
                   log_requests=True)
    print(f"fastcrit serve: {server.model_name!r} at {server.url}/v1 (Ctrl-C stops)", file=sys.stderr, flush=True)
    server.wait()
    return 0


def register(subparsers) -> None:
    """Add ``fastcrit serve MODEL [--host] [--port] [--max-batch N] [--dtype float32] ...``."""
    p = subparsers.add_parser("serve", help="serve a local model over an OpenAI-compatible HTTP API")
    p.add_argument("model", help="a Hugging Face model directory, or a model spec such as 'tiny'")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=64, help="most requests in one engine batch")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p.add_argument("--max-prompt-len", type=int, default=None,
                   help="refuse longer prompts with context_length_exceeded (default: the model's positions)")
    p.add_argument("--default-max-tokens", type=int, default=512, help="max_tokens when a request gives none")
    p.add_argument("--served-model-name", default=None, help="the name clients send as 'model' (default: MODEL)")
    p.set_defaults(func=cmd_serve)
