"""Python side of the native jail (``native/jail.c``, built into ``fastcrit/sandbox/_native/bin``).

``probe()`` runs the jail once in ``--probe`` mode and then starts a real worker under it and
checks, from inside, that sockets are refused and that the root filesystem is read-only. The pool
refuses untrusted code when this fails, unless the user asked for ``isolation: none``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

_HERE = os.path.dirname(os.path.abspath(__file__))
REQUIRED = ("netns", "mntns", "pidns", "no_new_privs", "seccomp")


class IsolationUnavailable(RuntimeError):
    """The jail cannot be set up here; the message says what failed and how to opt out."""


def jail_path() -> str | None:
    """The built jail: the package's _native/bin first, then $FASTCRIT_JAIL, then PATH."""
    cands = [os.path.join(_HERE, "_native", "bin", "fastcrit-jail"), os.environ.get("FASTCRIT_JAIL", "")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return shutil.which("fastcrit-jail")


def expose_paths() -> list[str]:
    """What the worker's dropped uid must be able to reach: the interpreter, the standard
    library, site-packages and fastcrit's own code."""
    import fastcrit

    paths = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)),
             os.path.dirname(os.path.dirname(os.path.abspath(fastcrit.__file__)))}
    for p in sys.path:
        if p and os.path.isdir(p):
            paths.add(os.path.abspath(p))
    return sorted(os.path.realpath(p) for p in paths)


def worker_argv(cfg_json: str) -> list[str]:
    """The worker's command line. ``-I`` keeps the pool's environment out, PYTHONPATH included,
    so the directory fastcrit was imported from is put first on the worker's path: the worker
    runs the same code as the pool, not whatever copy is installed (an editable install of
    another checkout, say)."""
    import fastcrit

    root = os.path.dirname(os.path.dirname(os.path.abspath(fastcrit.__file__)))
    boot = f"import sys; sys.path.insert(0, {root!r}); from fastcrit.sandbox.workers import main; sys.exit(main())"
    return [sys.executable, "-I", "-c", boot, cfg_json]


def jailed_argv(jail: str, uid: int, scratch: str, scratch_mb: int, inner: list[str]) -> list[str]:
    argv = [jail, "--uid", str(uid), "--scratch", scratch, "--scratch-mb", str(scratch_mb)]
    for p in expose_paths():
        argv += ["--expose", p]
    return argv + ["--"] + inner


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
            f"; problems: {'; '.join(self.problems)}" if self.problems else "")


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
try:  # /proc is the jail's own, so this lists the interfaces of the jail's network namespace
    r["net_devices"] = sorted(l.split(":")[0].strip() for l in open("/proc/self/net/dev").read().splitlines()[2:])
except OSError:
    r["net_devices"] = []
print(json.dumps(r))
"""


def probe(uid: int = 60999, scratch_mb: int = 16, timeout_s: float = 30.0) -> Probe:
    """Find out what isolation this machine allows. Never raises; see ``Probe.ok``."""
    jail = jail_path()
    if jail is None:
        return Probe(False, problems=["the native jail is not built (reinstall with cmake and a C compiler: "
                                      "pip install -e . builds CMakeLists.txt)"])
    scratch = tempfile.mkdtemp(prefix="fastcrit-probe-")
    try:
        argv = jailed_argv(jail, uid, scratch, scratch_mb, [sys.executable, "-I", "-c", _CHECK])
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
            q = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                               env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Probe(False, feats, [f"starting Python in the jail failed: {exc}"], jail)
        if q.returncode != 0:
            return Probe(False, feats, [f"Python in the jail failed: {q.stderr.strip()[-500:]}"], jail)
        inside = json.loads(q.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    feats.update(socket_refused=inside["socket_refused"], rootfs_readonly=inside["rootfs_readonly"],
                 unprivileged=inside["uid"] != 0, net_devices=inside["net_devices"])
    problems = [f"{k} unavailable" for k in REQUIRED if not feats.get(k)]
    if not feats["socket_refused"]:
        problems.append("socket() is not refused inside the jail")
    if not feats["unprivileged"]:
        problems.append("the worker still runs as root")
    return Probe(not problems, feats, problems, jail)
