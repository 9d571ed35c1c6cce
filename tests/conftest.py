import os

import pytest

# Triton kernels run under the interpreter on CPU-only machines. The flag must be set before any
# module decorated with @triton.jit is imported, so it is set here, at collection time.
try:
    import torch

    _has_cuda = torch.cuda.is_available()
except ImportError:  # torch-free environments still run the sandbox tests
    _has_cuda = False
if not _has_cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# A smaller tiny model than the CPU default, for fast tests (built once, cached in $FASTCRIT_CACHE).
TINY_TEST_SPEC = "tiny:hidden=64,layers=2,heads=2,kv_heads=1,intermediate=128"


@pytest.fixture(scope="session")
def tiny_model_path():
    from fastcrit.models.hf import resolve_model_path

    return resolve_model_path(TINY_TEST_SPEC)


@pytest.fixture(scope="session")
def tied_tiny_model_path():
    """The same model with its lm_head tied to the embedding (as Qwen2.5-0.5B's and 1.5B's)."""
    from fastcrit.models.hf import resolve_model_path

    return resolve_model_path(TINY_TEST_SPEC + ",tie_word_embeddings=true")


class FakeSite:
    """A directory first on sys.path where a test installs fake distributions of the ``flash_attn``
    module (a dist-info with METADATA and top_level.txt, and the module's files), as pip leaves
    them: what ``importlib.metadata`` and ``import`` see, without a GPU or a build."""

    def __init__(self, root):
        self.root = root

    def dist(self, name: str, version: str, files: dict[str, str]) -> None:
        info = self.root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "top_level.txt").write_text("flash_attn\n")
        for rel, text in files.items():
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.root / rel).write_text(text)


@pytest.fixture
def flash_attn_site(tmp_path, monkeypatch):
    """A FakeSite, empty: no ``flash_attn`` at all until the test installs one. Skipped where a real
    flash-attn or flash-attn-4 is installed (the fakes would mix with it)."""
    import importlib
    import sys
    from importlib import metadata

    if metadata.packages_distributions().get("flash_attn"):
        pytest.skip("a real flash_attn distribution is installed here")

    def forget():
        for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
            del sys.modules[name]

    forget()
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield FakeSite(tmp_path)
    forget()


def _stderr_on_a_terminal(cmd) -> tuple[int, str]:
    """Run ``cmd`` with stderr on a pseudo-terminal (stdout a pipe); its exit code and what the
    terminal showed."""
    import fcntl
    import pty
    import struct
    import subprocess
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal's size
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    p.stdout.read()
    return p.wait(timeout=120), shown.decode("utf-8", "replace")


@pytest.fixture
def on_a_terminal():
    """``run(cmd) -> (exit code, what stderr showed)`` with stderr on a 100-column pseudo-terminal
    (stdout a pipe): what a progress bar shows a user."""
    return _stderr_on_a_terminal
