"""The OpenAI chat-completions and completions APIs as data: requests checked into SamplingParams,
rollouts shaped into response objects and stream chunks. No HTTP and no engine here (serve.py
holds both), so every shape is testable on plain values.

Shapes follow OpenAI's API reference and what vLLM and SGLang send:
- chat ``logprobs``: ``choices[i].logprobs.content[t] = {token, logprob, bytes, top_logprobs: [{token,
  logprob, bytes}]}``; completions ``logprobs``: ``{tokens, token_logprobs, top_logprobs: [{token:
  logprob}], text_offset}`` with offsets into the choice's text (vLLM's). With ``echo`` the text
  begins with the prompt and the lists with one entry per prompt token (the first one's log-prob
  and top entry None, as OpenAI sends them), then one per generated token, the EOS included: lm-eval
  reads the prompt's scores by position (``token_logprobs[ctxlen:-1]``).
- a stream is ``chat.completion.chunk`` / ``text_completion`` objects, each choice's first chunk
  carrying ``delta.role``, its last the ``finish_reason``; with ``stream_options.include_usage`` a
  last chunk with ``choices: []`` and the usage (the others carry ``usage: null``).
- errors are RequestError(status, message, param, code) -> ``{"error": {message, type, param, code}}``.

What a token is in these shapes: the text of a position is what decoding the sample up to it adds
(a character split over tokens shows on the token that completes it; the others show ""), so the
texts of ``content`` join to the message. Special tokens (the EOS that ended a sample) are counted
in ``usage.completion_tokens`` but not listed. A stop string is cut from the text with everything
after it; the tokens listed are those that begin before the cut.
"""

from __future__ import annotations

import functools
import math
import re
import time
import uuid
from dataclasses import dataclass, field

from fastcrit.rollout.chat import ConversationError, check_conversation
from fastcrit.types import Rollout, SamplingParams

