"""Self-tests of the wall checkers in test_architecture.py: each must report a synthetic file that
breaks its wall, at the right line, and let the allowed forms through."""

from __future__ import annotations

import pytest
from test_architecture import WALLS, module_name, parse_source

# Each checker must report a synthetic file that breaks its wall, at the right line, and must let
# the allowed forms through (so a checker that reports nothing, or everything, fails here).

BREAKS = [
    ("kernels_standalone", "kernels/fastcrit_kernels/_x.py", "import torch\nimport fastcrit.config\n", 2),
    ("kernels_standalone", "kernels/fastcrit_kernels/_x.py", "def f():\n    from fastcrit.types import Rollout\n", 2),
    (
        "kernels_standalone",
        "kernels/fastcrit_kernels/sub/_x.py",
        "import importlib\nm = importlib.import_module('fastcrit.models.hf')\n",
        2,
    ),
    ("algos_pure", "fastcrit/algos/_x.py", "import torch\nfrom fastcrit.rollout.base import Engine\n", 2),
    ("algos_pure", "fastcrit/algos/_x.py", "from .. import sandbox\n", 1),
    ("algos_pure", "fastcrit/algos/_x.py", "def f():\n    import fastcrit.train.dist as d\n", 2),
    ("algos_pure", "fastcrit/algos/_x.py", "from ..reward.base import RewardItem\n", 1),
    ("algos_pure", "fastcrit/algos/_x.py", "from fastcrit import cli\n", 1),
    ("sandbox_torch_free", "fastcrit/sandbox/_x.py", "import os\n\ndef f():\n    import torch.nn\n", 4),
    ("sandbox_torch_free", "fastcrit/sandbox/_x.py", "from transformers import AutoTokenizer\n", 1),
    ("sandbox_torch_free", "fastcrit/sandbox/_x.py", "from fastcrit.reward import get_reward_manager\n", 1),
    ("sandbox_torch_free", "fastcrit/sandbox/_x.py", "from .. import config\n", 1),
    ("sandbox_torch_free", "fastcrit/sandbox/_x.py", "__import__('fastcrit_kernels')\n", 1),
    ("sglang_only_in_rollout", "fastcrit/rollout/native.py", "\ndef f():\n    import sglang\n", 3),
    ("sglang_only_in_rollout", "fastcrit/train/_x.py", "from sglang.srt import server_args\n", 1),
    ("sglang_only_in_rollout", "fastcrit/train/_x.py", "import flash_attn\n", 1),
    ("sglang_only_in_rollout", "fastcrit/models/_x.py", "from vllm import LLM\n", 1),
    ("sglang_only_in_rollout", "fastcrit/models/tiny.py", "import flash_attn\n", 1),
    ("process_groups_only_in_train", "fastcrit/rollout/_x.py", "def load(t):\n    return t.full_tensor()\n", 2),
    ("process_groups_only_in_train", "fastcrit/models/_x.py", "from torch.distributed.tensor import DTensor\n", 1),
    ("process_groups_only_in_train", "fastcrit/recipes/_x.py", "from torch import distributed as dist\n", 1),
    (
        "process_groups_only_in_train",
        "fastcrit/recipes/_x.py",
        "import torch\n\ndef f(x):\n    torch.distributed.all_reduce(x)\n",
        4,
    ),
    (
        "process_groups_only_in_train",
        "fastcrit/reward/_x.py",
        "import torch\nok = torch.distributed.is_initialized()\n",
        2,
    ),
    ("process_groups_only_in_train", "fastcrit/data/_x.py", "def f(g):\n    g.barrier()\n", 2),
    ("process_groups_only_in_train", "kernels/fastcrit_kernels/_x.py", "def f(pg, t):\n    pg.reduce_scatter(t)\n", 2),
    (
        "process_groups_only_in_train",
        "fastcrit/cli.py",
        "import importlib\nd = importlib.import_module('torch.distributed.fsdp')\n",
        2,
    ),
    ("recipes_only_from_cli", "fastcrit/train/_x.py", "from fastcrit.recipes.grpo import run_grpo\n", 1),
    ("recipes_only_from_cli", "fastcrit/rollout/_x.py", "def f():\n    from ..recipes import scaffold\n", 2),
    ("recipes_only_from_cli", "fastcrit/config.py", "from fastcrit import recipes\n", 1),
    ("reward_public_sandbox", "fastcrit/reward/_x.py", "from fastcrit.sandbox.pool import SandboxPool\n", 1),
    ("reward_public_sandbox", "fastcrit/reward/_x.py", "import fastcrit.sandbox.types\n", 1),
    ("reward_public_sandbox", "fastcrit/reward/_x.py", "from fastcrit.sandbox import pool\n", 1),
    ("reward_public_sandbox", "fastcrit/reward/_x.py", "from ..sandbox.harness import values_equal\n", 1),
    (
        "reward_public_sandbox",
        "fastcrit/reward/_x.py",
        "import fastcrit.sandbox\n\nP = fastcrit.sandbox.pool.SandboxPool\n",
        3,
    ),
]

