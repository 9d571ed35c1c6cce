"""Chat-level generation: whole conversations in, assistant texts out, from a local engine or over HTTP.

CTRL's frozen proxy generator revises a solution given [user: problem, assistant: solution,
user: critique + "Please finalize your answer accordingly using the same format."] and decodes
greedily. It runs either here (``LocalChat`` over any rollout Engine) or behind an OpenAI-compatible
server (``HTTPChat`` against vLLM, SGLang, TGI or ``fastcrit serve``), both behind one ``ChatModel``
protocol.

What is and is not guaranteed:
- ``LocalChat`` and ``fastcrit serve`` render a conversation the same way (``render_conversation``:
  the chat template with the generation prompt, then ``encode`` without extra special tokens), so
  greedy texts agree when the server runs the same model, dtype and batch of conversations. A
  different server (vLLM, SGLang) renders with its own copy of the template and decodes with its own
  kernels; its greedy text can differ from ``LocalChat``'s.
- A conversation is checked before anything runs: a list of messages, each a dict with ``role`` in
  system / developer / user / assistant / tool and ``content`` a string or a list of text parts
  (``{"type": "text", "text": ...}``, joined with newlines as vLLM joins them). A developer message
  is rendered as a system message (OpenAI's newer name for it; chat templates know only system), a
  tool message as the template renders role ``tool``. Tool calls, images, audio and other part
  types are refused, naming the field.
- ``finish_reason == "prompt_too_long"`` means the conversation never reached the model: locally,
  its rendered prompt exceeds ``max_prompt_len`` (or leaves no room for ``max_new_tokens`` within the
  engine's ``max_positions``); over HTTP, the server refused it with a context-length 400 (OpenAI's
  ``code: context_length_exceeded``, or a message about the context length as vLLM, SGLang and TGI
  word it — a text heuristic, so a server that words it differently yields an error instead).
"""

from __future__ import annotations

import http.client
import json
import random
import re
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fastcrit.config import ProxyConfig

ROLES = ("system", "developer", "user", "assistant", "tool")
FINISH_REASONS = ("stop", "length", "prompt_too_long")

# What other servers call a finish: TGI says eos_token / stop_sequence, some servers eos / end_turn;
# model_length (vLLM's old name) and max_tokens mean the length limit was hit.
_STOP_ALIASES = {
    "stop": "stop",
    "eos": "stop",
    "eos_token": "stop",
    "stop_sequence": "stop",
    "end_turn": "stop",
    "length": "length",
    "max_tokens": "length",
    "model_length": "length",
}
_CONTEXT_LENGTH_RE = re.compile(
    r"context length|context_length|context window|maximum context|"
    r"must have less than \d+ tokens|`max_new_tokens` must be <=",
    re.IGNORECASE,
)
_MAX_BACKOFF_S = 60.0
_EXCERPT_CHARS = 300


@dataclass
class ChatOutput:
    """One assistant answer to one conversation."""

    text: str  # the decoded answer, special tokens removed; "" when finish_reason is prompt_too_long
    finish_reason: str  # "stop" (EOS / stop token), "length" (max_new_tokens) or "prompt_too_long"
    prompt_tokens: int  # tokens of the rendered prompt; 0 when a server did not report usage or refused it
    completion_tokens: int  # generated tokens, the stop token included; 0 when not reported