MAX_N = 128  # OpenAI's bound on n
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs (completions' logprobs: 5; vLLM allows 20)
MAX_STOPS = 16  # OpenAI allows 4; lm-eval may send more, and each costs one substring test a step


class RequestError(Exception):
    """A request the server refuses; becomes an OpenAI-style error JSON with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class ApiRequest:
    """One checked request. ``prompts`` are token ids for completions (one entry per prompt) and None
    for chat (the server renders ``messages``); every prompt gets ``params.n`` choices."""

    kind: str  # "chat" or "text" (completions)
    params: SamplingParams  # max_new_tokens is None-safe: ``max_tokens`` None means the server's default
    max_tokens: int | None  # as asked; None when the request gave none
    max_tokens_field: str  # the field that named it, for errors
    messages: list[dict] | None = None
    template_kwargs: dict = field(default_factory=dict)  # chat: vLLM's chat_template_kwargs
    prompts: list | None = None  # completions: list of str or list[int], one per prompt
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # None: no logprobs; k >= 0: the chosen token's plus the top k
    model: str | None = None
    echo: bool = False  # completions: the prompt is sent back before each choice's text


# Fields whose non-neutral values ask for something this server does not do: a 400 naming the field
# instead of silently other behaviour.
_REFUSED = {
    "tools": (None, []),
    "functions": (None, []),
    "function_call": (None, "none"),
    "tool_choice": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False),
    "response_format": (None, {"type": "text"}),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "suffix": (None, ""),
    "min_p": (None, 0, 0.0),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    # vLLM's and SGLang's extensions that change what is generated or how the prompt is built
    "ignore_eos": (None, False),
    "min_tokens": (None, 0),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "prompt_logprobs": (None,),
    "use_beam_search": (None, False),
    "typical_p": (None, 1, 1.0),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
    "continue_final_message": (None, False),
    "add_generation_prompt": (None, True),
    "chat_template": (None,),
    "structured_outputs": (None,),
    "regex": (None,),
    "json_schema": (None,),
    "ebnf": (None,),
    "truncate_prompt_tokens": (None,),
}
# apply_chat_template's own arguments and the template's fixed variables: not settable per request
_TEMPLATE_OWN = frozenset(
    (
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    )
)
_REASON = {
    "tools": "tool / function calling is not supported",
    "functions": "function calling is not supported",
    "function_call": "function calling is not supported",
    "tool_choice": "tool calling is not supported",
    "response_format": "only response_format {'type': 'text'} is supported (no JSON mode or json_schema)",
    "suffix": "suffix (insertion) is not supported",
    "prompt_logprobs": "is not supported; /v1/completions with echo=true and logprobs scores the prompt",
}


def _number(body: dict, name: str, default, lo: float, hi: float, *, lo_open: bool = False) -> float:
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RequestError(400, f"{name} must be a number, got {type(v).__name__}", name)
    # json.loads reads NaN: it fails every comparison, so the range test below would let it through
    # to the sampler (a 500, or NaN logits)
    if not math.isfinite(v) or v < lo or (lo_open and v == lo) or v > hi:
        raise RequestError(400, f"{name}={v} must be in {'(' if lo_open else '['}{lo}, {hi}]", name)
    return float(v)


def _integer(body: dict, name: str, default, lo: int, hi: int):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise RequestError(400, f"{name}={v!r} must be an integer in [{lo}, {hi}]", name)
    return v


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError(400, "stop must be a string or a list of strings", "stop")
    if len(stop) > MAX_STOPS:
        raise RequestError(400, f"stop holds {len(stop)} strings, more than {MAX_STOPS}", "stop")
    return [s for s in stop if s]


def _stop_token_ids(body: dict) -> list[int]:
    ids = body.get("stop_token_ids")  # vLLM's and SGLang's extension
    if ids is None:
        return []
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise RequestError(400, "stop_token_ids must be a list of token ids", "stop_token_ids")
    return ids


def _logit_bias(body: dict) -> dict[int, float]:
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise RequestError(400, "logit_bias must be an object mapping token ids to numbers", "logit_bias")
    out = {}
    for k, v in bias.items():
        try:
            t = int(k)
        except (TypeError, ValueError):
            raise RequestError(400, f"logit_bias: {k!r} is not a token id", "logit_bias") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise RequestError(400, f"logit_bias[{k!r}]={v!r} must be a number in [-100, 100]", "logit_bias")
        out[t] = float(v)
    return out


def parse_request(body, kind: str) -> ApiRequest:
    """Check a chat-completions (``kind="chat"``) or completions (``"text"``) body; raise
    RequestError(400) naming the first bad field."""
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    for name, neutral in _REFUSED.items():
        if name in body and body[name] not in neutral:
            raise RequestError(400, f"{name}: {_REASON.get(name, 'is not supported by this server')}", name)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(400, f"stream must be a boolean, got {type(stream).__name__}", "stream")
    stream = bool(stream)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise RequestError(400, "stream_options is only allowed with stream=true", "stream_options")
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise RequestError(400, "stream_options must be an object with a boolean include_usage", "stream_options")
        include_usage = options.get("include_usage", False)
    n = _integer(body, "n", 1, 1, MAX_N)
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise RequestError(400, f"best_of={best_of!r} is not supported (only best_of equal to n)", "best_of")

    echo = body.get("echo", False)
    if echo is not None and not isinstance(echo, bool):
        raise RequestError(400, f"echo must be a boolean, got {type(echo).__name__}", "echo")
    echo = bool(echo)
    if kind == "chat":
        if echo:  # vLLM's chat echo (the last message's text) is not OpenAI's; refused, not ignored
            raise RequestError(400, "echo: echo=true is only supported by /v1/completions", "echo")
        if "messages" not in body:
            raise RequestError(400, "messages is missing", "messages")
        try:
            check_conversation(body["messages"])
        except ConversationError as e:
            raise RequestError(400, str(e), e.param) from None
        lp = body.get("logprobs")
        if lp is not None and not isinstance(lp, bool):
            raise RequestError(400, f"logprobs must be a boolean, got {type(lp).__name__}", "logprobs")
        top = _integer(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
        if top and not lp:
            raise RequestError(400, "top_logprobs needs logprobs=true", "top_logprobs")
        logprobs = (top or 0) if lp else None
        prompts = None
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, dict) or set(template_kwargs) & _TEMPLATE_OWN:
            raise RequestError(
                400,
                f"chat_template_kwargs must be an object of template variables other than {sorted(_TEMPLATE_OWN)}",
                "chat_template_kwargs",
            )
    else:
        if "prompt" not in body:
            raise RequestError(400, "prompt is missing", "prompt")
        prompts = _prompts(body["prompt"])
        template_kwargs = {}
        logprobs = _integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)

    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(name)
    least = 0 if echo else 1  # max_tokens=0 with echo scores the prompt alone (OpenAI's legacy use)
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < least
    ):
        more = "" if echo else " (0 only with echo=true)"
        raise RequestError(400, f"{name}={max_tokens!r} must be an integer >= {least}{more}", name)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise RequestError(400, f"seed={seed!r} must be an integer in [0, 2**63)", "seed")
    top_k = _integer(body, "top_k", -1, -1, 2**31 - 1)  # vLLM's and SGLang's extension; -1 = off
    if top_k == 0:
        top_k = -1  # vLLM reads 0 as off too
    params = SamplingParams(
        n=n,
        max_new_tokens=max_tokens or 1,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=top_k,
        seed=seed,
        stop=_stops(body),
        stop_token_ids=_stop_token_ids(body),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 2.0, lo_open=True),
        logit_bias=_logit_bias(body),
        top_logprobs=logprobs or 0,
    )
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, f"model must be a string, got {type(model).__name__}", "model")
    return ApiRequest(
        kind=kind,
        params=params,
        max_tokens=max_tokens,
        max_tokens_field=name,
        messages=body.get("messages") if kind == "chat" else None,
        template_kwargs=template_kwargs,
        prompts=prompts,
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        model=model,
        echo=echo,
    )


def _prompts(prompt) -> list:
    """Completions' ``prompt``: a string, a list of strings, a list of token ids or a list of such lists."""

    def ids(x) -> bool:
        return isinstance(x, list) and len(x) > 0 and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(prompt, str):
        out = [prompt]
    elif ids(prompt):
        out = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or ids(p) for p in prompt):
        out = list(prompt)
    else:
        raise RequestError(
            400,
            "prompt must be a string, a list of strings, a list of token ids or a list of such lists (none empty)",
            "prompt",
        )
    if any(p == "" for p in out):
        raise RequestError(400, "prompt must not be empty", "prompt")
    return out


