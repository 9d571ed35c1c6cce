"""Prompt templates: examples -> chat-formatted token ids."""

from __future__ import annotations

from dataclasses import dataclass

from fastcrit.data.datasets import Example


@dataclass
class EncodedPrompt:
    ids: list[int]
    example: Example


def render_chat(tokenizer, user: str | list[dict], system: str = "") -> str:
    """A user message (or a whole conversation) in the chat template, ready for the answer."""
    messages = [{"role": "user", "content": user}] if isinstance(user, str) else list(user)
    if system and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system}] + messages
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


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
        ids = tokenizer.encode(render_chat(tokenizer, ex.messages or ex.prompt, system), add_special_tokens=False)
        if len(ids) > max_len:
            skipped.append(f"example {i}: prompt has {len(ids)} tokens > data.max_prompt_len={max_len}")
            continue
        out.append(EncodedPrompt(ids, ex))
    return out, skipped


def encode_answer(tokenizer, answer: str) -> list[int]:
    """The assistant's answer as the model should produce it: answer tokens then EOS."""
    return tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