@runtime_checkable
class ChatModel(Protocol):
    def chat(
        self,
        conversations: list[list[dict]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        top_p: float = 1.0,
    ) -> list[ChatOutput]:
        """Answer every conversation once (n=1); outputs in input order. temperature 0 is greedy;
        ``top_p`` < 1 samples from the smallest set of tokens holding that much probability."""
        ...

    def close(self) -> None: ...


class ChatError(RuntimeError):
    """A chat request that could not be answered (bad server answer, refused request, no connection)."""


class ConversationError(ValueError):
    """A malformed conversation. ``param`` names the field, OpenAI style, e.g. ``messages[2].role``."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param
        self.reason = message


def check_conversation(messages) -> None:
    """Raise ConversationError naming the first bad field of one conversation (a list of messages)."""
    if not isinstance(messages, list):
        raise ConversationError("messages", f"must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise ConversationError("messages", "must hold at least one message")
    for j, m in enumerate(messages):
        where = f"messages[{j}]"
        if not isinstance(m, dict):
            raise ConversationError(where, f"must be an object with role and content, got {type(m).__name__}")
        if "role" not in m:
            raise ConversationError(f"{where}.role", "is missing")
        if m["role"] not in ROLES:
            raise ConversationError(f"{where}.role", f"{m['role']!r} is not one of {', '.join(ROLES)}")
        for key in ("tool_calls", "function_call"):
            if m.get(key):
                raise ConversationError(f"{where}.{key}", "tool and function calls are not supported")
        if "content" not in m:
            raise ConversationError(f"{where}.content", "is missing")
        content = m["content"]
        if isinstance(content, list):
            for k, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ConversationError(
                        f"{where}.content[{k}].type",
                        f"{kind!r}: only text parts ({{'type': 'text', 'text': ...}}) are supported",
                    )
                if not isinstance(part.get("text"), str):
                    raise ConversationError(f"{where}.content[{k}].text", "must be a string")
        elif not isinstance(content, str):
            raise ConversationError(
                f"{where}.content", f"must be a string or a list of text parts, got {type(content).__name__}"
            )


def message_text(content) -> str:
    """A checked message's content as one string: text parts joined with newlines (as vLLM does)."""
    return content if isinstance(content, str) else "\n".join(part["text"] for part in content)


def render_conversation(tokenizer, messages: list[dict], template_kwargs: dict | None = None) -> list[int]:
    """Prompt token ids of a conversation: the chat template with the generation prompt, encoded
    without adding special tokens (the template already holds them), as fastcrit.data.prompts does.
    ``template_kwargs``: more variables for the template (e.g. Qwen3's ``enable_thinking``).
    A template that refuses the conversation (e.g. a system message out of place), or a tokenizer
    without one (a base model), raises ConversationError on ``messages``."""
    from jinja2 import TemplateError

    if not getattr(tokenizer, "chat_template", None):
        raise ConversationError(
            "messages",
            "this model's tokenizer has no chat template (a base model), so a conversation has no "
            "prompt form; send the text to /v1/completions",
        )
    try:
        text = tokenizer.apply_chat_template(
            [
                {"role": "system" if m["role"] == "developer" else m["role"], "content": message_text(m["content"])}
                for m in messages
            ],
            tokenize=False,
            add_generation_prompt=True,
            **(template_kwargs or {}),
        )
    except TemplateError as e:
        raise ConversationError("messages", f"the chat template refused this conversation: {e}") from None
    return tokenizer.encode(text, add_special_tokens=False)


def _check_settings(max_new_tokens: int, temperature: float, seed, top_p: float = 1.0) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature={temperature!r} must be a number")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed={seed!r} must be an integer or None")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r} must be a number in (0, 1]")


def _check_all(conversations) -> None:
    if not isinstance(conversations, list):
        raise ValueError(f"conversations must be a list of conversations, got {type(conversations).__name__}")
    for i, conv in enumerate(conversations):
        try:
            check_conversation(conv)
        except ConversationError as e:
            raise ConversationError(f"conversations[{i}].{e.param}", e.reason) from None


