"""The recipe registry: which ``algorithm.name`` values `fastcrit train` knows, and what each needs.

A recipe declares itself in its own file, with one top-level assignment that holds only literals
(a tuple of them where one file holds several recipes)::

    RECIPE = Recipe(names=("pacs",), step="PACS", minimums={"rollout.n": (2, "advantages within a group")})

The registry reads those assignments from the source of ``fastcrit/recipes/`` (its files and its
packages, e.g. ``recipes/ctrl/``) without importing them: a recipe module loads torch and the
models, and the config loader, `fastcrit plan` and the CLI's start stay torch-free. The module is
imported when its step is asked for (``Recipe.load``). Directories named in ``FASTCRIT_RECIPES``
(``os.pathsep``-separated) are read too, so a recipe of one's own needs no file of fastcrit changed;
spawned ranks inherit the variable and find it again.

Everything that differs between algorithms outside their own file is a field here: config.py's
name check and config_checks.py's per-recipe rules, the pre-stage the CLI runs before the RL run,
and what `fastcrit plan` and the scaffold load besides the policy (a reference model, a value
critic, a proxy model).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field

from fastcrit.errors import ConfigError

ENV = "FASTCRIT_RECIPES"
RECIPES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes")


@dataclass(frozen=True)
class Recipe:
    """One RL recipe, as its file declares it (every field a literal, so the registry can read it
    without running the file)."""

    names: tuple[str, ...]  # the algorithm.name values it runs
    step: str  # the class in the same file that makes one RL step (fastcrit.recipes.scaffold.Step)
    # the function in the same file that runs before training, (ctx, cfg) -> cfg, on every rank of
    # `fastcrit train` and `fastcrit sft` (e.g. CTRL's synthetic critiques); "" = none
    prepare: str = ""
    # config keys with the least value this recipe accepts, and why: {"rollout.n": (2, "...")}
    minimums: dict = field(default_factory=dict)
    needs_reward: bool = True  # False: reward.name may be "" (the recipe scores its own answers)
    reward_names: tuple[str, ...] = ()  # the reward.name values it accepts; () = any
    # its policy loss is PPO's clipped policy gradient, which algorithm.tis_cap weights
    policy_gradient: bool = True
    # PPO's KL-in-reward: ppo.kl_in_reward_coef (a reference model when != 0) and algorithm.kl_ctrl=adaptive
    kl_in_reward: bool = False
    value_critic: bool = False  # trains a value model beside the policy (ppo.critic_path)
    online_reward_model: bool = False  # refreshes the reward model on its own answers (ppo.rm_refresh_every)
    # runs CTRL's proxy model (proxy.*): planned beside the policy, and an SGLang engine of its own
    # when proxy.rollout.engine is sglang
    proxy: bool = False
    # the policy's own answers one prompt may carry (RARO's critic reads two): the planned prompt
    # length grows by this many rollout.max_new_tokens
    answers_in_prompt: int = 0
    # data.train / data.val are prompt rows, read by the shared loader (fastcrit.data.datasets
    # .load_dataset): the CLI reads them once before launch, so a file whose rows it would refuse
    # stops the run before any model loads or SFT warm start runs. False for other formats (CTRL's
    # problem files, read by its pre-stage).
    prompt_rows: bool = True
    module: str = ""  # set by the registry: the module that declares it
    file: str = ""  # set by the registry: that module's file

    def load(self):
        """The step class (imports its module)."""
        return getattr(self._module(), self.step)

    def prepare_fn(self):
        """The pre-stage function, or None."""
        return getattr(self._module(), self.prepare) if self.prepare else None

    def needs_reference(self, cfg) -> bool:
        """Whether a run of ``cfg`` needs a frozen reference model: a KL term in the loss, or in the
        reward for a recipe that has one."""
        return cfg.algorithm.kl_coef != 0.0 or (self.kl_in_reward and cfg.ppo.kl_in_reward_coef != 0.0)

    def _module(self):
        if self.module in sys.modules:
            return sys.modules[self.module]
        if self.module.startswith("fastcrit."):
            return importlib.import_module(self.module)
        root = os.path.dirname(self.file)
        if root not in sys.path:  # its sibling modules import as they would beside a script
            sys.path.append(root)
        spec = importlib.util.spec_from_file_location(self.module, self.file)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[self.module] = mod  # before running it, as import does (dataclasses look it up)
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[self.module]
            raise
        return mod


_FIELDS = {f.name for f in dataclasses.fields(Recipe)} - {"module", "file"}


def _declarations(path: str) -> list[dict]:
    st = os.stat(path)
    return _read_declarations(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _read_declarations(path: str, mtime_ns: int, size: int) -> list[dict]:
    """The keyword arguments of each ``Recipe(...)`` that the top-level ``RECIPE`` of ``path`` holds
    (one, or a tuple of them); [] when it has none."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if "RECIPE" not in source:
        return []
    for node in ast.parse(source, path).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        if not (isinstance(target, ast.Name) and target.id == "RECIPE"):
            continue
        where = f"{path}:{node.lineno}"
        calls = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
        return [_keywords(call, where) for call in calls]
    return []