# ---------------------------------------------------------------------------------------- responses


@dataclass
class Choice:
    """One sample made ready for either API: its text (stop string cut), its finish reason, and per
    listed token (id, text piece, log-prob, top [(id, log-prob)])."""

    text: str
    finish_reason: str
    completion_tokens: int
    tokens: list[tuple[int, str, float, list]] = field(default_factory=list)


def make_choice(tokenizer, rollout: Rollout, stop: list[str], *, pieces: bool, specials: bool = False) -> Choice:
    """Decode ``rollout`` and cut the first stop string in ``stop`` with what follows.
    ``pieces``: also split the text into per-token pieces (for logprobs and streaming; quadratic
    in the length, so only when asked). ``specials``: list special tokens too (echo: one entry
    per token, since clients index the list by token count)."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = rollout.output_ids
    text = tokenizer.decode(ids, skip_special_tokens=True)
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    finish = rollout.finish_reason
    if cut >= 0:
        text, finish = text[:cut], "stop"
    toks: list = []
    if pieces:
        emitted, offset = 0, 0
        for k, t in enumerate(ids):
            cur = tokenizer.decode(ids[: k + 1], skip_special_tokens=True)
            piece = "" if cur.endswith("\ufffd") and k + 1 < len(ids) else cur[emitted:]
            emitted += len(piece)
            if cut >= 0 and offset >= len(text):
                break
            if specials or t not in special:
                top = rollout.top_logprobs[k] if rollout.top_logprobs is not None else []
                toks.append((t, piece[: max(0, len(text) - offset)], rollout.logprobs[k], top))
            offset += len(piece)
    return Choice(text, finish, len(ids), toks)


def token_pieces(tokenizer, ids: list[int], text: str | None = None, window: int = 16) -> list[tuple[int, str]]:
    """(id, piece) per token of a prompt, the pieces joining to ``text`` (default: the decoded ids).
    Each piece is what the token adds to a decode of the ``window`` tokens before it (linear in the
    length, where decoding every prefix would be quadratic); a character split over tokens shows
    on the token that completes it. When ``text`` (the prompt as the client sent it) is not what
    the ids decode to, the last piece takes the difference, so offsets after the prompt stay exact."""
    out, total = [], 0
    for k, t in enumerate(ids):
        w = max(0, k - window)
        prev = tokenizer.decode(ids[w:k], skip_special_tokens=True) if k > w else ""
        cur = tokenizer.decode(ids[w : k + 1], skip_special_tokens=True)
        # a previous token whose character was not complete added nothing yet: it shows here
        piece = "" if cur.endswith("\ufffd") and k + 1 < len(ids) else cur[len(prev.rstrip("\ufffd")) :]
        out.append((t, piece))
        total += len(piece)
    if text is not None and out and "".join(p for _, p in out) != text:
        head = total - len(out[-1][1])
        out[-1] = (out[-1][0], text[head:] if head <= len(text) else "")
    return out


def echo_choice(choice: Choice, prompt_text: str, prompt_tokens: list) -> Choice:
    """``choice`` with the prompt in front (``echo``): its text, and its listed tokens preceded by
    ``prompt_tokens``, (id, piece, log-prob or None, top) per prompt token."""
    return Choice(
        prompt_text + choice.text, choice.finish_reason, choice.completion_tokens, prompt_tokens + choice.tokens
    )


def _token_text(tokenizer, t: int) -> str:
    return tokenizer.decode([t], skip_special_tokens=False)


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet (Qwen, Llama 3, GPT-2 tokenizers) read back: char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    extra = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + k): b for k, b in enumerate(extra)}


def _token_bytes(tokenizer, t: int, text: str) -> list[int]:
    """The UTF-8 bytes token ``t`` stands for. A token holding part of a character decodes alone to
    "\ufffd", whose bytes would not join with its neighbours' into the character (what ``bytes`` is
    for): its own bytes come from the vocabulary entry (byte-level BPE or a ``<0xNN>`` byte token)."""
    if "\ufffd" in text:
        piece = tokenizer.convert_ids_to_tokens(t)
        m = _BYTE_TOKEN.fullmatch(piece) if isinstance(piece, str) else None
        if m:
            return [int(m.group(1), 16)]
        dec = _byte_decoder()
        if isinstance(piece, str) and piece and all(ch in dec for ch in piece):
            return [dec[ch] for ch in piece]
    return list(text.encode("utf-8"))


def _chat_logprobs(tokenizer, tokens) -> dict:
    def entry(t, lp):
        s = _token_text(tokenizer, t)
        return {"token": s, "logprob": lp, "bytes": _token_bytes(tokenizer, t, s)}

    return {
        "content": [{**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]} for t, _, lp, top in tokens],
        "refusal": None,
    }


def _text_logprobs(tokenizer, tokens, start: int = 0) -> dict:
    offsets, pos = [], start
    for _, piece, _, _ in tokens:
        offsets.append(pos)
        pos += len(piece)
    tops = []
    for t, _, lp, top in tokens:
        if lp is None:  # an echoed prompt's first token: nothing predicts it
            tops.append(None)
            continue
        d = {_token_text(tokenizer, i): v for i, v in top}
        d.setdefault(_token_text(tokenizer, t), lp)  # the chosen token always, as vLLM lists it
        tops.append(d)
    return {
        "tokens": [_token_text(tokenizer, t) for t, _, _, _ in tokens],
        "token_logprobs": [lp for _, _, lp, _ in tokens],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _usage(prompt_tokens: int, choices: list[Choice]) -> dict:
    c = sum(ch.completion_tokens for ch in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": c, "total_tokens": prompt_tokens + c}


def response(req: ApiRequest, tokenizer, model: str, prompt_tokens: int, choices: list[Choice]) -> dict:
    """The whole (non-streamed) response: ``choices[i]`` is prompt ``i // n``'s sample ``i % n``."""
    created = int(time.time())
    if req.kind == "chat":
        out = [
            {
                "index": i,
                "message": {"role": "assistant", "content": ch.text},
                "logprobs": _chat_logprobs(tokenizer, ch.tokens) if req.logprobs is not None else None,
                "finish_reason": ch.finish_reason,
            }
            for i, ch in enumerate(choices)
        ]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": out,
            "usage": _usage(prompt_tokens, choices),
        }
    out = [
        {
            "index": i,
            "text": ch.text,
            "logprobs": _text_logprobs(tokenizer, ch.tokens) if req.logprobs is not None else None,
            "finish_reason": ch.finish_reason,
        }
        for i, ch in enumerate(choices)
    ]
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": out,
        "usage": _usage(prompt_tokens, choices),
    }


