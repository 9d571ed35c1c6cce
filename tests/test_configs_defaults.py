"""Every default lives once, in fastcrit/config.py: a shipped config (configs/**/*.yaml) states only
what differs from it. A key whose value equals its default fails here unless its line carries a
comment saying why it is written out (``# the paper's value``, ``# stated for ...``).

The default of a key is the value at its path in a fresh ``Config()`` (so ``proxy.rollout.n`` is
compared with ProxyConfig's own default, not RolloutConfig's), after the loader's coercion of the
YAML value (``1e-3`` and ``1.0e-3`` are one float, a list is a tuple where the field is one). A mapping
whose default is a dataclass is walked key by key; any other value (a list, a dict field such as
``rollout.engine_args``) is compared whole, as the loader replaces it whole.

Run as a script to list the restated keys of every config: ``python tests/test_configs_defaults.py``.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import sys
import typing

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True))


@dataclasses.dataclass(frozen=True)
class Restated:
    line: int  # 1-based
    key: str  # the dotted path
    value: object
    commented: bool  # the key's line (or its value's last line) carries a comment

    def __str__(self) -> str:
        return f"{self.line}: {self.key} = {self.value!r}" + ("  (commented)" if self.commented else "")


def _has_comment(line: str) -> bool:
    """A ``#`` that starts a YAML comment: at the line's start or after a blank, outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return True
    return False


def restated_keys(text: str, where: str = "<yaml>") -> list[Restated]:
    """Every leaf key of the YAML ``text`` whose value equals the default at its path."""
    from fastcrit.config import Config, _coerce

    lines = text.splitlines()
    root = yaml.compose(text)
    out: list[Restated] = []

    def walk(node, default, prefix: str) -> None:
        if node is None or not isinstance(node, yaml.MappingNode):
            return
        hints = typing.get_type_hints(type(default))
        for key_node, value_node in node.value:
            key = key_node.value
            path = prefix + key
            if key not in hints:
                continue  # an unknown key: load_config refuses it, naming the file
            current = getattr(default, key)
            if dataclasses.is_dataclass(current):
                walk(value_node, current, path + ".")
                continue
            value = yaml.safe_load(yaml.serialize(value_node))
            try:
                coerced = _coerce(value, hints[key], path)
            except Exception:
                continue  # a wrong type: load_config refuses it
            if coerced == current and isinstance(coerced, bool) == isinstance(current, bool):
                first, last = key_node.start_mark.line, value_node.end_mark.line
                if value_node.end_mark.column == 0 and last > first:
                    last -= 1  # a block value ends at the start of the next line
                commented = any(_has_comment(lines[i]) for i in {first, last} if i < len(lines))
                out.append(Restated(first + 1, path, coerced, commented))

    walk(root, Config(), "")
    return out


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


@pytest.mark.parametrize("path", CONFIGS, ids=[_rel(p) for p in CONFIGS])
def test_configs_state_only_what_differs_from_the_defaults(path):
    with open(path) as f:
        bare = [r for r in restated_keys(f.read(), path) if not r.commented]
    assert not bare, (
        f"{_rel(path)}: these keys restate their default (config.py); remove them, or say on the line why "
        "they are written out:\n" + "\n".join(f"  {_rel(path)}:{r}" for r in bare)
    )


def test_the_scanner_finds_restated_keys_and_reads_comments():
    from fastcrit.config import Config

    c = Config()
    text = (
        "# header\n"
        f"model:\n  path: {c.model.path}\n  dtype: bfloat16\n"
        f"  tiny:\n    hidden: {c.model.tiny.hidden}  # the paper's width\n"
        f"optim:\n  lr: {c.optim.lr!r}\n"
        f"proxy:\n  rollout:\n    n: {c.proxy.rollout.n}\n    temperature: 0.5\n"
        f"rollout:\n  n: {c.rollout.n + 1}\n  engine_args: {{}}\n"
        f"trainer:\n  loggers:\n  - jsonl\n"
        'reward:\n  name: "a # b"\n'
    )
    found = restated_keys(text)
    assert [(r.line, r.key, r.commented) for r in found] == [
        (3, "model.path", False),
        (6, "model.tiny.hidden", True),
        (8, "optim.lr", False),
        (11, "proxy.rollout.n", False),  # ProxyConfig's own default (1), not RolloutConfig's
        (15, "rollout.engine_args", False),
        (17, "trainer.loggers", False),
    ], found
    assert not _has_comment('name: "a # b"') and _has_comment("n: 1 # why") and not _has_comment("x: a#b")


def without(data: dict, paths) -> dict:
    """``data`` (a parsed YAML mapping) less the dotted ``paths``; a mapping left empty goes too."""
    out = {}
    for key, value in data.items():
        inner = [p[len(key) + 1 :] for p in paths if p.startswith(key + ".")]
        if key in paths:
            continue
        if inner and isinstance(value, dict):
            value = without(value, inner)
            if not value:
                continue
        out[key] = value
    return out


def test_removing_restated_keys_keeps_the_loaded_config(tmp_path):
    """What the test above asks for is safe: every config less all its restated keys (commented
    ones too) loads to the same Config."""
    from fastcrit.config import load_config

    for path in CONFIGS:
        with open(path) as f:
            text = f.read()
        drop = [r.key for r in restated_keys(text, path)]
        p = tmp_path / "less.yaml"
        p.write_text(yaml.safe_dump(without(yaml.safe_load(text) or {}, drop)))
        assert load_config(str(p)) == load_config(path), _rel(path)
    assert without({"a": {"b": 1, "c": 2}, "d": {"e": 3}, "f": 4}, ["a.b", "d.e", "f"]) == {"a": {"c": 2}}


if __name__ == "__main__":
    sys.path[:0] = [ROOT, os.path.join(ROOT, "kernels")]
    for path in sys.argv[1:] or CONFIGS:
        with open(path) as f:
            for r in restated_keys(f.read(), path):
                print(f"{_rel(path)}:{r}")