ALLOWED = [
    (
        "kernels_standalone",
        "kernels/fastcrit_kernels/_x.py",
        "import fastcrit_kernels.kl\nfrom fastcrit_kernels import _dispatch\nfrom . import ppo\n",
    ),
    (
        "algos_pure",
        "fastcrit/algos/_x.py",
        "import torch\nfrom fastcrit_kernels import kl_penalty\nfrom fastcrit.types import RolloutBatch\n",
    ),
    (
        "sandbox_torch_free",
        "fastcrit/sandbox/_x.py",
        "import json\nfrom . import harness\nfrom .types import Job\n\ndef f():\n    import fastcrit\n"
        "    import uvloop\n",
    ),
    ("sglang_only_in_rollout", "fastcrit/rollout/sglang.py", "def f():\n    import sglang\n"),
    ("sglang_only_in_rollout", "fastcrit/rollout/_x.py", "def f():\n    import flash_attn\n"),
    (
        "sglang_only_in_rollout",
        "fastcrit/models/hf.py",
        "import importlib\n\ndef f():\n    importlib.import_module('flash_attn.bert_padding')\n",
    ),
    (
        "process_groups_only_in_train",
        "fastcrit/recipes/_x.py",
        "from fastcrit.train.dist import all_reduce_mean, barrier\nfrom fastcrit.train import dist\n"
        "import fastcrit.train.dist as D\n\ndef f(x, t):\n    barrier()\n    dist.barrier()\n    D.barrier()\n"
        "    all_reduce_mean(x)\n    return t.gather(1, x)\n",
    ),
    (
        "process_groups_only_in_train",
        "fastcrit/train/_x.py",
        "import torch.distributed as dist\n\ndef f(t):\n    dist.barrier()\n    return t.full_tensor()\n",
    ),
    ("recipes_only_from_cli", "fastcrit/cli.py", "def f():\n    from fastcrit.recipes.grpo import run_grpo\n"),
    (
        "recipes_only_from_cli",
        "fastcrit/recipes/ctrl/recipe.py",
        "from fastcrit.recipes.scaffold import run\nfrom .grpo import step\n",
    ),
    (
        "reward_public_sandbox",
        "fastcrit/reward/_x.py",
        "import fastcrit.sandbox\nfrom fastcrit.sandbox import Job, SandboxPool, make_pool\n"
        "from ..sandbox import Result\nP = fastcrit.sandbox.SandboxPool\n",
    ),
]


@pytest.mark.parametrize("wall,path,text,line", BREAKS, ids=[f"{w}-{i}" for i, (w, *_rest) in enumerate(BREAKS)])
def test_checker_reports_a_breach(wall, path, text, line):
    found = WALLS[wall]([parse_source(path, text)])
    assert found, f"{wall}: did not report\n{text}"
    assert all(f.startswith(f"{path}:") for f in found), found
    assert any(f.startswith(f"{path}:{line}: ") for f in found), found


@pytest.mark.parametrize("wall,path,text", ALLOWED, ids=[f"{w}-{i}" for i, (w, *_r) in enumerate(ALLOWED)])
def test_checker_lets_the_allowed_forms_through(wall, path, text):
    assert WALLS[wall]([parse_source(path, text)]) == []


def test_every_wall_has_a_breach_and_an_allowed_case():
    assert {w for w, *_ in BREAKS} == set(WALLS) == {w for w, *_ in ALLOWED}


def test_relative_and_string_imports_resolve():
    s = parse_source(
        "fastcrit/sandbox/cli.py",
        "from . import make_pool\nfrom .pool import x\nfrom ..train import dist as d\n"
        "import importlib\nimportlib.import_module('.remote', __package__)\n"
        "importlib.import_module('.remote', 'fastcrit.sandbox')\n",
    )
    assert [i.module for i in s.imports] == [
        "fastcrit.sandbox",
        "fastcrit.sandbox.pool",
        "fastcrit.train",
        "importlib",
        "fastcrit.sandbox.remote",
        "fastcrit.sandbox.remote",
    ]
    assert s.aliases["d"] == "fastcrit.train.dist"
    init = parse_source("fastcrit/sandbox/__init__.py", "from .types import Job\n")
    assert init.module == "fastcrit.sandbox" and init.imports[0].module == "fastcrit.sandbox.types"
    assert module_name("kernels/fastcrit_kernels/kl.py") == ("fastcrit_kernels.kl", False)