def _keywords(call: ast.expr, where: str) -> dict:
    if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Recipe" and not call.args):
        raise ConfigError(f"{where}: RECIPE must be Recipe(...), or a tuple of them, with keyword arguments only")
    kwargs = {}
    for kw in call.keywords:
        if kw.arg not in _FIELDS:
            raise ConfigError(f"{where}: Recipe has no field {kw.arg!r} (fields: {', '.join(sorted(_FIELDS))})")
        try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            raise ConfigError(
                f"{where}: Recipe field {kw.arg!r} must be a literal (the registry reads it without running the file)"
            ) from None
    return kwargs


# The module name a recipe file of FASTCRIT_RECIPES is loaded under: its own name alone could be one
# already imported (a user's `random.py` would find the standard library's in sys.modules).
EXTERNAL = "fastcrit_external_recipes"


def _module_name(path: str, root: str, package: str) -> str:
    rel = os.path.splitext(os.path.relpath(path, root))[0].split(os.sep)
    return ".".join([package or EXTERNAL, *rel])


def _check(r: Recipe) -> None:
    names_ok = isinstance(r.names, tuple) and r.names and all(isinstance(n, str) and n for n in r.names)
    if not names_ok or not isinstance(r.step, str) or not r.step:
        raise ConfigError(f"{r.file}: Recipe needs names (a tuple of strings) and step (its class's name)")
    for key, value in r.minimums.items():
        if not (isinstance(key, str) and isinstance(value, tuple) and len(value) == 2):
            raise ConfigError(f"{r.file}: Recipe minimums: {key!r}: expected 'section.key': (least, why)")


def _scan(dirs: tuple[str, ...]) -> dict[str, Recipe]:
    found: dict[str, Recipe] = {}
    for root in dirs:
        package = "fastcrit.recipes" if root == RECIPES_DIR else ""
        if not os.path.isdir(root):
            raise ConfigError(f"{ENV}: {root!r} is not a directory")
        for here, subdirs, files in os.walk(root):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "_")))
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(here, name)
                for kwargs in _declarations(path):
                    r = Recipe(**kwargs, module=_module_name(path, root, package), file=path)
                    _check(r)
                    for n in r.names:
                        if n in found:
                            raise ConfigError(f"algorithm.name {n!r} is declared twice: in {found[n].file} and {path}")
                        found[n] = r
    return found


def search_dirs() -> tuple[str, ...]:
    """fastcrit's own recipes, then the directories of ``FASTCRIT_RECIPES``."""
    extra = [os.path.abspath(d) for d in os.environ.get(ENV, "").split(os.pathsep) if d]
    return (RECIPES_DIR, *extra)


def recipes() -> dict[str, Recipe]:
    """algorithm.name -> its Recipe, for every recipe the registry finds."""
    return _scan(search_dirs())


def names() -> tuple[str, ...]:
    return tuple(recipes())


def recipe(name: str) -> Recipe:
    """The recipe of ``algorithm.name``; ConfigError naming those there are when there is none."""
    found = recipes()
    if name not in found:
        raise ConfigError(f"algorithm.name: {name!r} has no recipe (available: {', '.join(found)})")
    return found[name]
