"""The floors of docs/architecture.md: no room imports a room on a higher floor, and no room imports
another room's private names; read from the same parse of the source as test_architecture.py (every
import counted: lazy ones, those under ``if TYPE_CHECKING:``, ``importlib.import_module("...")``).

A room is a package under ``fastcrit/`` (``fastcrit.data``), a top-level module or a group of them
(``config``: config.py, config_checks.py, config_input.py, config_ranges.py, config_values.py),
``fastcrit_kernels``, or the faces (the commands: cli.py with launch_checks.py, bench_cli.py, the
scripts in benchmarks/). Each room stands on one floor; rooms on
the same floor may import each other as far as test_no_import_cycles allows. A module that belongs to
no room fails ``test_every_module_has_a_floor``, so a new room must be given a floor here and in the
docs. The same limits as the walls apply (see test_architecture.py's docstring): a module name
computed at run time is not seen.
"""

from __future__ import annotations

import ast
import re

import pytest
from test_architecture import DOC, import_graph, parse_source, resolve

# Each room: the dotted modules it is made of (a module, or a package and everything in it).
ROOMS = {
    "package": ("fastcrit",),  # the root package alone: its __init__ holds the version string
    "errors": ("fastcrit.errors",),
    "types": ("fastcrit.types",),
    "kernels": ("fastcrit_kernels",),
    "sandbox": ("fastcrit.sandbox",),
    "data": ("fastcrit.data",),
    "models": ("fastcrit.models",),
    "config": (
        "fastcrit.config",
        "fastcrit.config_checks",
        "fastcrit.config_input",
        "fastcrit.config_ranges",
        "fastcrit.config_values",
        "fastcrit.registry",
    ),
    "algos": ("fastcrit.algos",),
    "rollout": ("fastcrit.rollout",),
    "reward": ("fastcrit.reward",),
    "train": ("fastcrit.train",),
    "recipes": ("fastcrit.recipes",),
    "cli": ("fastcrit.cli", "fastcrit.launch_checks"),
    "bench_cli": ("fastcrit.bench_cli",),
    "benchmarks": ("benchmarks",),
}

# Bottom to top; docs/architecture.md's "## Floors" names the same floors in the same order.
FLOORS = [
    ("base", ("package", "errors", "types", "kernels", "sandbox")),
    ("data", ("data",)),
    ("models", ("models",)),
    ("config", ("config",)),
    ("algos", ("algos",)),
    ("rollout", ("rollout",)),
    ("reward", ("reward",)),
    ("train", ("train",)),
    ("recipes", ("recipes",)),
    ("faces", ("cli", "bench_cli", "benchmarks")),
]
FLOOR_OF = {room: i for i, (_, rooms) in enumerate(FLOORS) for room in rooms}


def room_of(module: str) -> str | None:
    """The room a dotted module belongs to (the longest matching prefix; the root package matches
    only itself), or None."""
    best, length = None, -1
    for room, prefixes in ROOMS.items():
        for p in prefixes:
            exact_only = p == "fastcrit"
            if (module == p or (not exact_only and module.startswith(p + "."))) and len(p) > length:
                best, length = room, len(p)
    return best


def _floor_name(room: str) -> str:
    return FLOORS[FLOOR_OF[room]][0]


def check_floors(sources) -> list[str]:
    """``path:line: what`` for every import of a room on a higher floor than the importer's."""
    mods = {s.module for s in sources}
    out = []
    for s in sources:
        here = room_of(s.module)
        if here is None:
            continue  # test_every_module_has_a_floor reports it
        for imp in s.imports:
            named = [t for t in imp.targets()[1:] if t in mods]
            for target in named or ([imp.module] if imp.module in mods else []):
                there = room_of(target)
                if there is not None and FLOOR_OF[there] > FLOOR_OF[here]:
                    out.append(
                        f"{s.where(imp.line)}: `{imp.text}` reaches {target}, an upward import (floor "
                        f"{_floor_name(here)} -> {_floor_name(there)})"
                    )
    return out


def unplaced(sources) -> list[str]:
    return [f"{s.path}: module {s.module} is in no room of {__name__}.ROOMS" for s in sources if not room_of(s.module)]


def _private(dotted_name: str) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in dotted_name.split("."))