class LocalChat:
    """ChatModel over a rollout Engine (native or SGLang) and the model's tokenizer.

    All conversations that fit go to the engine in ONE ``generate`` call (n=1), so the engine batches
    them as it likes; conversations whose prompt is too long are answered with ``prompt_too_long``
    and never sent. ``seed`` is passed to the engine only when sampling (not ``is_greedy``):
    conversation k of the call draws from seed + k (both engines; SGLang only with deterministic
    inference on), also when conversations before it were too long: the fitting ones then go in
    one ``generate`` call per unbroken run, each run's seed moved to its first conversation. So a
    conversation's sample depends on its seed and place, not on which others were left out.
    """

    def __init__(self, engine, tokenizer, *, max_prompt_len: int):
        if isinstance(max_prompt_len, bool) or not isinstance(max_prompt_len, int) or max_prompt_len < 1:
            raise ValueError(f"LocalChat: max_prompt_len={max_prompt_len!r} must be an integer >= 1")
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_prompt_len = max_prompt_len

    def chat(
        self,
        conversations: list[list[dict]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        top_p: float = 1.0,
    ) -> list[ChatOutput]:
        from fastcrit.types import SamplingParams, is_greedy

        _check_settings(max_new_tokens, temperature, seed, top_p)
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0")
        _check_all(conversations)
        limit = self.max_prompt_len
        max_positions = getattr(self.engine, "max_positions", None)
        if max_positions:  # the engine refuses prompt + max_new_tokens beyond its positions
            limit = min(limit, int(max_positions) - max_new_tokens)
        if max_positions and max_new_tokens >= int(max_positions):
            raise ValueError(
                f"max_new_tokens={max_new_tokens} leaves no room for a prompt within the engine's "
                f"max_positions={max_positions}"
            )
        prompts = []
        for i, conv in enumerate(conversations):
            try:
                prompts.append(render_conversation(self.tokenizer, conv))
            except ConversationError as e:
                raise ConversationError(f"conversations[{i}].{e.param}", e.reason) from None
        fits = [i for i, p in enumerate(prompts) if len(p) <= limit]
        outputs = [ChatOutput("", "prompt_too_long", len(p), 0) for p in prompts]
        if not fits:
            return outputs
        seed = None if is_greedy(temperature) else seed
        # The engine draws sample j of a call from seed + j: a call per unbroken run of fitting
        # conversations keeps conversation k at seed + k (greedy draws nothing: one call).
        runs = [fits] if seed is None else _unbroken_runs(fits)
        rollouts = []
        for run in runs:
            params = SamplingParams(
                n=1,
                max_new_tokens=max_new_tokens,
                temperature=float(temperature),
                top_p=float(top_p),
                seed=None if seed is None else seed + run[0],
            )
            rollouts += self.engine.generate([prompts[i] for i in run], params)
        if len(rollouts) != len(fits):
            raise RuntimeError(f"LocalChat: the engine returned {len(rollouts)} rollouts for {len(fits)} prompts (n=1)")
        for i, r in zip(fits, rollouts):
            if r.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"LocalChat: the engine gave finish_reason={r.finish_reason!r} for conversation {i}")
            text = self.tokenizer.decode(r.output_ids, skip_special_tokens=True)
            outputs[i] = ChatOutput(text, r.finish_reason, len(prompts[i]), len(r.output_ids))
        return outputs

    def close(self) -> None:
        self.engine = None


def _unbroken_runs(indices: list[int]) -> list[list[int]]:
    """Ascending ``indices`` cut where one is skipped: [0, 1, 3, 4, 6] -> [[0, 1], [3, 4], [6]]."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def chat_completions_url(endpoint: str) -> str:
    """``{endpoint}/v1/chat/completions``; an endpoint that already ends with /v1 gets no second one."""
    if not isinstance(endpoint, str) or not re.match(r"^https?://[^/\s]+", endpoint):
        raise ValueError(f"endpoint {endpoint!r} must be an http:// or https:// URL, e.g. http://127.0.0.1:8000")
    base = endpoint.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if not base.endswith("/v1"):
        base += "/v1"
    return base + "/chat/completions"


def _excerpt(body: bytes | str) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    text = " ".join(text.split())
    return repr(text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "...")


def _server_message(body: bytes) -> tuple[str | None, str | None]:
    """(message, code) from an OpenAI-style error body {"error": {"message", "code"}}, when it has one.
    vLLM / SGLang also put {"message": ...} or {"detail": ...} at the top level; those count too."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, None
    if not isinstance(obj, dict):
        return None, None
    err = obj.get("error")
    if isinstance(err, dict):
        msg, code = err.get("message"), err.get("code")
        return (msg if isinstance(msg, str) else None), (str(code) if code is not None else None)
    for key in ("message", "detail"):
        if isinstance(obj.get(key), str):
            return obj[key], None
    if isinstance(err, str):
        return err, None
    return None, None


