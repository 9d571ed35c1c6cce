"""Datasets of (prompt, answer) examples from shipped tasks, .jsonl or .parquet files.

A row is either ``{prompt_key: str, answer_key: str, ...}`` or a chat ``{"messages": [{"role",
"content"}, ...]}`` whose last message is the assistant's answer (what SFT trains on) and whose
earlier turns (ending with a user turn) are the prompt.

Bad rows never crash a run deep inside and are never lost silently: each is counted and reported
(file, line, reason) in `Dataset.skipped`, and the loader raises if nothing usable is left.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from fastcrit.data.tasks import shipped_tasks, task_path


class DatasetError(ValueError):
    pass


@dataclass
class Example:
    prompt: str  # the (last) user message
    answer: str
    meta: dict = field(default_factory=dict)  # every other column of the row
    messages: list[dict] | None = None  # a chat row: the turns before the answer (last is "user")


@dataclass
class Dataset:
    source: str
    examples: list[Example]
    skipped: list[str] = field(default_factory=list)  # "<file>:<line>: <reason>"

    def __len__(self) -> int:
        return len(self.examples)


def resolve_source(spec: str, default_split: str = "train") -> str:
    """A shipped task name (`reverse`, `reverse:test`) or a file path -> a file path."""
    if os.path.exists(spec):
        return spec
    name, _, split = spec.partition(":")
    if name in shipped_tasks():
        path = task_path(name, split or default_split)
        if not os.path.exists(path):
            raise DatasetError(f"{spec}: task {name!r} has no split {split or default_split!r}")
        return path
    raise DatasetError(
        f"{spec}: no such file, and not a shipped task (shipped: {', '.join(shipped_tasks()) or 'none'})"
    )


def _rows(path: str):
    """Yield (line_no, row_or_None, error) for a .jsonl or .parquet file."""
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq  # optional dependency, only for parquet files
        except ImportError as e:
            raise DatasetError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from e
        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield i, row, None
        return
    if not path.endswith(".jsonl"):
        raise DatasetError(f"{path}: expected a .jsonl or .parquet file")
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                yield i, None, f"not valid JSON ({e.msg})"
                continue
            if not isinstance(row, dict):
                yield i, None, f"expected a JSON object, got {type(row).__name__}"
                continue
            yield i, row, None


ROLES = ("system", "user", "assistant")


def parse_messages(messages) -> tuple[list[dict] | None, str]:
    """Check a chat row's ``messages``; returns (turns before the answer, answer) or (None, reason)."""
    if not isinstance(messages, list) or len(messages) < 2:
        return None, "'messages' must be a list of at least a user turn and the assistant's answer"
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            return None, f"messages[{j}] must be {{role: system|user|assistant, content: str}}"
    if messages[-1]["role"] != "assistant" or messages[-2]["role"] != "user":
        return None, "'messages' must end with a user turn followed by the assistant's answer"
    return [dict(role=m["role"], content=m["content"]) for m in messages[:-1]], messages[-1]["content"]


def load_dataset(spec: str, prompt_key: str = "prompt", answer_key: str = "answer",
                 default_split: str = "train") -> Dataset:
    path = resolve_source(spec, default_split)
    examples: list[Example] = []
    skipped: list[str] = []
    for line_no, row, err in _rows(path):
        if err is None and "messages" in row:
            turns, answer = parse_messages(row["messages"])
            if turns is None:
                skipped.append(f"{path}:{line_no}: {answer}")
                continue
            meta = {k: v for k, v in row.items() if k != "messages"}
            examples.append(Example(prompt=turns[-1]["content"], answer=answer, meta=meta, messages=turns))
            continue
        if err is None:
            prompt, answer = row.get(prompt_key), row.get(answer_key)
            if not isinstance(prompt, str) or not prompt:
                err = f"missing or non-string {prompt_key!r}"
            elif answer is not None and not isinstance(answer, (str, int, float)):
                err = f"{answer_key!r} must be a string or number"
        if err is not None:
            skipped.append(f"{path}:{line_no}: {err}")
            continue
        meta = {k: v for k, v in row.items() if k not in (prompt_key, answer_key)}
        examples.append(Example(prompt=prompt, answer="" if answer is None else str(answer), meta=meta))
    if not examples:
        detail = f" (first problem: {skipped[0]})" if skipped else ""
        raise DatasetError(f"{path}: no usable examples{detail}")
    return Dataset(source=path, examples=examples, skipped=skipped)


@dataclass
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str


def load_preferences(spec: str) -> tuple[list[PreferencePair], list[str]]:
    """Rows {prompt, chosen, rejected} (all non-empty strings, chosen != rejected) from a JSONL /
    parquet file or a shipped set (``reverse:prefs``); bad rows are skipped and reported as
    "<file>:<line>: <reason>" in the second return value."""
    path = resolve_source(spec, "prefs")
    pairs: list[PreferencePair] = []
    skipped: list[str] = []
    for line_no, row, err in _rows(path):
        if err is None:
            bad = [k for k in ("prompt", "chosen", "rejected") if not isinstance(row.get(k), str) or not row[k]]
            if bad:
                err = f"missing or non-string {', '.join(repr(k) for k in bad)}"
            elif row["chosen"] == row["rejected"]:
                err = "'chosen' and 'rejected' are the same text"
        if err is not None:
            skipped.append(f"{path}:{line_no}: {err}")
            continue
        pairs.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"]))
    if not pairs:
        detail = f" (first problem: {skipped[0]})" if skipped else ""
        raise DatasetError(f"{path}: no usable preference pairs{detail}")
    return pairs, skipped
