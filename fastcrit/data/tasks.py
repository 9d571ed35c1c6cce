"""Tasks shipped with fastcrit, small enough for a tiny model to learn on 2 CPU cores.

`minicode` (programming problems for CTRL, and chat SFT data for the tiny coder): see
fastcrit.data.minicode.

`math` (arithmetic word problems with boxed answers for the `math` reward, and chat SFT data for
the warm start): see fastcrit.data.math_words.

`reverse`: reverse a sequence of 5 space-separated lowercase letters. With the tiny model's
byte-level BPE tokenizer at 1024 tokens (configs/cpu/grpo.yaml) each " x" is one token, so the task
is about order, not spelling; at the default 512, " q" is two (" " + "q"). The rule reward gives
partial credit per position (``reverse_reward`` here; fastcrit.reward.rule scores with it).

The shipped files are made by `python -m fastcrit.data.tasks` (deterministic: seed 0); the train and
test splits are disjoint.

Each task also declares how its final answer is read from a model's output (``TASK_ANSWER_FORMATS``,
``final_answer``): what RARO's critic sees of an answer (``raro.critic_sees: answer``).
"""

from __future__ import annotations

import json
import os
import random
import string

from fastcrit.data.math_words import last_boxed

TASK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "task_files")
REVERSE_LEN = 5
REVERSE_PROMPT = "Reverse the letters: {letters}"


def reverse_reward(response: str, answer: str) -> float:
    """Partial credit for the `reverse` task: matching positions / max(len(answer), len(response)).

    Both sides are split on whitespace, so "e d c b a" vs answer "e d c b a" scores 1.0, a response
    with the right letters in the wrong order scores by position, and extra tokens cost credit.
    """
    pred, gold = response.split(), answer.split()
    if not gold:
        return 0.0
    hits = sum(p == g for p, g in zip(pred, gold))
    return hits / max(len(gold), len(pred))


def _last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _boxed_or_last_line(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is None:
        return _last_line(text)
    return boxed[len("\\boxed{") : -1].strip() or None


# How a final answer is read from an output, by name: "line", its last non-empty line; "boxed", the
# content of its last \boxed{...}, else its last non-empty line (a bare answer).
ANSWER_FORMATS = {"line": _last_line, "boxed": _boxed_or_last_line}
# Each shipped task's format: reverse answers on one line; math's worked answers box the result
# (its RL rows hold the bare reference). A row may name a format in an `answer_format` column instead.
TASK_ANSWER_FORMATS = {"reverse": "line", "math": "boxed"}


def answer_format(meta: dict) -> str | None:
    """The final-answer format a row declares: its ``answer_format`` column, else its ``task``'s
    (``TASK_ANSWER_FORMATS``); None when it declares neither. Not checked against ANSWER_FORMATS."""
    task, declared = meta.get("task"), meta.get("answer_format")
    if declared and not isinstance(declared, str):  # a list or number: unhashable in a caller's lookup
        return repr(declared)  # named as an unknown format, not a TypeError far from the row
    return declared or (TASK_ANSWER_FORMATS.get(task) if isinstance(task, str) else None)


def final_answer(text: str, fmt: str) -> str | None:
    """The final answer of ``text`` by format ``fmt`` (a key of ANSWER_FORMATS), stripped; None when
    it has none (an empty output, an empty box)."""
    return ANSWER_FORMATS[fmt](text)


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


def with_errors(answer: str, errors: int, rng: random.Random) -> str:
    """``answer`` with about ``errors`` mistakes: letters changed at distinct positions, and now and
    then a letter dropped or added, or two neighbours swapped (what a half-trained policy writes)."""
    letters = answer.split()
    for i in rng.sample(range(len(letters)), min(errors, len(letters))):
        letters[i] = rng.choice([c for c in string.ascii_lowercase if c != letters[i]])
    if errors and rng.random() < 0.3:
        kind = rng.randrange(3)
        if kind == 0 and len(letters) > 1:
            del letters[rng.randrange(len(letters))]
        elif kind == 1:
            letters.insert(rng.randrange(len(letters) + 1), rng.choice(string.ascii_lowercase))
        elif len(letters) > 1:
            i = rng.randrange(len(letters) - 1)
            letters[i], letters[i + 1] = letters[i + 1], letters[i]
    return " ".join(letters)


def make_reverse_prefs(rows: list[dict], seed: int = 0, per_prompt: int = 2) -> list[dict]:
    """Preference pairs for a reward model on `reverse`, graded like the rule reward: of two answers
    with different numbers of mistakes (0 to 5), the one with the higher per-letter score
    (``reverse_reward``) is chosen. ``per_prompt`` pairs per prompt."""
    rng = random.Random(seed)
    out = []
    for r in rows:
        for _ in range(per_prompt):
            while True:
                i = rng.choice([0, 0, 1, 1, 2, 3])
                a, b = with_errors(r["answer"], i, rng), with_errors(r["answer"], rng.randint(i + 1, 5), rng)
                sa, sb = reverse_reward(a, r["answer"]), reverse_reward(b, r["answer"])
                if sa != sb:
                    break
            chosen, rejected = (a, b) if sa > sb else (b, a)
            out.append({"prompt": r["prompt"], "chosen": chosen, "rejected": rejected})
    return out


def task_path(name: str, split: str) -> str:
    return os.path.join(TASK_DIR, f"{name}_{split}.jsonl")


def shipped_tasks() -> list[str]:
    if not os.path.isdir(TASK_DIR):
        return []
    return sorted({f.rsplit("_", 1)[0] for f in os.listdir(TASK_DIR) if f.endswith(".jsonl")})


def write_shipped() -> None:
    from fastcrit.data.math_words import make_math
    from fastcrit.data.minicode import make_minicode

    os.makedirs(TASK_DIR, exist_ok=True)
    reverse = make_reverse()
    reverse["prefs"] = make_reverse_prefs(reverse["train"])
    for name, splits in (("reverse", reverse), ("minicode", make_minicode()), ("math", make_math())):
        for split, rows in splits.items():
            with open(task_path(name, split), "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    write_shipped()