class Chunks:
    """Builds one stream's chunk objects; the server sends each as ``data: {...}``, then
    ``data: [DONE]``. All chunks of a stream share one id; with ``include_usage`` every chunk has
    ``usage: null`` but the last (``usage()``), as OpenAI sends them."""

    def __init__(self, req: ApiRequest, tokenizer, model: str):
        self.req, self.tokenizer, self.chat = req, tokenizer, req.kind == "chat"
        self.base = {
            "id": f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        if req.include_usage:
            self.base["usage"] = None

    def _one(self, choice: dict) -> dict:
        return {**self.base, "choices": [choice]}

    def role(self, i: int) -> dict:
        """Chat only: choice ``i``'s first chunk."""
        return self._one(
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        )

    def piece(self, i: int, text: str, tokens: list | None = None, offset: int = 0) -> dict:
        """Text of choice ``i`` (and the log-probs of ``tokens`` when asked; ``offset``: where the
        piece starts in the choice's text)."""
        ask = tokens is not None and self.req.logprobs is not None
        if self.chat:
            return self._one(
                {
                    "index": i,
                    "delta": {"content": text},
                    "logprobs": _chat_logprobs(self.tokenizer, tokens) if ask else None,
                    "finish_reason": None,
                }
            )
        return self._one(
            {
                "index": i,
                "text": text,
                "logprobs": _text_logprobs(self.tokenizer, tokens, offset) if ask else None,
                "finish_reason": None,
            }
        )

    def finish(self, i: int, reason: str) -> dict:
        if self.chat:
            return self._one({"index": i, "delta": {}, "logprobs": None, "finish_reason": reason})
        return self._one({"index": i, "text": "", "logprobs": None, "finish_reason": reason})

    def usage(self, prompt_tokens: int, choices: list[Choice]) -> dict:
        return {**self.base, "choices": [], "usage": _usage(prompt_tokens, choices)}


def stream_chunks(req: ApiRequest, tokenizer, model: str, prompt_tokens: int, choices: list[Choice]):
    """A whole stream from finished choices: per choice a role chunk (chat), one chunk per listed
    token with its text piece (and its log-probs when asked), and a finish chunk; then the usage
    chunk when asked."""
    make = Chunks(req, tokenizer, model)
    for i, ch in enumerate(choices):
        if make.chat:
            yield make.role(i)
        offset = 0
        for tok in ch.tokens:
            if tok[1] or req.logprobs is not None:
                yield make.piece(i, tok[1], [tok], offset)
            offset += len(tok[1])
        if offset < len(ch.text):  # text that no listed token carries (none in practice)
            yield make.piece(i, ch.text[offset:])
        yield make.finish(i, ch.finish_reason)
    if req.include_usage:
        yield make.usage(prompt_tokens, choices)
