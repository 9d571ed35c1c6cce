"""What `pip install` brings (setup.py, kernels/pyproject.toml) and that a CPU user needs no triton:
triton is an extra (`fastcrit[triton]`, `fastcrit-kernels[triton]`; in `gpu` and `test`), never a
requirement, and training on CPU runs in a process where triton cannot be imported."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup_kwargs(monkeypatch) -> dict:
    """The arguments setup.py passes to setuptools.setup (it runs nothing else at import)."""
    import setuptools

    seen = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.update(kw))
    monkeypatch.chdir(ROOT)
    runpy.run_path(os.path.join(ROOT, "setup.py"))
    return seen


def _names(requirements) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def test_triton_is_an_extra_of_fastcrit_not_a_requirement(monkeypatch):
    kw = _setup_kwargs(monkeypatch)
    assert "triton" not in _names(kw["install_requires"])
    extras = kw["extras_require"]
    for extra in ("triton", "gpu", "test"):  # test: the kernel tests under TRITON_INTERPRET=1
        assert "triton" in _names(extras[extra]), extra
    assert "tensorboardx" in _names(extras["tensorboard"]) and "tensorboardx" in _names(extras["test"])


def test_ruff_is_pinned_in_the_test_extra_and_run_by_make_test(monkeypatch):
    """CI (.ci/run) runs `make test`, which runs the linter and the format check before pytest,
    with the version the test extra pins (a new release could fail unchanged code)."""
    extras = _setup_kwargs(monkeypatch)["extras_require"]
    assert [r for r in extras["test"] if r.startswith("ruff")] == ["ruff==0.17.6"]
    with open(os.path.join(ROOT, "Makefile")) as f:
        make = f.read()
    assert "test: lint\n" in make
    assert "$(BIN)/ruff format --check ." in make and "$(BIN)/ruff check ." in make


def test_triton_is_an_extra_of_fastcrit_kernels_not_a_dependency():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(ROOT, "kernels", "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert _names(project["dependencies"]) == {"torch"}
    assert _names(project["optional-dependencies"]["triton"]) == {"triton"}


# A finder first on sys.meta_path that refuses triton and its submodules, as an environment without
# triton does (installed or not on this machine).
NO_TRITON = r"""
import importlib.abc, sys
class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTriton())
"""

TRAIN = (
    NO_TRITON
    + r"""
import json, os, torch
from fastcrit.cli import main
argv = ["train", sys.argv[1]]
for s in sys.argv[2:]:
    argv += ["--set", s]
assert main(argv) == 0
assert "triton" not in sys.modules, "something imported triton"
import fastcrit_kernels as fk
from fastcrit_kernels._dispatch import HAS_TRITON
assert not HAS_TRITON
try:
    fk.kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), backend="triton")
except RuntimeError as e:
    print("ERROR", e)
"""
)

SETS = [
    "model.path=tiny",
    "model.tiny.hidden=64",
    "model.tiny.layers=2",
    "model.tiny.heads=2",
    "model.tiny.kv_heads=1",
    "model.tiny.intermediate=128",
    "data.prompts_per_step=2",
    "data.val_size=4",
    "rollout.n=4",
    "rollout.max_new_tokens=6",
    "sft.steps=1",
    "sft.batch_size=8",
    "algorithm.kl_coef=0.01",
    "trainer.micro_batch_size=4",
    "trainer.progress=false",
    "trainer.compute_threads=1",
    "trainer.total_steps=1",
]


def test_cpu_training_runs_without_triton_and_asking_for_it_names_the_install(tmp_path):
    """SFT then a GRPO step on CPU (the fused kernels' torch path, the reference's KL) in a process
    where triton cannot be imported; backend='triton' there says how to install it."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FASTCRIT_KERNELS_BACKEND")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "kernels")]))
    out = str(tmp_path / "run")
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            TRAIN,
            os.path.join(ROOT, "configs", "cpu", "grpo.yaml"),
            *SETS,
            f"trainer.output_dir={out}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert os.path.isfile(os.path.join(out, "summary.json"))
    (line,) = [x for x in p.stdout.splitlines() if x.startswith("ERROR ")]
    assert "backend='triton' needs triton, which is not installed: pip install 'fastcrit-kernels[triton]'" in line
