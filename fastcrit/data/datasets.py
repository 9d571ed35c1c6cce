"""Datasets of (prompt, answer) examples from shipped tasks, .jsonl / .json (an array of objects),
either gzipped, or .parquet files (UTF-8 text, a BOM allowed).

A row is either ``{prompt_key: str, answer_key: str, ...}`` or a chat ``{"messages": [{"role",
"content"}, ...]}`` whose last message is the assistant's answer (what SFT trains on) and whose
earlier turns (ending with a user turn) are the prompt.

Bad rows never crash a run deep inside and are never lost silently: each is counted and reported
(file, line, reason) in `Dataset.skipped`, and the loader raises if nothing usable is left, or,
with ``strict`` (``data.strict``), if any row was skipped. A file that cannot be read as text
raises DatasetError naming the file and line.
"""

from __future__ import annotations

import codecs
import gzip
import json
import math
import os
import re
import zlib
from dataclasses import dataclass, field

from fastcrit.data.tasks import shipped_tasks, task_path
from fastcrit.data.text_checks import SURROGATE_WHY, lone_surrogate


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


FILE_TYPES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")


def _not_utf8(path: str, line_no: int, byte: int, col: int) -> DatasetError:
    return DatasetError(
        f"{path}:{line_no}: not UTF-8 text (byte 0x{byte:02x} at byte {col} of the line); save the file as UTF-8"
    )


def _object(row) -> str | None:
    return None if isinstance(row, dict) else f"expected a JSON object, got {type(row).__name__}"


def _json_limit(e: Exception) -> str:
    """Why json.loads refused text that is valid JSON: an integer of more digits than Python converts
    (ValueError, sys.get_int_max_str_digits) or nesting deeper than its recursion limit
    (RecursionError). Neither is a JSONDecodeError, so without this they escaped the loader."""
    if isinstance(e, RecursionError):
        return "JSON nested too deep to read"
    return f"a JSON number Python will not read ({str(e).split(';')[0]})"


