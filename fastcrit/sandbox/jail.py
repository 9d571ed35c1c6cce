"""Python side of the native jail (``native/jail.c``, built into ``fastcrit/sandbox/_native/bin``).

``read_view()`` decides what the worker's new root holds (the jail builds it with ``--ro`` and
``--hide``). ``probe()`` runs the jail once in ``--probe`` mode and then starts Python under it and
checks, from inside, that sockets are refused, that the root filesystem is read-only and that the
interpreter's site-packages hold only the allowed packages. The pool
refuses untrusted code when this fails, unless the user asked for ``isolation: none``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

_HERE = os.path.dirname(os.path.abspath(__file__))
REQUIRED = ("netns", "mntns", "pidns", "newroot", "no_new_privs", "seccomp")


class IsolationUnavailable(RuntimeError):
    """The jail cannot be set up here; the message says what failed and how to opt out."""


def jail_path() -> str | None:
    """The built jail: the package's _native/bin first, then $FASTCRIT_JAIL, then PATH."""
    cands = [os.path.join(_HERE, "_native", "bin", "fastcrit-jail"), os.environ.get("FASTCRIT_JAIL", "")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return shutil.which("fastcrit-jail")


# What a program needs besides the interpreter: system library directories (shared libraries of
# the interpreter, its extension modules and the allowed packages; they hold no data of ours), the
# time-zone database, the dynamic linker's cache, the local time zone and the harmless devices.
SYSTEM_PATHS = (
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libx32",
    "/usr/local/lib",
    "/usr/share/zoneinfo",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
)
# Copied as links only (they point into the jail's own /proc).
PROC_LINKS = ("/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")
SITE_DIR_NAMES = ("site-packages", "dist-packages")


def _chain(path: str) -> list[str]:
    """``path`` as the kernel resolves it: every symbolic link met on the way (each must be copied
    into the new root for the path to resolve there) and, last, the real path."""
    out, todo, cur = [], [c for c in os.path.abspath(path).split("/") if c], "/"
    for _ in range(256):
        if not todo:
            return out + [cur]
        name = todo.pop(0)
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        if name != "." and os.path.islink(nxt):
            out.append(nxt)
            target = os.readlink(nxt)
            todo[:0] = [c for c in target.split("/") if c]
            if target.startswith("/"):
                cur = "/"
        elif name != ".":
            cur = nxt
    raise OSError(f"too many symbolic links resolving {path}")


def _site_dirs_under(top: str) -> list[str]:
    """Every site-packages / dist-packages directory under ``top`` (links not followed)."""
    found, stack = [], [top]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        (found if e.name in SITE_DIR_NAMES else stack).append(e.path)
        except OSError:
            pass
    return found


def _package_paths(name: str) -> list[str] | None:
    """The files of an importable top-level package, found without importing it: its directory
    (or module file) and its ``<name>.libs`` sibling, where wheels keep bundled shared libraries.
    None when it is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        paths = [p for p in spec.submodule_search_locations if os.path.isdir(p)]
    else:
        paths = [spec.origin] if spec.origin and os.path.isfile(spec.origin) else []
    for p in list(paths):
        libs = os.path.join(os.path.dirname(p), name + ".libs")
        if os.path.isdir(libs) and libs not in paths:
            paths.append(libs)
    return paths


@dataclass(frozen=True)
class View:
    """The new root of a jailed worker: ``args`` for the jail (``--ro``/``--hide`` in order),
    the allowed packages found and those that are not installed."""

    args: tuple
    packages: tuple
    missing: tuple

    def in_site_dirs(self) -> set:
        """Names bound into the hidden (site-packages) directories: the allowed packages' files."""
        hidden = {self.args[k + 1] for k in range(0, len(self.args), 2) if self.args[k] == "--hide"}
        return {os.path.basename(p) for p in self.args[1::2] if os.path.dirname(p) in hidden}


@functools.lru_cache(maxsize=8)
def read_view(packages: tuple) -> View:
    """What a jailed program can read: the interpreter (its symbolic links, real file, venv ``bin/``
    and ``pyvenv.cfg``), the standard library, the system paths above, fastcrit's
    ``__init__.py`` and ``sandbox/`` (the worker's code, nothing else of the repository), and the
    allowed ``packages``. Every site-packages / dist-packages directory inside those trees, and the
    interpreter's own, is an empty read-only tmpfs into which only the allowed packages are bound.
    Computed once per process (the walk over the library trees takes ~0.2 s)."""
    import site
    import sysconfig

    import fastcrit

    ro, hide = set(), set()

    def want(path):
        if path and os.path.lexists(path):
            ro.update(_chain(path))

    want(sys.executable)
    if sys.prefix != sys.base_prefix:
        want(os.path.join(sys.prefix, "bin"))
        want(os.path.join(sys.prefix, "pyvenv.cfg"))
    paths = sysconfig.get_paths()
    for p in (
        paths["stdlib"],
        paths["platstdlib"],
        sysconfig.get_config_var("LIBDIR"),
        sysconfig.get_config_var("DESTSHARED"),
        *[p for p in sys.path if p.endswith("lib-dynload")],
        os.path.join(sys.base_prefix, "lib", f"python{sys.version_info[0]}{sys.version_info[1]}.zip"),
    ):
        want(p)
    for p in SYSTEM_PATHS:
        want(p)
    ro.update(p for p in PROC_LINKS if os.path.islink(p))
    pkg = os.path.dirname(os.path.abspath(fastcrit.__file__))
    want(os.path.join(pkg, "__init__.py"))
    want(os.path.join(pkg, "sandbox"))
    for d in {*site.getsitepackages(), *site.getsitepackages([sys.base_prefix]), paths["purelib"], paths["platlib"]}:
        if os.path.isdir(d):
            hide.add(os.path.realpath(d))
    for top in [p for p in ro if os.path.isdir(p) and not os.path.islink(p)]:
        hide.update(_site_dirs_under(top))
    found, missing = [], []
    for name in packages:
        got = _package_paths(name)
        if got is None:
            missing.append(name)
            continue
        found.append(name)
        for p in got:
            want(p)
    return View(tuple(_ordered(ro, hide)), tuple(found), tuple(missing))


def _ordered(ro: set, hide: set) -> list[str]:
    """Jail arguments, a path always after the ones it lies under. A path inside a tree already
    bound is left out (it is there), unless a hidden directory lies between them."""
    kinds = {p: "--ro" for p in ro}
    kinds.update({p: "--hide" for p in hide})
    args, kept = [], []
    for p in sorted(kinds, key=lambda p: p.split("/")):
        while kept and not p.startswith(kept[-1][0].rstrip("/") + "/"):
            kept.pop()
        if kinds[p] == "--ro" and kept and kept[-1][1] == "--ro":
            continue
        kept.append((p, kinds[p]))
        args += [kinds[p], p]
    return args


def worker_argv(cfg_json: str) -> list[str]:
    """The worker's command line. ``-I`` keeps the pool's environment out, PYTHONPATH included,
    so the directory fastcrit was imported from is put first on the worker's path: the worker
    runs the same code as the pool, not whatever copy is installed (an editable install of
    another checkout, say)."""
    import fastcrit

    root = os.path.dirname(os.path.dirname(os.path.abspath(fastcrit.__file__)))
    boot = f"import sys; sys.path.insert(0, {root!r}); from fastcrit.sandbox.workers import main; sys.exit(main())"
    return [sys.executable, "-I", "-c", boot, cfg_json]


def jailed_argv(
    jail: str, uid: int, scratch: str, scratch_mb: int, inner: list[str], packages: tuple | None = None
) -> list[str]:
    """The jail's command line for one worker; ``packages``: the third-party packages programs may
    import (``sandbox.packages``; None: its default)."""
    view = read_view(_packages(packages))
    return [jail, "--uid", str(uid), "--scratch", scratch, "--scratch-mb", str(scratch_mb), *view.args, "--", *inner]


def _packages(packages) -> tuple:
    if packages is None:
        from .types import SandboxConfig

        return SandboxConfig.packages
    return tuple(packages)


@dataclass
class Probe:
    ok: bool
    features: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    jail: str | None = None

    def describe(self) -> str:
        on = [k for k, v in self.features.items() if v is True or v == 1]
        off = [k for k, v in self.features.items() if v is False or v == 0]
        return f"on: {', '.join(on) or '-'}; off: {', '.join(off) or '-'}" + (
            f"; problems: {'; '.join(self.problems)}" if self.problems else ""
        )


_CHECK = r"""
import json, os, socket
r = {"uid": os.getuid(), "pid": os.getpid()}
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM); r["socket_refused"] = False
except OSError:
    r["socket_refused"] = True
try:
    open("/fastcrit-probe-write", "w"); r["rootfs_readonly"] = False; os.unlink("/fastcrit-probe-write")
except OSError:
    r["rootfs_readonly"] = True
import site  # the site-packages directories the interpreter looks in: only allowed packages
dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
r["site_packages"] = sorted({n for d in dirs for n in os.listdir(d)} - {"__pycache__"})
try:  # /proc is the jail's own, so this lists the interfaces of the jail's network namespace
    r["net_devices"] = sorted(l.split(":")[0].strip() for l in open("/proc/self/net/dev").read().splitlines()[2:])
except OSError:
    r["net_devices"] = []
print(json.dumps(r))
"""


def probe(uid: int = 60999, scratch_mb: int = 16, timeout_s: float = 30.0, packages: tuple | None = None) -> Probe:
    """Find out what isolation this machine allows, with the new root a pool with ``packages``
    (``sandbox.packages``; None: its default) would give its workers. Never raises; see ``Probe.ok``.
    ``features`` lists the allowed packages found (``packages``) and those not installed
    (``packages_missing``; not a problem: programs just cannot import them)."""
    jail = jail_path()
    if jail is None:
        return Probe(
            False,
            problems=[
                "the native jail is not built (reinstall with cmake and a C compiler: "
                "pip install -e . builds CMakeLists.txt)"
            ],
        )
    scratch = tempfile.mkdtemp(prefix="fastcrit-probe-")
    try:
        packages = _packages(packages)
        view = read_view(packages)
        argv = jailed_argv(jail, uid, scratch, scratch_mb, [sys.executable, "-I", "-c", _CHECK], packages)
        argv.insert(1, "--probe")
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Probe(False, problems=[f"running the jail failed: {exc}"], jail=jail)
        if p.returncode != 0:
            return Probe(False, problems=[p.stderr.strip() or f"jail exit status {p.returncode}"], jail=jail)
        feats = json.loads(p.stdout.strip().splitlines()[-1])
        argv.remove("--probe")
        try:
            q = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Probe(False, feats, [f"starting Python in the jail failed: {exc}"], jail)
        if q.returncode != 0:
            return Probe(False, feats, [f"Python in the jail failed: {q.stderr.strip()[-500:]}"], jail)
        inside = json.loads(q.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    feats.update(
        socket_refused=inside["socket_refused"],
        rootfs_readonly=inside["rootfs_readonly"],
        unprivileged=inside["uid"] != 0,
        net_devices=inside["net_devices"],
        packages=list(view.packages),
        packages_missing=list(view.missing),
    )
    problems = [f"{k} unavailable" for k in REQUIRED if not feats.get(k)]
    if not feats["socket_refused"]:
        problems.append("socket() is not refused inside the jail")
    if not feats["unprivileged"]:
        problems.append("the worker still runs as root")
    extra = [n for n in inside["site_packages"] if n not in view.in_site_dirs()]
    if extra:
        problems.append(f"site-packages inside the jail holds more than the allowed packages: {extra}")
    return Probe(not problems, feats, problems, jail)
