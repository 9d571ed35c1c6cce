"""A small OpenAI-compatible server for a local Hugging Face model, backed by the NativeEngine.

``fastcrit serve MODEL`` (or ``serve(model, host, port)`` in-process) answers
``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /v1/models/{id}``
and ``GET /health``. It is meant for tests, evaluation harnesses, recipes and small proxy generators
on one machine; vLLM or SGLang serve large ones. The request and response shapes (n, stop,
logprobs, streaming, penalties, errors) live in fastcrit.rollout.openai_api.

Requests that arrive together are gathered into one engine batch: after the first request of a batch
the server waits ``batch_window_s`` for more (up to ``max_batch`` prompts), and requests that come
while the engine is busy form the next batch. Prompts with equal sampling settings
(``SamplingParams.key``) share one ``generate`` call. Chat prompts are rendered exactly as
fastcrit.rollout.chat.LocalChat renders them, so a batch of greedy requests gets the texts LocalChat
gets for the same conversations in one call; a completions prompt is the tokenizer's encoding of
the string (special tokens added as the tokenizer adds them), or the token ids given.

Departures from the OpenAI API, each refused with a 400 naming the field rather than ignored: no
tools / function calling, response_format other than text, echo on chat, suffix, best_of other
than n, images or audio, vLLM's and SGLang's extensions that change the answer (openai_api._REFUSED).
Completions' ``echo`` sends the prompt back before each choice, with ``logprobs`` its tokens'
log-probs from one forward pass of the engine's model (what lm-eval's loglikelihood tasks read;
``max_tokens=0`` then scores the prompt alone).

A stream is live: NativeEngine.generate's ``on_step`` hands each drawn token to the request's
thread, which sends the text as it grows (a stop string's length - 1 characters held back, so no
part of a stop string is ever sent). A stream that asks for logprobs or echo, or one served by an
engine without ``on_step``, is sent when its answer is complete, in the same chunks. When every
client of a live generate call has gone, the call stops (else an abandoned stream would hold the
engine, and every request queued behind it, for all of its max_tokens).
``max_tokens`` defaults to ``default_max_tokens`` (chat) or 16 (completions, as OpenAI),
each cut to the room the model's positions leave. ``temperature`` defaults to 1 as in OpenAI.
A prompt over ``max_prompt_len`` tokens, or one that leaves no room for max_tokens within the
model's positions, gets a 400 with ``code: context_length_exceeded`` as OpenAI sends.
A seeded sampled (temperature > 0) prompt goes to the engine in a call of its own, so with the
native engine its answer depends on the seed and the prompt, not on the requests around it (its
j-th choice draws from seed + j).
With an API key (``api_key=`` / ``--api-key`` / ``FASTCRIT_API_KEY``) every route but /health needs
``Authorization: Bearer KEY``. Not covered: no TLS, and no bound on queued requests beyond the
threads the HTTP server starts.
"""

from __future__ import annotations

import inspect
import ipaddress
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field

from fastcrit.rollout.chat import ConversationError, render_conversation
from fastcrit.rollout.openai_api import (
    ApiRequest,
    Chunks,
    RequestError,
    echo_choice,
    make_choice,
    parse_request,
    response,
    stream_chunks,
    token_pieces,
)
from fastcrit.rollout.serve_http import _Handler, _HTTPServer
from fastcrit.types import Rollout, SamplingParams

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
_LOOPBACK_NAMES = ("localhost", "ip6-localhost")


@dataclass
class _Pending:
    ids: list[int]
    params: SamplingParams  # prompts with equal params.key() share a generate call
    done: threading.Event = field(default_factory=threading.Event)
    output: list | None = None  # params.n Rollouts
    error: str | None = None
    # A live stream: (choice index, token id) per drawn token, then None when the prompt is done
    stream: queue.Queue | None = None
    first: int = 0  # the choice index of this prompt's first sample
    score: int | None = None  # echo with logprobs: score the prompt too, with this many top entries
    prompt_scores: list | None = None  # then (log-prob, top [(id, log-prob)]) per prompt token
    abandoned: bool = False  # its stream's client left


class _Abandoned(Exception):
    """Raised from on_step to stop a generate call whose every client has gone."""