def _jsonl_rows(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            if i == 1 and raw.startswith(codecs.BOM_UTF8):  # utf-8-sig: the BOM is no part of row 1
                raw = raw[len(codecs.BOM_UTF8) :]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise _not_utf8(path, i, raw[e.start], e.start + 1) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                yield i, None, f"not valid JSON ({e.msg})"
                continue
            except (ValueError, RecursionError) as e:  # valid JSON Python will not hold (see _json_limit)
                yield i, None, _json_limit(e)
                continue
            yield i, (row if isinstance(row, dict) else None), _object(row)


def _json_rows(path: str):
    """A .json file holding one array of objects; each row is numbered by the line it starts on."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        start = data.rfind(b"\n", 0, e.start) + 1
        raise _not_utf8(path, data.count(b"\n", 0, e.start) + 1, data[e.start], e.start - start + 1) from None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise DatasetError(f"{path}: {_json_limit(e)}") from None
    if not isinstance(items, list):
        raise DatasetError(
            f"{path}: expected a JSON array of objects (or a .jsonl file, one object per line), "
            f"got {type(items).__name__}"
        )
    decoder, ws = json.JSONDecoder(), re.compile(r"[ \t\n\r]*")
    pos = ws.match(text, 0).end() + 1  # past the "["; the text is valid JSON, so the walk is safe
    line_no, counted = 1, 0
    for item in items:
        pos = ws.match(text, pos).end()
        line_no += text.count("\n", counted, pos)
        counted = pos
        _, pos = decoder.raw_decode(text, pos)
        pos = ws.match(text, pos).end() + 1  # past the "," (or the closing "]")
        yield line_no, (item if isinstance(item, dict) else None), _object(item)


def _rows(path: str):
    """Yield (line_no, row_or_None, error) for a .jsonl / .json (an array of objects) file, either
    gzipped, or a .parquet file (row numbers). Text is UTF-8, with or without a BOM; a byte that is
    not raises DatasetError naming the file and line."""
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq  # optional dependency, only for parquet files
        except ImportError as e:
            raise DatasetError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from e
        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid (not a parquet file) is a ValueError
            raise DatasetError(f"{path}: not a readable parquet file ({e})") from None
        for i, row in enumerate(table.to_pylist(), start=1):
            yield i, row, None
        return
    if not path.endswith(FILE_TYPES):
        raise DatasetError(f"{path}: expected a {', '.join(FILE_TYPES[:-1])} or {FILE_TYPES[-1]} file")
    try:
        yield from (_jsonl_rows if path.endswith((".jsonl", ".jsonl.gz")) else _json_rows)(path)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # a .gz name on a file that is not one, or cut short
        raise DatasetError(f"{path}: not a readable gzip file ({e})") from None
    except OSError as e:  # a directory named like a data file, no permission to read it
        raise DatasetError(f"{path}: cannot read the file ({e.strerror or e})") from None


STRICT_SHOWN = 3  # skipped rows a strict error names


def refuse_skipped(skipped: list[str], what: str) -> None:
    """``data.strict``: raise DatasetError when ``skipped`` ("<file>:<line>: <reason>") is not
    empty, naming how many and the first few."""
    if skipped:
        more = f"; and {len(skipped) - STRICT_SHOWN} more" if len(skipped) > STRICT_SHOWN else ""
        raise DatasetError(
            f"{what}: {len(skipped)} row{'s' * (len(skipped) != 1)} skipped and data.strict "
            f"is true: {'; '.join(skipped[:STRICT_SHOWN])}{more}"
        )


ROLES = ("system", "user", "assistant")


SURROGATE = f"the text {SURROGATE_WHY}"


def _answer_problem(answer, key: str) -> str | None:
    """Why an answer column's value cannot be the reference answer, or None. A bool would be read
    as "True" (not the file's "true"), and NaN / Infinity (or a number too large for a float) as
    "nan" / "inf", which no exact match of the file's text gives and which math-verify equates
    with an answer of 0/0 or \\infty."""
    if answer is None or isinstance(answer, str):
        return None
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return f"{key!r} must be a string or number, got {type(answer).__name__}"
    if isinstance(answer, float) and not math.isfinite(answer):
        return f"{key!r} is {answer} (NaN, Infinity, or a number too large): not a usable answer"
    return None


def parse_messages(messages) -> tuple[list[dict] | None, str]:
    """Check a chat row's ``messages``; returns (turns before the answer, answer) or (None, reason)."""
    if not isinstance(messages, list) or len(messages) < 2:
        return None, "'messages' must be a list of at least a user turn and the assistant's answer"
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            return None, f"messages[{j}] must be {{role: system|user|assistant, content: str}}"
    if messages[-1]["role"] != "assistant" or messages[-2]["role"] != "user":
        return None, "'messages' must end with a user turn followed by the assistant's answer"
    if lone_surrogate(*(m["content"] for m in messages)):
        return None, f"'messages': {SURROGATE}"
    return [dict(role=m["role"], content=m["content"]) for m in messages[:-1]], messages[-1]["content"]


def load_dataset(
    spec: str,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    default_split: str = "train",
    strict: bool = False,
) -> Dataset:
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
            else:
                err = _answer_problem(answer, answer_key)
            if err is None and lone_surrogate(prompt, answer if isinstance(answer, str) else ""):
                err = SURROGATE
        if err is not None:
            skipped.append(f"{path}:{line_no}: {err}")
            continue
        meta = {k: v for k, v in row.items() if k not in (prompt_key, answer_key)}
        examples.append(Example(prompt=prompt, answer="" if answer is None else str(answer), meta=meta))
    if not examples:
        detail = f" (first problem: {skipped[0]})" if skipped else ""
        raise DatasetError(f"{path}: no usable examples{detail}")
    if strict:
        refuse_skipped(skipped, path)
    return Dataset(source=path, examples=examples, skipped=skipped)


@dataclass
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str


def load_preferences(spec: str, strict: bool = False) -> tuple[list[PreferencePair], list[str]]:
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
            elif lone_surrogate(row["prompt"], row["chosen"], row["rejected"]):
                err = SURROGATE
        if err is not None:
            skipped.append(f"{path}:{line_no}: {err}")
            continue
        pairs.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"]))
    if not pairs:
        detail = f" (first problem: {skipped[0]})" if skipped else ""
        raise DatasetError(f"{path}: no usable preference pairs{detail}")
    if strict:
        refuse_skipped(skipped, path)
    return pairs, skipped
