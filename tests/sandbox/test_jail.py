"""What the jail does on this machine, checked from inside a running worker."""

import os

import pytest

from fastcrit.sandbox import IsolationUnavailable, Job, SandboxConfig, SyncSandboxPool
from fastcrit.sandbox import jail as jail_mod


def test_native_jail_is_built():
    # pip install (editable too) runs CMakeLists.txt; the binary is where the pool looks.
    path = jail_mod.jail_path()
    assert path is not None and os.access(path, os.X_OK), "fastcrit-jail missing: reinstall with cmake and cc"


def test_probe_reports_every_feature(jail_probe):
    if not jail_probe.features:
        pytest.skip(f"the jail did not run here: {jail_probe.describe()}")
    for key in ("netns", "mntns", "pidns", "newroot", "rofs", "uid_drop", "seccomp", "no_new_privs"):
        assert key in jail_probe.features
    if jail_probe.ok:
        assert jail_probe.features["socket_refused"] and jail_probe.features["unprivileged"]
        assert jail_probe.features["net_devices"] == ["lo"]


def test_pool_refuses_without_isolation(monkeypatch):
    monkeypatch.setattr(jail_mod, "jail_path", lambda: None)
    with pytest.raises(IsolationUnavailable) as e:
        with SyncSandboxPool(workers=1, isolation="jail"):
            pass
    assert "ISOLATION UNAVAILABLE" in str(e.value) and "isolation: none" in str(e.value)


def test_isolation_none_is_loud(capfd):
    with pytest.warns(RuntimeWarning, match="isolation is OFF"):
        with SyncSandboxPool(workers=1, isolation="none") as p:
            assert p.run(Job(code="print(1)", kind="stdio", tests=[["", "1"]])).all_passed
    assert "isolation is OFF" in capfd.readouterr().err


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="sandbox.isolation"):
        SandboxConfig(isolation="maybe")
    with pytest.raises(ValueError, match="sandbox.backend"):
        SandboxConfig(backend="cloud")


INSIDE_CHECKS = {
    "not root": "import os\nassert os.getuid() != 0 and os.geteuid() != 0",
    "own process group": "import os\nassert os.getpgrp() == os.getpid()",
    "scrubbed environment": "import os\nassert set(os.environ) <= {'PATH', 'LANG', 'LC_ALL', 'PYTHONHASHSEED', "
    "'PYTHONDONTWRITEBYTECODE', 'HOME', 'TMPDIR'}, sorted(os.environ)",
    "address-space limit": "import resource\nassert resource.getrlimit(resource.RLIMIT_AS)[0] == 300 << 20",
    "process limit": "import resource\nassert resource.getrlimit(resource.RLIMIT_NPROC)[0] == 34",
    "open-file limit": "import resource\nassert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 128",
    "file-size limit": "import resource\nassert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == 64 << 20",
    "own pid namespace": "import os\npids = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
    "assert 1 in pids and len(pids) <= 3, pids",
    "scratch writable, rest read-only": "import os\nassert os.access('.', os.W_OK)\n"
    "for d in ('/tmp', '/etc', '/usr', '/dev/shm', os.path.dirname(os.__file__),\n"
    "          os.path.dirname(os.getcwd())):\n"
    "    assert not os.access(d, os.W_OK), d",
    "HOME, TMPDIR and cwd are the scratch": "import os\n"
    "assert os.environ['HOME'] == os.environ['TMPDIR'] == os.getcwd()\n"
    "assert os.listdir('.') == [] and os.stat('.').st_mode & 0o777 == 0o700",
    "only loopback": "names = [l.split(':')[0].strip() for l in open('/proc/self/net/dev').read().splitlines()[2:]]\n"
    "assert names == ['lo'], names",
    "no core dumps": "import resource\nassert resource.getrlimit(resource.RLIMIT_CORE)[0] == 0",
    "seccomp on": "st = open('/proc/self/status').read()\nassert 'Seccomp:\\t2' in st and 'NoNewPrivs:\\t1' in st",
    "no capabilities": "st = open('/proc/self/status').read()\nassert 'CapEff:\\t0000000000000000' in st",
}


def test_inside_view(pool, jail_probe):
    if not jail_probe.ok:
        pytest.skip(f"no jail here: {jail_probe.describe()}")
    # Run as programs (stdio): assert tests run in the judge, not in the execution.
    names = list(INSIDE_CHECKS)
    rs = pool.run_many(
        [Job(code=INSIDE_CHECKS[n] + "\nprint('ok')\n", kind="stdio", tests=[["", "ok"]], memory_mb=300) for n in names]
    )
    bad = [(n, r.tests[0].status, r.tests[0].message) for n, r in zip(names, rs) if not r.all_passed]
    assert not bad, bad


def test_process_limit_holds_for_root_too(pool, jail_probe):
    """RLIMIT_NPROC is ignored for root; the jail drops root to a per-worker uid, so it holds.
    The uid's count includes the worker and the execution itself: 32 + 1 - 2 = 31 children."""
    if not jail_probe.ok:
        pytest.skip(f"no jail here: {jail_probe.describe()}")
    from test_worker_state import COUNT_FORKS as code  # forks until refused, returns how many

    r = pool.run(Job(code=code, kind="assert", tests=["n = f()\nassert 0 < n <= 31, n"], timeout_s=5))
    assert r.all_passed, r.tests


def test_workers_run_the_pools_own_code(pool):
    """Workers start with ``python -I`` (no PYTHONPATH); they must still import the fastcrit the
    pool imported, not another copy installed on the path (an editable install of another
    checkout, say)."""
    import fastcrit.sandbox

    here = os.path.dirname(os.path.abspath(fastcrit.sandbox.__file__))
    assert [w.hello.get("package") for w in pool.pool._workers] == [here] * len(pool.pool._workers)
