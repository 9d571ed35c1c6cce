"""The walls of docs/architecture.md, enforced by reading the source (no module is imported).

Every ``.py`` under ``fastcrit/``, ``kernels/`` and ``benchmarks/`` is parsed with ``ast``. An *import* is any of
``import a.b``, ``from a import b`` (absolute or relative, resolved against the file's package),
``importlib.import_module("a.b")`` / ``import_module(".b", __package__)`` / ``__import__("a.b")``
with a string literal, wherever it stands: at module level, inside a function, under ``if
TYPE_CHECKING:`` or ``try:``. ``from a import b`` counts as importing both ``a`` and ``a.b`` (``b``
may be a submodule). Each wall has one test, ``test_wall_<name>``, that lists every offence as
``path:line: what``; docs/architecture.md names each of these tests next to its wall and
``test_docs_name_every_wall`` keeps the two lists equal.

What the checks do NOT see (the run-time tests tests/sandbox/test_no_torch.py and
tests/kernels/test_standalone.py cover part of it):
- imports with a computed name (``import_module(f"{pkg}.{mod}")``), ``exec``, ``getattr`` tricks;
- what a module imports through another one (the walls are about direct imports; a third-party
  package that loads torch behind the sandbox's back is only caught by the run-time test);
- name binding by scope: an alias (``import x as y``) counts for the whole file;
- collectives under generic names (``gather``, ``reduce``, ``scatter``, ``send``, ``recv``: these
  are also ordinary tensor / functools / socket methods); a call through ``getattr`` either.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"

# Roots of the two packages on disk and the module name each maps to.
PACKAGE_DIRS = {
    "fastcrit": "fastcrit",
    "kernels/fastcrit_kernels": "fastcrit_kernels",
    # the benchmark scripts: a face beside cli.py (they run as `python benchmarks/bench_x.py`), read
    # as modules `benchmarks.<name>` so that every wall and the cycle check cover them too
    "benchmarks": "benchmarks",
}

# Third-party packages that load torch when imported (the sandbox must import none of them).
TORCH_PULLERS = (
    "torch",
    "triton",
    "transformers",
    "fastcrit_kernels",
    "sglang",
    "sgl_kernel",
    "vllm",
    "flash_attn",
    "accelerate",
    "peft",
    "deepspeed",
    "torchvision",
    "torchaudio",
    "liger_kernel",
    "safetensors.torch",
)
SGLANG = ("sglang", "sgl_kernel")
GPU_ENGINE_LIBS = ("flash_attn", "vllm")
FLASH_ATTN_PROBE = "fastcrit/models/hf.py"
# Methods / functions that run a collective or create / destroy a process group or a sharded tensor.
COLLECTIVES = frozenset(
    {
        "full_tensor",
        "redistribute",
        "distribute_tensor",
        "fully_shard",
        "init_device_mesh",
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "all_gather_into_tensor",
        "all_to_all",
        "all_to_all_single",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "gather_object",
        "scatter_object_list",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "init_process_group",
        "destroy_process_group",
        "new_group",
        "new_subgroups",
    }
)


# ---------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # the resolved dotted module, e.g. "fastcrit.sandbox" for `from ..sandbox import x`
    names: tuple[str, ...] = ()  # for `from module import a, b`: ("a", "b")
    text: str = ""  # how it was written, for the message

    def targets(self) -> list[str]:
        """Everything this statement may load: the module, and module.name for each name."""
        return [self.module] + [f"{self.module}.{n}" for n in self.names if n != "*"]


@dataclass
class Source:
    path: str  # relative to the repository root, with "/"
    module: str  # dotted module name ("fastcrit.sandbox" for fastcrit/sandbox/__init__.py)
    is_package: bool
    tree: ast.Module = field(repr=False)
    imports: list[Import] = field(default_factory=list, repr=False)
    aliases: dict[str, str] = field(default_factory=dict, repr=False)  # local name -> dotted module / object

    def where(self, line: int) -> str:
        return f"{self.path}:{line}"

    def under(self, folder: str) -> bool:
        return self.path.startswith(folder.rstrip("/") + "/")


def module_name(path: str) -> tuple[str, bool]:
    """``fastcrit/a/b.py`` -> ("fastcrit.a.b", False); ``.../__init__.py`` -> (package, True)."""
    for root, pkg in PACKAGE_DIRS.items():
        if path == root or path.startswith(root + "/"):
            rest = path[len(root) :].lstrip("/")
            parts = [pkg] + [p for p in rest[:-3].split("/") if p] if rest.endswith(".py") else [pkg]
            if parts[-1] == "__init__":
                return ".".join(parts[:-1]), True
            return ".".join(parts), False
    raise ValueError(f"{path}: not under {sorted(PACKAGE_DIRS)}")


def _resolve_relative(src_module: str, is_package: bool, level: int, name: str | None) -> str:
    base = src_module.split(".") if is_package else src_module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    if not base:
        raise ValueError(f"relative import beyond the top package in {src_module}")
    return ".".join(base + ([name] if name else []))


def _string(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _import_module_call(node: ast.Call, src: Source) -> Import | None:
    f = node.func
    fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if fname not in ("import_module", "__import__") or not node.args:
        return None
    name = _string(node.args[0])
    if name is None:
        return None  # a computed name: not statically knowable (see the module docstring)
    if name.startswith("."):
        pkg_arg = (
            node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "package"), None)
        )
        if fname != "import_module" or pkg_arg is None:
            return None
        if _string(pkg_arg) is not None:
            pkg = _string(pkg_arg)
        elif isinstance(pkg_arg, ast.Name) and pkg_arg.id == "__package__":
            pkg = src.module if src.is_package else src.module.rpartition(".")[0]
        elif isinstance(pkg_arg, ast.Name) and pkg_arg.id == "__name__":
            pkg = src.module
        else:
            return None
        level = len(name) - len(name.lstrip("."))
        parts = pkg.split(".")
        target = ".".join(parts[: len(parts) - (level - 1)] + [name.lstrip(".")])
        return Import(node.lineno, target, (), f"{fname}({name!r})")
    return Import(node.lineno, name, (), f"{fname}({name!r})")


def parse_source(path: str, text: str) -> Source:
    """Parse one file and collect its imports and import aliases (works on synthetic text too)."""
    module, is_package = module_name(path)
    src = Source(path, module, is_package, ast.parse(text, filename=path))
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                text = f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
                src.imports.append(Import(node.lineno, a.name, (), text))
                if a.asname:
                    src.aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    src.aliases[top] = top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                mod = _resolve_relative(module, is_package, node.level, node.module)
            else:
                mod = node.module or ""
            names = tuple(a.name for a in node.names)
            written = "." * node.level + (node.module or "")
            src.imports.append(Import(node.lineno, mod, names, f"from {written} import {', '.join(names)}"))
            for a in node.names:
                if a.name != "*":
                    src.aliases[a.asname or a.name] = f"{mod}.{a.name}"
        elif isinstance(node, ast.Call):
            imp = _import_module_call(node, src)
            if imp is not None:
                src.imports.append(imp)
    return src


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name; None for anything else (calls, subscripts)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def resolve(src: Source, chain: str | None) -> str | None:
    """A dotted chain with its first name replaced by what the file imported under that name."""
    if chain is None:
        return None
    head, _, rest = chain.partition(".")
    if head not in src.aliases:
        return None  # a local variable, a parameter, a builtin: not a module
    return src.aliases[head] + ("." + rest if rest else "")


def within(name: str, prefixes) -> bool:
    """``name`` is one of ``prefixes`` or inside one of them (dotted, not string, prefix)."""
    if isinstance(prefixes, str):
        prefixes = (prefixes,)
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def load_sources() -> list[Source]:
    out = []
    for top in ("fastcrit", "kernels", "benchmarks"):
        for dirpath, dirnames, filenames in os.walk(ROOT / top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            for f in sorted(filenames):
                if f.endswith(".py"):
                    full = Path(dirpath) / f
                    rel = full.relative_to(ROOT).as_posix()
                    if not any(rel.startswith(r + "/") for r in PACKAGE_DIRS):
                        continue  # e.g. a script next to kernels/pyproject.toml is not the package
                    out.append(parse_source(rel, full.read_text()))
    return out


def sandbox_submodules() -> frozenset[str]:
    d = ROOT / "fastcrit" / "sandbox"
    return frozenset(
        [p.stem for p in d.glob("*.py") if p.stem != "__init__"]
        + [p.name for p in d.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    )


# ---------------------------------------------------------------------------------------- the walls
# Each checker takes parsed sources and returns "path:line: what" for every offence.


def _forbidden_imports(sources, applies, forbidden, why: str) -> list[str]:
    out = []
    for s in sources:
        if not applies(s):
            continue
        for imp in s.imports:
            hit = next((t for t in imp.targets() if forbidden(t)), None)
            if hit is not None:
                out.append(f"{s.where(imp.line)}: `{imp.text}` reaches {hit} ({why})")
    return out


def check_kernels_standalone(sources) -> list[str]:
    return _forbidden_imports(
        sources,
        lambda s: s.module.split(".")[0] == "fastcrit_kernels",
        lambda t: within(t, "fastcrit"),
        "fastcrit_kernels must never import fastcrit",
    )


ALGOS_FORBIDDEN = tuple(f"fastcrit.{r}" for r in ("rollout", "train", "sandbox", "reward", "recipes", "cli"))


def check_algos_pure(sources) -> list[str]:
    return _forbidden_imports(
        sources, lambda s: s.under("fastcrit/algos"), lambda t: within(t, ALGOS_FORBIDDEN), "algos/ is pure tensor math"
    )


def check_sandbox_torch_free(sources) -> list[str]:
    def forbidden(t: str) -> bool:
        if within(t, TORCH_PULLERS):
            return True
        if within(t, "fastcrit") and not within(t, "fastcrit.sandbox"):
            # `import fastcrit` (the root package, only a version string) is loaded by importing
            # fastcrit.sandbox anyway; so are its dunder attributes.
            return not (t == "fastcrit" or re.fullmatch(r"fastcrit\.__\w+__", t))
        return False

    return _forbidden_imports(
        sources,
        lambda s: s.under("fastcrit/sandbox"),
        forbidden,
        "the sandbox imports neither torch nor the rest of fastcrit",
    )


def check_sglang_and_gpu_engines(sources) -> list[str]:
    out = _forbidden_imports(
        sources,
        lambda s: s.path != "fastcrit/rollout/sglang.py",
        lambda t: within(t, SGLANG),
        "only fastcrit/rollout/sglang.py imports sglang",
    )
    # models/hf.py probes that flash-attn 2 imports (flash_attn_2_problem) before Transformers loads it
    out += _forbidden_imports(
        sources,
        lambda s: not (s.under("fastcrit/rollout") or s.path == FLASH_ATTN_PROBE),
        lambda t: within(t, GPU_ENGINE_LIBS),
        f"only rollout/ (and the probe in {FLASH_ATTN_PROBE}) imports flash_attn / vllm",
    )
    return out


def check_process_groups(sources) -> list[str]:
    out = []
    for s in sources:
        if s.under("fastcrit/train"):
            continue
        for imp in s.imports:
            hit = next((t for t in imp.targets() if within(t, "torch.distributed")), None)
            if hit is not None:
                out.append(f"{s.where(imp.line)}: `{imp.text}` reaches {hit} (only train/ touches process groups)")
        inner = {id(n.value) for n in ast.walk(s.tree) if isinstance(n, ast.Attribute)}
        seen = set()
        for node in ast.walk(s.tree):
            if isinstance(node, ast.Attribute) and id(node) not in inner:
                name = resolve(s, dotted(node))
                if name and within(name, "torch.distributed") and node.lineno not in seen:
                    seen.add(node.lineno)
                    out.append(f"{s.where(node.lineno)}: uses {name} (only train/ touches process groups)")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in COLLECTIVES:
                owner = resolve(s, dotted(node.func.value))
                if owner is not None and within(owner, "fastcrit.train"):
                    continue  # a function that lives in train/: the collective stays there
                out.append(
                    f"{s.where(node.lineno)}: calls .{node.func.attr}() (a collective / process-"
                    "group call; only train/ makes them, others call a fastcrit.train function)"
                )
    return out


def check_recipes_only_from_cli(sources) -> list[str]:
    return _forbidden_imports(
        sources,
        lambda s: s.path != "fastcrit/cli.py" and not s.under("fastcrit/recipes") and not s.under("benchmarks"),
        lambda t: within(t, "fastcrit.recipes"),
        "only the faces, fastcrit/cli.py and benchmarks/, import recipes",
    )


def check_reward_public_sandbox(sources) -> list[str]:
    subs = sandbox_submodules()
    out = []
    for s in sources:
        if not s.under("fastcrit/reward"):
            continue
        for imp in s.imports:
            bad = None
            if within(imp.module, "fastcrit.sandbox") and imp.module != "fastcrit.sandbox":
                bad = imp.module
            elif imp.module == "fastcrit.sandbox":
                bad = next((f"fastcrit.sandbox.{n}" for n in imp.names if n in subs), None)
            if bad is not None:
                out.append(
                    f"{s.where(imp.line)}: `{imp.text}` reaches {bad} (reward/ uses the public "
                    "package fastcrit.sandbox only)"
                )
        inner = {id(n.value) for n in ast.walk(s.tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(s.tree):
            if isinstance(node, ast.Attribute) and id(node) not in inner:
                name = resolve(s, dotted(node))
                if name and within(name, "fastcrit.sandbox") and name != "fastcrit.sandbox":
                    sub = name.split(".")[2]
                    if sub in subs:
                        out.append(
                            f"{s.where(node.lineno)}: uses {name} (reward/ uses the public "
                            "package fastcrit.sandbox only)"
                        )
    return out


WALLS = {
    "kernels_standalone": check_kernels_standalone,
    "algos_pure": check_algos_pure,
    "sandbox_torch_free": check_sandbox_torch_free,
    "sglang_only_in_rollout": check_sglang_and_gpu_engines,
    "process_groups_only_in_train": check_process_groups,
    "recipes_only_from_cli": check_recipes_only_from_cli,
    "reward_public_sandbox": check_reward_public_sandbox,
}


@pytest.fixture(scope="module")
def sources() -> list[Source]:
    found = load_sources()
    assert any(s.path == "fastcrit/cli.py" for s in found) and any(s.under("kernels") for s in found)
    return found


def _enforce(wall: str, sources) -> None:
    bad = sorted(set(WALLS[wall](sources)), key=lambda m: (m.split(":")[0], int(m.split(":")[1])))
    assert not bad, f"wall '{wall}' broken ({len(bad)}):\n" + "\n".join(bad)


# ---------------------------------------------------------------------------------------- one test per wall


def test_wall_kernels_standalone(sources):
    _enforce("kernels_standalone", sources)


def test_wall_algos_pure(sources):
    _enforce("algos_pure", sources)


def test_wall_sandbox_torch_free(sources):
    _enforce("sandbox_torch_free", sources)


def test_wall_sglang_only_in_rollout(sources):
    _enforce("sglang_only_in_rollout", sources)


def test_wall_process_groups_only_in_train(sources):
    _enforce("process_groups_only_in_train", sources)


def test_wall_recipes_only_from_cli(sources):
    _enforce("recipes_only_from_cli", sources)


def test_wall_reward_public_sandbox(sources):
    _enforce("reward_public_sandbox", sources)


# ---------------------------------------------------------------------------------------- no import cycles


def import_graph(sources) -> dict[str, set[str]]:
    """Module -> the modules of this repository it imports, every import counted (lazy ones and those
    under ``if TYPE_CHECKING:`` too): ``from a import b`` is an arrow to the module ``a.b`` when there
    is one, else to ``a``."""
    mods = {s.module for s in sources}
    graph: dict[str, set[str]] = {}
    for src in sources:
        out: set[str] = set()
        for imp in src.imports:
            named = [t for t in imp.targets()[1:] if t in mods]
            out.update(named or ([imp.module] if imp.module in mods else []))
        out.discard(src.module)
        graph[src.module] = out
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that import each other, directly or around a loop (the
    strongly connected components of the graph, Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycles(sources):
    cycles = import_cycles(import_graph(sources))
    assert not cycles, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_lazy_and_a_type_checking_cycle():
    files = {
        "fastcrit/_a.py": "def f():\n    from fastcrit._b import g\n",
        "fastcrit/_b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fastcrit import _a\n",
        "fastcrit/_c.py": "from fastcrit._d import x\n",
        "fastcrit/_d.py": "from fastcrit._e import y\n",
        "fastcrit/_e.py": "import fastcrit._c\n",
        "fastcrit/_f.py": "from fastcrit._a import f\n",
    }
    graph = import_graph([parse_source(path, text) for path, text in files.items()])
    assert graph["fastcrit._b"] == {"fastcrit._a"}  # `from fastcrit import _a`: the module, not the package
    assert import_cycles(graph) == [["fastcrit._a", "fastcrit._b"], ["fastcrit._c", "fastcrit._d", "fastcrit._e"]]


def walls_named_in(text: str, where: str = "docs/architecture.md") -> list[str]:
    """The ``test_wall_*`` name of each bullet of the '## Walls' section, in order; a bullet that
    names none or several is an error naming it."""
    m = re.search(r"^## Walls[ \t]*$(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        raise AssertionError(f"{where}: no '## Walls' section")
    named = []
    for bullet in re.split(r"^- ", m.group(1), flags=re.M)[1:]:
        tests = re.findall(r"`(test_wall_\w+)`", bullet)
        if len(tests) != 1:
            raise AssertionError(
                f"{where}: a wall must name exactly one test, this one names {len(tests)}:\n- {bullet.strip()}"
            )
        named.append(tests[0])
    return named


def test_docs_name_every_wall():
    """Each bullet of the Walls section names its test, and every wall test is named there."""
    named = walls_named_in(DOC.read_text())
    defined = sorted(n for n in globals() if n.startswith("test_wall_"))
    assert sorted(named) == defined, f"walls in {DOC.name}: {sorted(named)}; tests here: {defined}"
    assert sorted(f"test_wall_{w}" for w in WALLS) == defined


def test_docs_check_notices_a_wall_without_a_test():
    ok = "## Walls\n\n- a. Test: `test_wall_a`.\n- b, on\n  two lines. Test: `test_wall_b`.\n\n## Next\n- x\n"
    assert walls_named_in(ok) == ["test_wall_a", "test_wall_b"]
    with pytest.raises(AssertionError, match="names 0"):
        walls_named_in(ok.replace(" Test: `test_wall_b`.", ""))
    with pytest.raises(AssertionError, match="no '## Walls' section"):
        walls_named_in("## Rooms\n- a `test_wall_a`\n")
