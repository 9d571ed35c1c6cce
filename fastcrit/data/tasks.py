"""Tasks shipped with fastcrit, small enough for a tiny model to learn on 2 CPU cores.

`minicode` (programming problems for CTRL, and chat SFT data for the tiny coder): see
fastcrit.data.minicode.

`reverse`: reverse a sequence of 5 space-separated lowercase letters. With the byte-level BPE
tokenizer each " x" is one token, so the task is about order, not spelling. The rule reward gives
partial credit per position (see fastcrit.reward.rule.reverse_reward).

The shipped files are made by `python -m fastcrit.data.tasks` (deterministic: seed 0); the train and
test splits are disjoint.
"""
from __future__ import annotations

import json
import os
import random
import string

TASK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")
REVERSE_LEN = 5
REVERSE_PROMPT = "Reverse the letters: {letters}"


def make_reverse(n_train: int = 4000, n_test: int = 200, seed: int = 0) -> dict[str, list[dict]]:
    rng = random.Random(seed)
    seen: set[str] = set()
    rows: list[dict] = []
    while len(rows) < n_train + n_test:
        letters = [rng.choice(string.ascii_lowercase) for _ in range(REVERSE_LEN)]
        key = "".join(letters)
        if key in seen:
            continue
        seen.add(key)
        rows.append(
            {
                "prompt": REVERSE_PROMPT.format(letters=" ".join(letters)),
                "answer": " ".join(reversed(letters)),
                "task": "reverse",
            }
        )
    return {"train": rows[:n_train], "test": rows[n_train:]}


def task_path(name: str, split: str) -> str:
    return os.path.join(TASK_DIR, f"{name}_{split}.jsonl")


def shipped_tasks() -> list[str]:
    if not os.path.isdir(TASK_DIR):
        return []
    return sorted({f.rsplit("_", 1)[0] for f in os.listdir(TASK_DIR) if f.endswith(".jsonl")})


def write_shipped() -> None:
    from fastcrit.data.minicode import make_minicode

    os.makedirs(TASK_DIR, exist_ok=True)
    for name, splits in (("reverse", make_reverse()), ("minicode", make_minicode())):
        for split, rows in splits.items():
            with open(task_path(name, split), "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    write_shipped()
