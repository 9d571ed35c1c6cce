"""Helpers the recipe tests share: run the CLI in-process, read metrics rows."""

import os

# The tiny model every recipe test trains (built from its config, cached once per machine).
TINY_MODEL = [
    "model.path=tiny",
    "model.tiny.hidden=64",
    "model.tiny.layers=2",
    "model.tiny.heads=2",
    "model.tiny.kv_heads=1",
    "model.tiny.intermediate=128",
]


def run_cli(command: str, config: str, sets: list[str], *extra: str) -> int:
    """`fastcrit <command> <config> --set ...` in this process; its exit code."""
    from fastcrit.cli import main

    argv = [command, config]
    for s in [*sets, *extra]:
        argv += ["--set", s]
    return main(argv)


def metric_rows(out: str) -> list[dict]:
    import json

    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def stable(row: dict) -> dict:
    """A metrics row without its timings and memory (what an exact resume must reproduce)."""
    return {k: v for k, v in row.items() if not k.startswith(("time/", "throughput/", "memory/"))}
