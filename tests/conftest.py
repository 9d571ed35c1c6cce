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
