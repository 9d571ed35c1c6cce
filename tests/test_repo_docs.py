"""What the README promises about the checkout itself: the paths its examples write are ignored
by git, and the sections name what a new user needs (serve's model id, the bench extra)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
@pytest.mark.parametrize(
    "path",
    [
        "exported/model.safetensors",  # `fastcrit export runs/cpu-grpo exported` (README)
        "runs/cpu-grpo/metrics.jsonl",
        "benchmarks/results/quick/report.md",  # `fastcrit bench ... --quick`
    ],
)
def test_paths_the_readme_examples_write_are_ignored(path):
    rc = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode
    assert rc == 0, f"{path} is not ignored by .gitignore"


def test_serve_section_names_the_served_model_id_and_the_flag():
    text = " ".join(_section("Serving a model").split())
    assert "--served-model-name" in text
    assert "`MODEL_DIR` exactly as given" in text


def test_bench_plots_name_the_extra_they_need():
    text = " ".join(_section("The kernels alone").split())
    assert "with plots (the plots need the `[bench]` extra" in text
    assert "`--quick`" in text and "benchmarks/results/quick/" in text
