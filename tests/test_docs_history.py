"""No measurement history in the source: comments and docstrings say why, docs/LOG.md keeps the figures.

Every ``.py`` under ``fastcrit/``, ``kernels/`` and ``benchmarks/`` (the scripts, not
``benchmarks/results/``) is read with ``tokenize``: its comments (consecutive comment lines joined
into one text) and its string literals (docstrings included). A text is history when it carries

- a date (``2026-11-20``), or
- a timing or size figure after ``measured`` / ``took`` / ``timed`` / ``slowed`` / ``sped`` in the
  same clause, up to ". " or "; " (``measured on 2 cores: 1.4x``, ``took 85 ms``), or
- two figures set against each other (``3.1 ms against 7.5``, ``1250 MB vs 1296``), or
- a figure of speed-up (``1.15-1.33x faster``, ``~3x slower``).

A figure is a number with a unit: ms, s, us, min, MB, GB, KiB, MiB, GiB, x (a ratio), %, tok/s. A
reason with the place to reproduce it ("faster at 64 rows: benchmarks/bench_generate.py") is not
history; a design constant's value in a comment ("256 MiB a chunk") is not either.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_NUMBER = r"\d(?:[\d.,]*\d)?"
_FIGURE = _NUMBER + r"\s?(?:ms|s|us|µs|min|MB|GB|KiB|MiB|GiB|x|%|tok/s)(?![\w/])"
_VERSUS = r"\)?,?\s+(?:against|vs\.?)\s+~?"
HISTORY = (
    ("a date", re.compile(r"(?<![\w-])20\d\d-[01]\d-[0-3]\d(?![\w-])")),
    (
        "a figure measured",
        re.compile(r"\b(?:measured|took|timed|slowed|sped)\b(?:(?![.;]\s).){0,100}?" + _FIGURE, re.I),
    ),
    (
        "figures set against each other",
        re.compile(_FIGURE + _VERSUS + r"\d|" + _NUMBER + _VERSUS + _NUMBER + r"[^.;:]{0,30}?" + _FIGURE),
    ),
    ("a speed-up figure", re.compile(_FIGURE + r"\s+(?:faster|slower)\b")),
)


def _texts(source: str):
    """(line, text) for each comment block and each string literal of ``source``."""
    block: list[str] = []
    start = last = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            if block and tok.start[0] != last + 1:
                yield start, " ".join(block)
                block = []
            if not block:
                start = tok.start[0]
            block.append(tok.string.lstrip("#").strip())
            last = tok.start[0]
        elif tok.type == tokenize.STRING:
            yield tok.start[0], " ".join(tok.string.split())
    if block:
        yield start, " ".join(block)


def history_in(source: str) -> list[tuple[int, str, str]]:
    """(line, kind, excerpt) for every comment or string of ``source`` that carries a history."""
    found = []
    for line, text in _texts(source):
        for kind, pattern in HISTORY:
            m = pattern.search(text)
            if m:
                found.append((line, kind, m.group(0)[:80]))
    return found


def _sources():
    for top in ("fastcrit", "kernels"):
        yield from sorted((ROOT / top).rglob("*.py"))
    yield from sorted((ROOT / "benchmarks").glob("*.py"))


def test_no_measurement_history_in_source():
    offences = []
    for path in _sources():
        for line, kind, excerpt in history_in(path.read_text()):
            offences.append(f"{path.relative_to(ROOT)}:{line}: {kind}: {excerpt!r}")
    assert not offences, "move these figures to docs/LOG.md and say why instead:\n" + "\n".join(offences)


def test_history_check_catches_a_bad_line():
    bad = [
        "x = 1  # measured 3.1 vs 7.5 ms on 2026-11-20\n",
        "# The GEMM took 85 ms per layer\n",
        "# measured on 2 CPU\n# cores: 1.4x the update time\ny = 2\n",
        '"""Same update time (4.18 / 4.14 against 4.16 / 4.24 s)."""\n',
        "def f():\n    '''Peak 1250 MB vs 1296 MB.'''\n",
        "# packed once per row count: 1.15-1.33x faster at 64 rows\n",
        "# a fresh mmap for every allocation slowed the decode 2.4x\n",
    ]
    for source in bad:
        assert history_in(source), source
    good = [
        "x = 1  # the pre-packed GEMM is faster at hidden >= 256 on CPU (benchmarks/bench_generate.py)\n",
        "CHUNK = 256 << 20  # 256 MiB a chunk: the GEMMs run close to one unchunked GEMM's time\n",
        "# the step's measured KL is the mean over all rows\n",
        "# the peak it measured, in MB; 4x fewer variants\n",
        'print(f"{r["ms"]:9.1f} ms  x{r["ratio"]:.2f} vs HF")\n',
    ]
    for source in good:
        assert not history_in(source), source
