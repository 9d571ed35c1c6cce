"""Prompt templates: examples -> chat-formatted token ids."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from fastcrit.data.datasets import Example


@dataclass
class EncodedPrompt:
    ids: list[int]
    example: Example


def render_chat(tokenizer, user: str | list[dict], system: str = "") -> str:
    """A user message (or a whole conversation) in the chat template, ready for the answer.

    A tokenizer without a chat template (a base model) gets the prompt as plain text, as TRL feeds
    a base model a plain prompt: the system prompt (if any), a blank line, the user's message
    (``plain_prompt``; said once per process as a warning)."""
    messages = [{"role": "user", "content": user}] if isinstance(user, str) else list(user)
    if system and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system}] + messages
    if not getattr(tokenizer, "chat_template", None):
        return plain_prompt(messages)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_chat(tokenizer, user: str | list[dict], system: str = "") -> list[int]:
    """``render_chat``'s text as token ids: as written where a chat template made it (the template
    holds its special tokens), after the tokenizer's BOS where the prompt is plain text (a base
    model reads one first; what ``add_special_tokens`` would put at the end, such as an EOS, is
    left out)."""
    ids = tokenizer.encode(render_chat(tokenizer, user, system), add_special_tokens=False)
    if getattr(tokenizer, "chat_template", None):
        return ids
    bos = tokenizer.bos_token_id
    lead = tokenizer.encode("", add_special_tokens=True)
    return [bos] + ids if bos is not None and lead[:1] == [bos] else ids


def plain_prompt(messages: list[dict]) -> str:
    """A single-turn conversation (an optional system message, one user message) as plain text;
    ValueError for anything else, which has no plain form a base model was trained on."""
    roles = [m.get("role") for m in messages]
    if roles not in (["user"], ["system", "user"]) or not all(isinstance(m.get("content"), str) for m in messages):
        raise ValueError(
            f"the tokenizer has no chat template (a base model), and a conversation of roles {roles} "
            "has no plain-text form: give the tokenizer a chat_template (tokenizer_config.json), or "
            "use prompts of one user message (and data.system_prompt)"
        )
    if not _warned:
        _warned.append(True)
        warnings.warn(
            "the tokenizer has no chat template (a base model): prompts are fed as plain text (the "
            "system prompt, a blank line, the user's message)",
            UserWarning,
            stacklevel=3,
        )
    return "\n\n".join(m["content"] for m in messages)


_warned: list[bool] = []


def encode_prompts(
    tokenizer, examples: list[Example], *, system: str = "", max_len: int
) -> tuple[list[EncodedPrompt], list[str]]:
    """Encode each example's prompt with the chat template.

    Prompts longer than ``max_len`` tokens are skipped (never truncated: a cut problem statement
    is a different problem) and reported as "<index>: <reason>" in the second return value.
    """
    out: list[EncodedPrompt] = []
    skipped: list[str] = []
    for i, ex in enumerate(examples):
        ids = encode_chat(tokenizer, ex.messages or ex.prompt, system)
        if len(ids) > max_len:
            skipped.append(f"example {i}: prompt has {len(ids)} tokens > data.max_prompt_len={max_len}")
            continue
        out.append(EncodedPrompt(ids, ex))
    return out, skipped


def encode_answer(tokenizer, answer: str) -> list[int]:
    """The assistant's answer as the model should produce it: answer tokens then EOS."""
    return tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