class HTTPChat:
    """ChatModel over an OpenAI-compatible ``POST /v1/chat/completions`` (vLLM, SGLang, TGI, fastcrit serve).

    Each conversation is one request {model, messages, max_tokens, temperature, n: 1, seed}, the
    seed (when given) being seed + k for conversation k, as ``LocalChat`` draws it: a server that
    honours seeds (vLLM, ``fastcrit serve``) then gives a conversation the same sample in any call;
    up to ``concurrency`` are in flight (a thread pool over urllib). Connection errors, timeouts, 429 and
    5xx are retried ``retries`` times with exponential backoff from ``backoff_s`` (a server's
    ``Retry-After`` is honoured up to 60 s); any other status, a body that is not JSON or lacks
    ``choices[0].message.content``, or an unknown ``finish_reason`` raises ChatError naming the URL,
    the status and an excerpt of the body. The first failure stops the call: requests not yet sent are
    cancelled, those in flight are left to finish in the background.

    ``temperature`` is passed through unchecked (the server judges it; OpenAI allows 0 to 2).
    Not covered: ``timeout_s`` is urllib's per-socket-operation timeout, not a bound on a whole
    request; the server's own tokenisation and template decide the prompt, so ``prompt_tokens`` is
    whatever ``usage`` reports (0 without usage).
    """

    def __init__(
        self,
        endpoint: str,
        model: str,
        *,
        api_key: str | None = None,
        concurrency: int = ProxyConfig.concurrency,
        timeout_s: float = ProxyConfig.timeout_s,
        retries: int = ProxyConfig.retries,
        backoff_s: float = 1.0,
    ):
        self.url = chat_completions_url(endpoint)
        if not isinstance(model, str) or not model:
            raise ValueError(f"HTTPChat: model={model!r} must be a non-empty string (the served model name)")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"HTTPChat: concurrency={concurrency!r} must be an integer >= 1")
        if not timeout_s > 0:
            raise ValueError(f"HTTPChat: timeout_s={timeout_s!r} must be > 0")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"HTTPChat: retries={retries!r} must be an integer >= 0")
        if not backoff_s >= 0:
            raise ValueError(f"HTTPChat: backoff_s={backoff_s!r} must be >= 0")
        self.model = model
        self.api_key = api_key
        self.concurrency = concurrency
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self.backoff_s = float(backoff_s)
        self._closed = threading.Event()

    def chat(
        self,
        conversations: list[list[dict]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        top_p: float = 1.0,
    ) -> list[ChatOutput]:
        if self._closed.is_set():
            raise RuntimeError("HTTPChat.chat: the client is closed")
        _check_settings(max_new_tokens, temperature, seed, top_p)
        _check_all(conversations)
        if not conversations:
            return []
        bodies = []
        for k, conv in enumerate(conversations):
            payload = {
                "model": self.model,
                "messages": [{"role": m["role"], "content": m["content"]} for m in conv],
                "max_tokens": max_new_tokens,
                "temperature": float(temperature),
                "n": 1,
            }
            if seed is not None:  # one seed for all would give k samples of one prompt the same draw
                payload["seed"] = seed + k
            if top_p < 1:  # left out otherwise: a server's default is 1
                payload["top_p"] = float(top_p)
            bodies.append(json.dumps(payload).encode("utf-8"))
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies)), thread_name_prefix="httpchat")
        try:
            futures = [pool.submit(self._one, i, b) for i, b in enumerate(bodies)]
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._closed.set()  # wakes any backoff sleep; those requests then give up

    # ------------------------------------------------------------------ one request

    def _one(self, index: int, body: bytes) -> ChatOutput:
        where = f"conversation {index}: POST {self.url}"
        attempts = self.retries + 1
        for attempt in range(attempts):
            retry_after = None
            try:
                status, data = self._post(body)
            except urllib.error.HTTPError as e:
                status, data = e.code, _read_quietly(e)
                retry_after = _retry_after(e.headers)
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, OSError) as e:
                reason = getattr(e, "reason", e)
                problem = f"no answer ({type(reason).__name__}: {reason})"
                if attempt + 1 < attempts and self._backoff(attempt, None):
                    continue
                raise ChatError(f"{where}: {problem} after {attempt + 1} attempt(s)") from e
            if status == 429 or 500 <= status <= 599:
                if attempt + 1 < attempts and self._backoff(attempt, retry_after):
                    continue
                raise ChatError(f"{where}: HTTP {status} after {attempt + 1} attempt(s); body {_excerpt(data)}")
            if 200 <= status <= 299:
                return self._parse(where, status, data)
            message, code = _server_message(data)
            if status == 400 and (
                code == "context_length_exceeded" or (message is not None and _CONTEXT_LENGTH_RE.search(message))
            ):
                return ChatOutput("", "prompt_too_long", 0, 0)
            said = f"; server says: {message}" if message else ""
            raise ChatError(f"{where}: HTTP {status}{said}; body {_excerpt(data)}")
        raise AssertionError("unreachable")

    def _post(self, body: bytes) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return resp.status, resp.read()

    def _backoff(self, attempt: int, retry_after: float | None) -> bool:
        """Sleep before the next attempt; False when the client was closed meanwhile."""
        delay = self.backoff_s * (2**attempt) * (1.0 + 0.25 * random.random())
        if retry_after is not None:
            delay = max(delay, retry_after)
        return not self._closed.wait(min(delay, _MAX_BACKOFF_S))

    def _parse(self, where: str, status: int, data: bytes) -> ChatOutput:
        def bad(what: str) -> ChatError:
            return ChatError(f"{where}: HTTP {status} but {what}; body {_excerpt(data)}")

        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise bad("the body is not JSON") from None
        if not isinstance(obj, dict):
            raise bad(f"the body is a JSON {type(obj).__name__}, not an object")
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            raise bad("it has no choices list (or an empty one)")
        choice = choices[0]
        if not isinstance(choice, dict):
            raise bad("choices[0] is not an object")
        message = choice.get("message")
        if not isinstance(message, dict):
            raise bad("choices[0].message is missing or not an object")
        content = message.get("content")
        if not isinstance(content, str):
            raise bad("choices[0].message.content is missing or not a string")
        reason = choice.get("finish_reason")
        if not isinstance(reason, str) or reason not in _STOP_ALIASES:
            raise bad(f"choices[0].finish_reason={reason!r} is not one of {sorted(_STOP_ALIASES)}")
        prompt_tokens = completion_tokens = 0
        usage = obj.get("usage")
        if usage is not None:
            if not isinstance(usage, dict):
                raise bad("usage is not an object")
            counts = []
            for key in ("prompt_tokens", "completion_tokens"):
                v = usage.get(key, 0)
                if v is None:
                    v = 0
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise bad(f"usage.{key}={v!r} is not a count")
                counts.append(v)
            prompt_tokens, completion_tokens = counts
        return ChatOutput(content, _STOP_ALIASES[reason], prompt_tokens, completion_tokens)


def _read_quietly(e: urllib.error.HTTPError) -> bytes:
    try:
        return e.read() or b""
    except (OSError, http.client.HTTPException):
        return b""


def _retry_after(headers) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date; the exponential backoff is used instead
        return None