def check_private_imports(sources) -> list[str]:
    """``path:line: what`` for every private name (a part starting with ``_``, dunders aside) of
    another room that a module imports or reads (``from fastcrit.x import _y``, ``import
    fastcrit.x._y``, ``x._y`` on an imported module)."""
    out = []
    for s in sources:
        here = room_of(s.module)
        for imp in s.imports:
            for target in [imp.module] + [f"{imp.module}.{n}" for n in imp.names if n != "*"]:
                there = room_of(target)
                if there is not None and there != here and _private(target):
                    out.append(f"{s.where(imp.line)}: `{imp.text}` reaches {target}, private to room {there}")
                    break
        inner = {id(n.value) for n in ast.walk(s.tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(s.tree):
            if isinstance(node, ast.Attribute) and id(node) not in inner:
                chain = _dotted_chain(node)
                name = resolve(s, chain)
                if name is None:
                    continue
                there = room_of(name)
                if there is not None and there != here and _private(name):
                    out.append(f"{s.where(node.lineno)}: uses {name}, private to room {there}")
    return out


def _dotted_chain(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


@pytest.fixture(scope="module")
def sources():
    from test_architecture import load_sources

    return load_sources()


def test_every_module_has_a_floor(sources):
    assert not unplaced(sources), "\n".join(unplaced(sources))


def test_no_upward_imports(sources):
    bad = check_floors(sources)
    assert not bad, f"imports from a lower floor to a higher one ({len(bad)}):\n" + "\n".join(bad)


def test_no_private_imports_across_rooms(sources):
    bad = check_private_imports(sources)
    assert not bad, f"private names of another room ({len(bad)}):\n" + "\n".join(bad)


def test_the_floor_check_finds_lazy_and_type_checking_upward_imports():
    files = {
        "fastcrit/data/_a.py": "def f():\n    from fastcrit.reward.rule import g\n",
        "fastcrit/models/_b.py": "import typing\nif typing.TYPE_CHECKING:\n    from fastcrit import config\n",
        "fastcrit/sandbox/_c.py": "import importlib\nm = importlib.import_module('fastcrit.data.tasks')\n",
        "fastcrit/reward/rule.py": "from fastcrit.data._a import f\nfrom fastcrit.sandbox import _c\n",
        "fastcrit/config.py": "from fastcrit.models import _b\n",
        "fastcrit/data/tasks.py": "import fastcrit.errors\n",
        "fastcrit/errors.py": "",
        "fastcrit/recipes/_d.py": "from fastcrit.bench_cli import main\n",
        "fastcrit/bench_cli.py": "import fastcrit.recipes._d\n",
    }
    sources = [parse_source(p, t) for p, t in files.items()]
    bad = check_floors(sources)
    assert [b.split(": ")[0] for b in bad] == [
        "fastcrit/data/_a.py:2",
        "fastcrit/models/_b.py:3",
        "fastcrit/sandbox/_c.py:2",
        "fastcrit/recipes/_d.py:1",
    ], bad
    assert "floor data -> reward" in bad[0] and "floor recipes -> faces" in bad[3]
    assert set(import_graph(sources)["fastcrit.reward.rule"]) == {"fastcrit.data._a", "fastcrit.sandbox._c"}


def test_the_private_check_finds_names_modules_and_attributes():
    files = {
        "fastcrit/reward/_x.py": "from fastcrit.data.tasks import _last_line\n",
        "fastcrit/train/_y.py": "import fastcrit_kernels._reference as r\n",
        "fastcrit/rollout/_z.py": "from fastcrit.models import hf\n\nhf._load(1)\n",
        "fastcrit/data/ok.py": "from fastcrit.data._inner import _f\nfrom fastcrit import __version__\n",
        "benchmarks/ok.py": "from fastcrit_kernels.advantages import ref_group_advantages\nfrom _common import _x\n",
    }
    bad = check_private_imports([parse_source(p, t) for p, t in files.items()])
    assert [b.split(": ")[0] for b in bad] == [
        "fastcrit/reward/_x.py:1",
        "fastcrit/train/_y.py:1",
        "fastcrit/rollout/_z.py:3",
    ], bad


def test_every_module_is_in_a_room_or_reported():
    assert room_of("fastcrit") == "package" and room_of("fastcrit.data.tasks") == "data"
    assert room_of("fastcrit.config_checks") == "config" and room_of("benchmarks.bench_kl") == "benchmarks"
    assert room_of("fastcrit.newroom") is None
    assert unplaced([parse_source("fastcrit/newroom.py", "")]) == [
        f"fastcrit/newroom.py: module fastcrit.newroom is in no room of {__name__}.ROOMS"
    ]


def floors_named_in(text: str) -> list[str]:
    """The floor names of docs/architecture.md's '## Floors' list, bottom first: each item starts
    ``N. **name**``."""
    m = re.search(r"^## Floors[ \t]*$(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        raise AssertionError("docs/architecture.md: no '## Floors' section")
    return re.findall(r"^\d+\. \*\*(\w+)\*\*", m.group(1), re.M)


def test_docs_list_the_floors_in_order():
    assert floors_named_in(DOC.read_text()) == [name for name, _ in FLOORS]


def test_the_docs_check_reads_the_floor_list():
    text = "## Floors\n\n1. **base** (a): why.\n2. **top** (b):\n   more why.\n\n## Next\n1. **x**\n"
    assert floors_named_in(text) == ["base", "top"]
    with pytest.raises(AssertionError, match="no '## Floors'"):
        floors_named_in("## Rooms\n1. **base**\n")
