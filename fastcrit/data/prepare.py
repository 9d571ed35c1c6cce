"""A training set prepared as the CTRL paper prepares TACO: ``fastcrit data prepare``.

The paper trains its critic on TACO "filtered" (18,820 problems of 25,443). ``prepare`` applies,
in order, to problems already converted (rows without tests, or that do not convert, are counted
by the conversion and never reach it):

- ``image``: the statement refers to a picture (TACO's ``picture_num`` > 0, an ``<img>`` tag, a
  Markdown image or an image file name): the model would not see it;
- ``too_long``: the statement is longer than ``max_question_chars`` (the paper's prompts are 1,536
  tokens; a token is about four characters of English);
- ``duplicate``: the same statement (after normalisation: Unicode NFKC, lower case, only letters
  and digits, single spaces) as an earlier problem; the first is kept;
- ``overlap``: the statement overlaps an evaluation problem: the same normalised statement, or at
  least ``min_shared`` of its word ``ngram``-grams found in one evaluation statement (8 13-grams:
  at least a 20-word passage in common, as when a statement was copied with small changes).
  N-grams that occur in ``common`` or more evaluation statements are boilerplate ("the first line
  of the input contains a single integer t, the number of test cases") and do not count.

Each rule's count and the first few ids it removed are reported.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field

from .problems import Problem

RULES = ("image", "too_long", "duplicate", "overlap")
_IMAGE = re.compile(r"<img\b|!\[[^\]]*\]\(|\.(?:png|jpe?g|gif|svg|bmp|webp)\b", re.IGNORECASE)
_NOT_WORD = re.compile(r"[^0-9a-z]+")
SHOW = 5  # ids kept per rule for the report


def normalise(text: str) -> str:
    return _NOT_WORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def _grams(words: list, n: int) -> set:
    return {hash(tuple(words[i : i + n])) for i in range(len(words) - n + 1)}


def has_image(p: Problem) -> bool:
    pictures = p.meta.get("picture_num")
    try:
        if pictures is not None and float(pictures) > 0:
            return True
    except (TypeError, ValueError):
        pass
    return bool(_IMAGE.search(p.question))


@dataclass
class Prepared:
    problems: list
    removed: dict = field(default_factory=lambda: {r: 0 for r in RULES})
    examples: dict = field(default_factory=lambda: {r: [] for r in RULES})

    def _drop(self, rule: str, p: Problem, why: str = "") -> None:
        self.removed[rule] += 1
        if len(self.examples[rule]) < SHOW:
            self.examples[rule].append(p.id + (f" ({why})" if why else ""))


class _EvalIndex:
    """The evaluation statements, for ``overlap``: exact normalised texts and word n-grams."""

    def __init__(self, problems, n: int, common: int):
        self.n = n
        self.exact: dict = {}
        self.grams: dict = {}  # n-gram hash -> indices of evaluation problems holding it
        for k, p in enumerate(problems):
            text = normalise(p.question)
            self.exact.setdefault(text, p.id)
            for g in _grams(text.split(), n):
                self.grams.setdefault(g, []).append(k)
        self.grams = {g: ks for g, ks in self.grams.items() if len(ks) < common}
        self.ids = [p.id for p in problems]

    def match(self, text: str, min_shared: int):
        """(evaluation id, n-grams shared with it), or None."""
        if text in self.exact:
            return self.exact[text], -1
        hits = Counter(k for g in _grams(text.split(), self.n) for k in self.grams.get(g, ()))
        if not hits:
            return None
        k, c = hits.most_common(1)[0]
        return (self.ids[k], c) if c >= min_shared else None


def prepare(
    problems, *, max_question_chars: int = 6144, exclude=(), ngram: int = 13, min_shared: int = 8, common: int = 3
) -> Prepared:
    """Apply the rules above, in order, to ``problems``; ``exclude`` is the evaluation problems."""
    if min(max_question_chars, ngram, min_shared, common) <= 0:
        raise ValueError("max_question_chars, ngram, min_shared and common must be positive")
    index = _EvalIndex(list(exclude), ngram, common) if exclude else None
    out = Prepared([])
    seen: set = set()
    for p in problems:
        if has_image(p):
            out._drop("image", p)
            continue
        if len(p.question) > max_question_chars:
            out._drop("too_long", p, f"{len(p.question)} characters")
            continue
        text = normalise(p.question)
        if text in seen:
            out._drop("duplicate", p)
            continue
        seen.add(text)
        hit = index.match(text, min_shared) if index is not None else None
        if hit is not None:
            out._drop(
                "overlap",
                p,
                f"{hit[0]}, " + ("the same statement" if hit[1] < 0 else f"{hit[1]} {ngram}-grams in common"),
            )
            continue
        out.problems.append(p)
    return out
