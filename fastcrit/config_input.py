"""Reading what the user typed into a config: YAML files and `--set` values (what PyYAML's
safe_load accepts but a config should not), values shown short in errors, and what an unknown key
probably meant. config.py builds the tree from what this returns."""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any

import yaml

from fastcrit.errors import ConfigError

_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
MAX_VALUES = 100_000  # scalars, lists and mappings in one file or --set value, aliases expanded
MAX_DEPTH = 50  # nesting of lists and mappings


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's base-60 and leading-zero octal numbers (``1:20`` is 80 and
    ``017`` is 15 there: silently other values than the ones typed; here they stay strings, which
    a number key refuses by name), and with duplicate keys refused (safe_load keeps the last)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (also on line {seen[key] + 1}; YAML would keep only the last)",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0|[-+]?[1-9][0-9_]*|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_ConfigLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _count_values(node, depth: int = 0, memo: dict | None = None) -> int:
    """Values under ``node`` with every alias expanded (each anchored node counted once per use, its
    count memoised), so that an alias bomb is refused before it is built; a self-referencing alias
    ends at MAX_DEPTH."""
    memo = {} if memo is None else memo
    if depth > MAX_DEPTH:
        raise ConfigError(f"nested deeper than {MAX_DEPTH} levels (or an alias that contains itself)")
    if id(node) in memo:
        return memo[id(node)]
    n = 1
    if isinstance(node, yaml.SequenceNode):
        n += sum(_count_values(c, depth + 1, memo) for c in node.value)
    elif isinstance(node, yaml.MappingNode):
        n += sum(_count_values(k, depth + 1, memo) + _count_values(v, depth + 1, memo) for k, v in node.value)
    if n > MAX_VALUES:
        raise ConfigError(f"holds more than {MAX_VALUES} values once its aliases are expanded")
    memo[id(node)] = n
    return n


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one line: where, then what."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        what = "; ".join(p for p in (e.context, e.problem) if p)
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark else what
    if isinstance(e, yaml.reader.ReaderError):
        if e.encoding == "unicode":  # a control character (NUL, ...) in decoded text
            return f"character {e.position} (0x{e.character:02x}): {e.reason} (a config is text)"
        return f"byte {e.position} (0x{e.character:02x}) is not {e.encoding}: save the config as UTF-8 text"
    return " ".join(str(e).split())


def read_yaml(stream, where: str) -> Any:
    """One YAML document from ``stream`` (text, or a binary file: UTF-8, or UTF-16 with a BOM), read
    with _ConfigLoader; any problem is a one-line ConfigError starting with ``where``."""
    loader = None
    try:
        loader = _ConfigLoader(stream)  # reads (and decodes) the first bytes already
        node = loader.get_single_node()
        if node is None:
            return None
        _count_values(node)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML: {_yaml_problem(e)}") from None
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except RecursionError:  # PyYAML composes nested lists and mappings recursively
        raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    finally:
        if loader is not None:
            loader.dispose()


def show(value: Any, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters, so that an error about a huge value stays one
    short line."""
    text = repr(value) if not isinstance(value, (list, dict)) or _small(value) else f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


def _small(value: Any, budget: int = 1000) -> bool:
    """Whether ``value`` holds at most ``budget`` items in all (repr of a shared-alias structure can be
    exponentially long)."""
    stack, seen = [value], 0
    while stack:
        v = stack.pop()
        seen += 1
        if seen > budget:
            return False
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return True


def _fields_named(node: Any, name: str, prefix: str = "") -> list[str]:
    """Full paths of the keys called ``name`` anywhere under ``node``."""
    out = []
    for f in dataclasses.fields(node):
        path = f"{prefix}{f.name}"
        if f.name == name:
            out.append(path)
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            out += _fields_named(value, name, f"{path}.")
    return out


def suggest(key: Any, node: Any, prefix: str, root: Any) -> str:
    """What an unknown ``key`` under ``node`` (a section of ``root``, the whole default tree) probably
    meant: a close spelling here, the same key in another section, else the keys known here."""
    import difflib

    hints = sorted(typing.get_type_hints(type(node)))
    text = str(key)
    if ":" in text and text.split(":", 1)[0].strip() in hints:  # `{n:4}`: YAML needs a space after ':'
        return f" (YAML needs a space after the colon: write '{text.split(':', 1)[0]}: {text.split(':', 1)[1]}')"
    close = difflib.get_close_matches(text, hints, n=3, cutoff=0.6)
    if not close:
        close = [h for h in hints if h.lower() == text.lower()]
    if close:
        return f"; did you mean {' or '.join(prefix + c for c in close)}?"
    elsewhere = _fields_named(root, text) if isinstance(key, str) else []
    if elsewhere:
        return f"; it is a key of {' and '.join(elsewhere)} (give its full path)"
    return f" (known here: {', '.join(hints)})"