class ChatServer:
    """A running server: ``url`` (http://host:port), ``model_name``, ``stats`` and ``close()``.

    ``engine`` and ``tokenizer`` are the NativeEngine and tokenizer it answers with (the engine
    decodes with a tokenizer of its own, for stop strings, so the two never share one across
    threads); ``stats`` counts ``requests`` (prompts) answered by the engine and engine ``batches``
    and keeps ``max_batch_seen``. ``api_key``: when set, every route but /health needs
    ``Authorization: Bearer <api_key>``.
    """

    def __init__(
        self,
        engine,
        tokenizer,
        *,
        model_name: str,
        host: str,
        port: int,
        max_batch: int,
        batch_window_s: float,
        max_prompt_len: int | None,
        default_max_tokens: int,
        log_requests: bool = False,
        api_key: str | None = None,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.max_positions = getattr(engine, "max_positions", None)
        self.max_prompt_len = max_prompt_len
        self.default_max_tokens = default_max_tokens
        self.log_requests = log_requests
        self.api_key = api_key or None
        self.created = int(time.time())
        # the engine can report tokens as it draws them (NativeEngine's on_step): streams are live
        self._live = "on_step" in inspect.signature(engine.generate).parameters
        self.stats = {"requests": 0, "batches": 0, "max_batch_seen": 0}
        self._tok_lock = threading.Lock()  # fast tokenizers may refuse concurrent use from threads
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._closing = threading.Event()
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.app = self
        h, p = self._httpd.server_address[:2]
        self.url = f"http://{h}:{p}"
        self._batcher = threading.Thread(target=self._batch_loop, name="fastcrit-serve-batcher", daemon=True)
        self._http_thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="fastcrit-serve-http", daemon=True
        )
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

    def __enter__(self) -> ChatServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ requests

    def complete(self, body, kind: str = "chat") -> tuple[ApiRequest, dict | list[dict]]:
        """Answer one chat-completions (``kind="chat"``) or completions (``"text"``) body, already
        JSON-decoded: (the checked request, the response object, or the stream's chunk objects when
        ``stream``). Raises RequestError."""
        from fastcrit.types import is_greedy

        req = parse_request(body, kind)
        if req.model is not None and req.model != self.model_name:
            raise RequestError(
                404,
                f"the model {req.model!r} does not exist; this server serves {self.model_name!r}",
                "model",
                "model_not_found",
            )
        where = "messages" if kind == "chat" else "prompt"
        try:
            with self._tok_lock:
                if kind == "chat":
                    prompts = [render_conversation(self.tokenizer, req.messages, req.template_kwargs)]
                else:
                    prompts = [p if isinstance(p, list) else self.tokenizer.encode(p) for p in req.prompts]
        except ConversationError as e:
            raise RequestError(400, str(e), e.param) from None
        vocab = getattr(self.engine, "vocab_size", None)
        # the engine would refuse the whole call: a 500, not a 400
        for name, ids in (("logit_bias", req.params.logit_bias), ("stop_token_ids", req.params.stop_token_ids)):
            bad = next((t for t in ids if vocab and not 0 <= t < vocab), None)
            if bad is not None:
                raise RequestError(400, f"{name}: token id {bad} is outside the vocabulary [0, {vocab})", name)
        score = req.logprobs if req.echo and req.logprobs is not None else None
        if score is not None and getattr(self.engine, "model", None) is None:
            raise RequestError(400, "echo with logprobs needs the native engine's model to score prompts", "echo")
        for p in prompts:
            if vocab and not all(0 <= t < vocab for t in p):
                raise RequestError(400, f"prompt holds a token id outside the vocabulary [0, {vocab})", "prompt")
            if not p:
                raise RequestError(400, "the prompt encodes to no tokens", where)
        longest = max(len(p) for p in prompts)
        if self.max_prompt_len is not None and longest > self.max_prompt_len:
            raise RequestError(
                400,
                f"the prompt has {longest} tokens, more than the server's max_prompt_len={self.max_prompt_len}",
                where,
                "context_length_exceeded",
            )
        max_tokens = req.max_tokens
        if max_tokens is None:
            max_tokens = self.default_max_tokens if kind == "chat" else COMPLETIONS_DEFAULT_MAX_TOKENS
            if self.max_positions:  # a default never overflows: it takes the room that is left
                max_tokens = max(1, min(max_tokens, self.max_positions - longest))
        if self.max_positions and longest + max_tokens > self.max_positions:
            raise RequestError(
                400,
                f"this model's maximum context length is {self.max_positions} tokens; the "
                f"prompt has {longest} and {req.max_tokens_field}={max_tokens}",
                where,
                "context_length_exceeded",
            )
        params = req.params
        params.max_new_tokens = max_tokens
        if is_greedy(params.temperature):
            params.seed = None  # greedy draws nothing; without a seed such requests share calls
        live = req.stream and self._live and req.logprobs is None and not req.echo
        events: queue.Queue | None = queue.Queue() if live else None
        items = [_Pending(p, params, stream=events, first=k * params.n, score=score) for k, p in enumerate(prompts)]
        if self._closing.is_set():
            raise RequestError(503, "the server is shutting down", kind="server_error")
        for item in items:
            self._queue.put(item)
        if live:
            return req, self._live_chunks(req, items, sum(len(p) for p in prompts), events)
        for item in items:
            while not item.done.wait(0.5):
                if not self._batcher.is_alive():  # closed between the check above and the put
                    raise RequestError(503, "the server is shutting down", kind="server_error")
            if item.error is not None:
                raise RequestError(500 if not self._closing.is_set() else 503, item.error, kind="server_error")
        pieces = req.stream or req.logprobs is not None
        with self._tok_lock:
            choices = [
                make_choice(self.tokenizer, r, params.stop, pieces=pieces, specials=req.echo)
                for it in items
                for r in it.output
            ]
            if req.echo:
                choices = self._echoed(req, items, choices, pieces)
            prompt_tokens = sum(len(p) for p in prompts)
            if req.stream:
                return req, list(stream_chunks(req, self.tokenizer, self.model_name, prompt_tokens, choices))
            return req, response(req, self.tokenizer, self.model_name, prompt_tokens, choices)

    def _echoed(self, req: ApiRequest, items: list[_Pending], choices: list, pieces: bool) -> list:
        """``choices`` with their prompt in front (``echo``; called under _tok_lock): the prompt as
        sent, or the ids decoded, and with ``pieces`` one listed token per prompt token."""
        n, out = req.params.n, []
        for k, it in enumerate(items):
            given = req.prompts[k]
            text = given if isinstance(given, str) else self.tokenizer.decode(it.ids, skip_special_tokens=True)
            toks = []
            if pieces:
                scores = it.prompt_scores or [(None, [])] * len(it.ids)
                toks = [
                    (t, p, lp, top) for (t, p), (lp, top) in zip(token_pieces(self.tokenizer, it.ids, text), scores)
                ]
            out += [echo_choice(ch, text, toks) for ch in choices[k * n : (k + 1) * n]]
        return out

    def _live_chunks(self, req: ApiRequest, items: list[_Pending], prompt_tokens: int, events: queue.Queue):
        """The stream's chunks (``_live_body``); when the client goes (the handler closes this
        generator), its prompts are marked abandoned, which stops their generate call."""
        try:
            yield from self._live_body(req, items, prompt_tokens, events)
        except GeneratorExit:
            for it in items:
                it.abandoned = True
            raise

    def _live_body(self, req: ApiRequest, items: list[_Pending], prompt_tokens: int, events: queue.Queue):
        """A stream's chunks as the engine draws the tokens. A choice's text is sent up to a stop
        string it holds, else up to where one could still begin (its length - 1 characters held
        back), and never with a character still split over tokens; what the finished choice (stop string cut) holds
        beyond that goes with its last piece, so the pieces join to the whole answer's text."""
        make = Chunks(req, self.tokenizer, self.model_name)
        n, stops = req.params.n, req.params.stop
        hold = max((len(x) for x in stops), default=1) - 1
        total = len(items) * n
        ids: list[list[int]] = [[] for _ in range(total)]
        sent = [0] * total
        if make.chat:
            for i in range(total):
                yield make.role(i)
        pending = len(items)
        while pending:
            try:
                ev = events.get(timeout=0.5)
            except queue.Empty:
                if not self._batcher.is_alive():
                    yield RequestError(503, "the server is shutting down", kind="server_error").body()
                    return
                continue
            if ev is None:
                pending -= 1
                continue
            i, tok = ev
            ids[i].append(tok)
            with self._tok_lock:
                text = self.tokenizer.decode(ids[i], skip_special_tokens=True)
            safe = min(len(text.rstrip("\ufffd")), len(text) - hold)
            for x in stops:  # the token that completes a stop string is this sample's last
                at = text.find(x)
                safe = min(safe, at) if at >= 0 else safe
            if safe > sent[i]:
                yield make.piece(i, text[sent[i] : safe])
                sent[i] = safe
        failed = next((it.error for it in items if it.error is not None), None)
        if failed is not None:
            yield RequestError(500, failed, kind="server_error").body()
            return
        with self._tok_lock:
            choices = [make_choice(self.tokenizer, r, stops, pieces=False) for it in items for r in it.output]
        for i, ch in enumerate(choices):
            if len(ch.text) > sent[i]:
                yield make.piece(i, ch.text[sent[i] :])
            yield make.finish(i, ch.finish_reason)
        if req.include_usage:
            yield make.usage(prompt_tokens, choices)

    def model_card(self) -> dict:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "fastcrit",
            "max_model_len": self.max_positions,
        }

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card()]}

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
        groups: dict[tuple, list[_Pending]] = {}
        for item in batch:
            groups.setdefault(item.params.key(), []).append(item)
        self.stats["batches"] += 1
        self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], len(batch))
        for items in groups.values():
            params = items[0].params
            n = params.n
            try:
                if params.max_new_tokens == 0:  # echo with max_tokens=0: the prompt is the whole answer
                    rollouts = [Rollout(k, it.ids, [], [], "length") for k, it in enumerate(items) for _ in range(n)]
                elif params.seed is None:
                    rollouts = self.engine.generate([it.ids for it in items], params, **self._on_step(items, n))
                else:  # sample k of a call draws from seed + k: alone, each prompt's answers are the seed's
                    rollouts = [r for it in items for r in self._generate_alone(it, params, n)]
                for k, it in enumerate(items):
                    it.output = rollouts[k * n : (k + 1) * n]
                    if it.score is not None:  # here, so the engine's model is never used by two threads
                        it.prompt_scores = _prompt_logprobs(self.engine, it.ids, it.score)
                self.stats["requests"] += len(items)
            except Exception as e:  # one bad group must not take the server down; its requests get a 500
                for it in items:
                    it.error = f"generation failed: {type(e).__name__}: {e}"
            finally:
                for it in items:
                    it.done.set()
                    if it.stream is not None:
                        it.stream.put(None)

    def _generate_alone(self, it: _Pending, params: SamplingParams, n: int) -> list[Rollout]:
        """``it``'s samples from a generate call of its own. A stream its client left stops there,
        with empty samples nobody reads, and the group's other requests still get theirs."""
        try:
            return self.engine.generate([it.ids], params, **self._on_step([it], n))
        except _Abandoned:
            return [Rollout(0, it.ids, [], [], "length") for _ in range(n)]

    def _on_step(self, items: list[_Pending], n: int) -> dict:
        """``on_step=`` for a generate call over ``items`` when one of them streams, else nothing."""
        if not any(it.stream is not None for it in items):
            return {}

        def on_step(ks: list[int], tokens: list[int]) -> None:
            if all(it.abandoned for it in items):  # nobody reads on: free the engine for the queue
                raise _Abandoned
            for k, t in zip(ks, tokens):
                it = items[k // n]
                if it.stream is not None:
                    it.stream.put((it.first + k % n, t))

        return {"on_step": on_step}


def _prompt_logprobs(engine, ids: list[int], top: int, rows: int = 256) -> list:
    """(log-prob, top ``top`` [(id, log-prob)]) of each prompt token given those before it, from
    one forward pass of the engine's model at temperature 1 (as vLLM's prompt log-probs; nothing
    predicts the first token: (None, None)). Log-softmax runs ``rows`` positions at a time, so
    float32 copies of the logits stay small for a large vocabulary."""
    import torch

    out: list = [(None, None)]
    with torch.inference_mode():
        x = torch.tensor([ids], dtype=torch.long, device=engine.device)
        logits = engine.model(input_ids=x, use_cache=False).logits[0]
        for s in range(0, len(ids) - 1, rows):
            e = min(s + rows, len(ids) - 1)  # position i predicts token i + 1
            lp = torch.log_softmax(logits[s:e].float(), dim=-1)
            chosen = lp.gather(1, x[0, s + 1 : e + 1, None])[:, 0].tolist()
            if top:
                v, i = lp.topk(min(top, lp.shape[-1]), dim=-1)
                tops = [list(zip(a, b)) for a, b in zip(i.tolist(), v.tolist())]
            else:
                tops = [[] for _ in chosen]
            out += list(zip(chosen, tops))
    return out


def serve(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    max_batch: int = 64,
    dtype: str = "float32",
    device: str = "cpu",
    max_prompt_len: int | None = None,
    default_max_tokens: int = 512,
    batch_window_s: float = 0.01,
    served_model_name: str | None = None,
    log_requests: bool = False,
    api_key: str | None = None,
) -> ChatServer:
    """Load ``model`` (a Hugging Face directory or model spec such as ``tiny``) into a NativeEngine and
    start serving it in background threads; port 0 picks a free port (see ``.url``).

    The served model name is ``served_model_name`` or ``model`` as given (vLLM does the same); a
    request naming another model gets a 404, one naming none is served. ``api_key``: every route but
    /health then needs ``Authorization: Bearer <api_key>``; without one, binding to anything but a
    loopback address prints a warning (vLLM and SGLang warn the same way).
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
    if not getattr(tokenizer, "chat_template", None):  # a base model: completions only (lm-eval's use)
        print(
            f"fastcrit serve: the tokenizer at {path!r} has no chat template: /v1/completions serves, "
            "/v1/chat/completions answers 400",
            file=sys.stderr,
            flush=True,
        )
    if not api_key and not _is_loopback(host):
        print(
            f"fastcrit serve: WARNING: listening on {host} without an API key: anyone who can reach this "
            "port can use the model (set --api-key or FASTCRIT_API_KEY)",
            file=sys.stderr,
            flush=True,
        )
    # The engine decodes for stop strings in the batcher thread while request threads render
    # prompts: a tokenizer of its own, since a fast tokenizer refuses use from two threads at once.
    engine = NativeEngine(path, load_tokenizer(path), dtype=dtype, device=device, max_batch=max_batch)
    try:
        return ChatServer(
            engine,
            tokenizer,
            model_name=served_model_name or str(model),
            host=host,
            port=port,
            max_batch=max_batch,
            batch_window_s=batch_window_s,
            max_prompt_len=max_prompt_len,
            default_max_tokens=default_max_tokens,
            log_requests=log_requests,
            api_key=api_key,
        )
    except OSError:
        engine.close()
        raise


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_serve(args) -> int:
    if not 0 <= args.port <= 65535:  # checked before the model loads, not by bind() after
        print(f"fastcrit serve: --port {args.port}: must be in 0..65535", file=sys.stderr)
        return 2
    try:
        server = serve(
            args.model,
            args.host,
            args.port,
            max_batch=args.max_batch,
            dtype=args.dtype,
            device=args.device,
            max_prompt_len=args.max_prompt_len,
            default_max_tokens=args.default_max_tokens,
            served_model_name=args.served_model_name,
            log_requests=True,
            api_key=args.api_key or os.environ.get("FASTCRIT_API_KEY") or None,
        )
    except (ValueError, OSError, RuntimeError) as e:
        # a bad option, a directory that is not a loadable model (the loaders raise RuntimeError),
        # a port in use: the message names it, a traceback would bury it
        print(f"fastcrit serve: {e}", file=sys.stderr)
        return 2
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
    p.add_argument(
        "--max-prompt-len",
        type=int,
        default=None,
        help="refuse longer prompts with context_length_exceeded (default: the model's positions)",
    )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=512,
        help="max_tokens when a chat request gives none (completions: 16, as OpenAI)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health (default: $FASTCRIT_API_KEY)",
    )
    p.add_argument("--served-model-name", default=None, help="the name clients send as 'model' (default: MODEL)")
    p.set_defaults(func=cmd_serve)
