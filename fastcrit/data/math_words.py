"""`math`: small arithmetic word problems with boxed answers, for the `math` reward (math-verify).

Seven templates: adding items, giving some away, sharing equally, price times quantity, the
fraction of a cake eaten, the fraction of a pizza each friend gets when several are shared, and
money split among 2, 4 or 5. A row is ``{"prompt", "answer", "task": "math"}``; ``answer``
is the reference in one canonical form: an integer (``"7"``), a reduced fraction (``"3/4"``) or,
for the money template, a decimal (``"3.5"``).

Three shipped files: ``math_train.jsonl`` and ``math_test.jsonl`` (the problems; disjoint prompts,
each template's share the same in both), and ``math_sft.jsonl``, chat SFT data for the warm start
(``sft.data: math:sft``): one row per training problem, in the same order, whose assistant turn
shows a one-line working and ends with ``\\boxed{...}`` ("3 + 4 = 7, so \\boxed{7}"). A fractional
answer is boxed in a form drawn at random from those equal to the reference (``1/2``,
``\\frac{1}{2}``, ``0.5``): the warm-started policy writes forms that match the reference only
symbolically, so string equality would score it wrong where math-verify does not. The worked
answers are a split of their own because SFT trains on a row's ``answer`` (or a chat row's last
turn) and RL scores against the same field, which here must stay the bare reference; minicode's
coder rows take the same path.

What the held-out split does NOT hold out: the arithmetic. Its prompts are new (other names,
items or numbers in the same template), but most of its sums and products also occur in training
problems; it measures reading a word problem and doing small arithmetic, not generalising to
unseen numbers.

`python -m fastcrit.data.tasks` writes the files (deterministic, seed 0).
"""

from __future__ import annotations

import random
from fractions import Fraction


def last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` of ``text`` with its braces balanced, or None (unclosed: None)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start : i + 1]
    return None


NAMES = ("Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gus", "Hana")
ITEMS = ("apple", "pen", "book", "cup", "egg", "ball", "card", "shell")  # plural: + "s"
FOODS = ("cake", "pie", "pizza", "bar")

# template -> the numbers of its problems, and the nouns it names; _problem has the wording.
RANGES = {
    "add": [(a, b) for a in range(1, 13) for b in range(1, 10)],
    "remove": [(a, b) for a in range(5, 21) for b in range(1, a)],
    "share": [(k * q, k) for k in range(2, 6) for q in range(1, 10)],
    "price": [(p, q) for p in range(2, 10) for q in range(2, 6)],
    "eaten": [(m, k) for k in range(2, 11) for m in range(1, k)],
    "pizzas": [(m, k) for k in range(2, 9) for m in range(1, k)],
    "money": [(a, k) for k in (2, 4, 5) for a in range(1, 25) if a % k],
}
NOUNS = {
    "add": ITEMS,
    "remove": ITEMS,
    "share": ITEMS,
    "price": ITEMS,
    "eaten": FOODS,
    "pizzas": FOODS,
    "money": ("dollar",),
}
# Share of each template in both splits (integer answers 72%, fractions 20%, decimals 8%).
MIX = {"add": 22, "remove": 20, "share": 15, "price": 15, "eaten": 12, "pizzas": 8, "money": 8}


def _problem(template: str, x: int, y: int, name: str, noun: str) -> tuple[str, str, Fraction]:
    """(prompt, working without its result, value) of one problem."""
    items = noun + "s"
    if template == "add":
        return (
            f"{name} has {x} {items} and gets {y} more. How many {items} does {name} have now?",
            f"{x} + {y}",
            Fraction(x + y),
        )
    if template == "remove":
        return (f"{name} has {x} {items} and gives away {y}. How many {items} are left?", f"{x} - {y}", Fraction(x - y))
    if template == "share":
        return (
            f"{name} shares {x} {items} equally among {y} friends. How many {items} does each friend get?",
            f"{x} / {y}",
            Fraction(x, y),
        )
    if template == "price":
        return (
            f"{name} buys {y} {items} at {x} dollars each. How many dollars does {name} pay?",
            f"{y} * {x}",
            Fraction(x * y),
        )
    if template == "eaten":
        return (
            f"{name} cuts a {noun} into {y} equal pieces and eats {x} of them. What fraction of "
            f"the {noun} does {name} eat?",
            f"{x} / {y}",
            Fraction(x, y),
        )
    if template == "pizzas":
        amount = f"1 {noun}" if x == 1 else f"{x} {items}"
        return (
            f"{name} shares {amount} equally among {y} friends. What fraction of a {noun} does each friend get?",
            f"{x} / {y}",
            Fraction(x, y),
        )
    if template == "money":
        return (
            f"{name} splits {x} {items} equally among {y} friends. How many {items} does each friend get?",
            f"{x} / {y}",
            Fraction(x, y),
        )
    raise ValueError(f"unknown math template {template!r}")


def decimal(v: Fraction) -> str | None:
    """``v`` as a finite decimal (``0.25``), or None when it has none (``1/3``)."""
    d = v.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d != 1:
        return None
    digits = 0
    while (v * 10**digits).denominator != 1:
        digits += 1
    return f"{float(v):.{digits}f}"


def forms(v: Fraction) -> list[str]:
    """Every way a response here may box ``v``: the integer, or a/b, \\frac{a}{b} and the decimal."""
    if v.denominator == 1:
        return [str(v.numerator)]
    out = [f"{v.numerator}/{v.denominator}", f"\\frac{{{v.numerator}}}{{{v.denominator}}}"]
    return out + ([decimal(v)] if decimal(v) else [])


def reference(template: str, v: Fraction) -> str:
    """The row's ``answer``: the integer, the decimal for money, else the reduced fraction."""
    return (decimal(v) if template == "money" else None) or forms(v)[0]


def solution(working: str, v: Fraction, rng: random.Random) -> str:
    """The SFT target: ``3 + 4 = 7, so \\boxed{7}``; a fraction is boxed in a random equal form."""
    if v.denominator == 1:
        return f"{working} = {v.numerator}, so \\boxed{{{v.numerator}}}"
    return f"{working}, so \\boxed{{{rng.choice(forms(v))}}}"


def make_math(n_train: int = 4000, n_test: int = 200, seed: int = 0) -> dict[str, list[dict]]:
    """{"train", "test", "sft"} rows; every template's problems are drawn without replacement, so
    no prompt occurs twice."""
    rng = random.Random(seed)
    total = sum(MIX.values())
    train: list[tuple[dict, str]] = []
    test: list[tuple[dict, str]] = []
    for template, weight in MIX.items():
        k_train, k_test = n_train * weight // total, n_test * weight // total
        combos = [(x, y, name, noun) for x, y in RANGES[template] for name in NAMES for noun in NOUNS[template]]
        if len(combos) < k_train + k_test:
            raise ValueError(f"math template {template!r}: {len(combos)} problems < {k_train + k_test}")
        rows = []
        for combo in rng.sample(combos, k_train + k_test):
            prompt, working, v = _problem(template, *combo)
            rows.append(
                ({"prompt": prompt, "answer": reference(template, v), "task": "math"}, solution(working, v, rng))
            )
        train += rows[:k_train]
        test += rows[k_train:]
    if len(train) != n_train or len(test) != n_test:
        raise ValueError(f"math: MIX must divide the split sizes ({n_train}, {n_test}) exactly")
    rng.shuffle(train)
    rng.shuffle(test)
    sft = [
        {"messages": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": s}], "task": "math"}
        for r, s in train
    ]
    return {"train": [r for r, _ in train], "test": [r for r, _ in test], "sft": sft}
