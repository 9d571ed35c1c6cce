import os
import warnings

import pytest

from fastcrit.sandbox import SyncSandboxPool, probe

_PROBE = probe()
JAIL_OK = _PROBE.ok
needs_jail = pytest.mark.skipif(not JAIL_OK, reason=f"the jail cannot be set up here: {_PROBE.describe()}")


@pytest.fixture(scope="session")
def jail_probe():
    return _PROBE


def _make_pool(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return SyncSandboxPool(workers=2, isolation="jail" if JAIL_OK else "none", **kw).__enter__()


@pytest.fixture(scope="session")
def pool():
    """The shared pool: jailed where the machine allows it, else isolation 'none' (functional
    tests only; the hostile suite needs the jail)."""
    os.environ["FASTCRIT_TEST_SECRET"] = "hunter2-secret-token"  # must never reach a program
    p = _make_pool()
    yield p
    p.close()
