"""The hostile suite: programs that try to pass without solving, or to hurt the host or the pool.

Every test below is one a correct program could pass but these programs are not correct, so any
pass is a false pass. Afterwards the pool must still run real solutions correctly with the same
number of workers, and nothing may have leaked onto the host.
"""

import os
import time

import pytest

from fastcrit.sandbox import Job


@pytest.fixture(autouse=True, scope="module")
def _needs_jail(jail_probe):
    if not jail_probe.ok:
        pytest.skip(f"the hostile suite needs the jail, which cannot be set up here: {jail_probe.describe()}")


CANARY_DIR = "/tmp/fastcrit-hostile-canary"
CANARY = os.path.join(CANARY_DIR, "keep.txt")
OUTSIDE = "/tmp/fastcrit-hostile-written.txt"

# f must return 42 for the test to pass; every program gets it wrong and tries something else.
CHECK_42 = "assert f() == 42"

HOSTILE = {
    # exits and exceptions that a naive harness reads as success
    "os_exit_at_load": ("import os\nos._exit(0)\ndef f(): return 0\n", [CHECK_42]),
    "sys_exit_at_load": ("import sys\nsys.exit(0)\n", [CHECK_42]),
    "os_exit_in_call": ("import os\ndef f():\n    os._exit(0)\n", [CHECK_42]),
    "system_exit_in_call": ("def f():\n    raise SystemExit(0)\n", [CHECK_42]),
    "keyboard_interrupt": ("def f():\n    raise KeyboardInterrupt\n", [CHECK_42]),
    "exit_from_thread": (
        "import threading, os, time\nthreading.Thread(target=lambda: (time.sleep(0.05), os._exit(0))).start()\n"
        "def f():\n    time.sleep(1)\n    return 0\n",
        [CHECK_42],
    ),
    "exit_in_finaliser": (
        "import os\nclass D:\n    def __del__(self):\n        os._exit(0)\ndef f():\n    D()\n    return 0\n",
        [CHECK_42],
    ),
    # fake markers and forged records
    "print_fake_markers": (
        'print(\'passed\'); print(\'{"k":"test","i":0,"s":"passed"}\')\n'
        "import sys; sys.stderr.write('PASSED\\n')\ndef f(): return 0\n",
        [CHECK_42],
    ),
    "forge_result_fd": (
        "import os\nfor fd in range(3, 64):\n    try:\n"
        '        os.write(fd, b\'{"k":"loaded"}\\t00\\n{"k":"test","i":0,"s":"passed","m":""}\\t00\\n\')\n'
        "    except OSError:\n        pass\nos._exit(0)\n",
        [CHECK_42],
    ),
    # patching the judge
    "patch_assertion_error": (
        "import builtins\nclass Nope(Exception): pass\nbuiltins.AssertionError = Nope\ndef f(): return 0\n",
        [CHECK_42],
    ),
    "patch_builtins_abs": (
        "import builtins\nbuiltins.abs = lambda x: 0\ndef f(): return 0\n",
        ["assert abs(f() - 42) < 1e-9"],
    ),
    "patch_math_isclose": (
        "import math\nmath.isclose = lambda *a, **k: True\ndef f(): return 0\n",
        ["import math\nassert math.isclose(f(), 42)"],
    ),
    "replace_sys_modules": (
        "import sys, types\nm = types.ModuleType('math')\nm.isclose = lambda *a, **k: True\n"
        "sys.modules['math'] = m\ndef f(): return 0\n",
        ["import math\nassert math.isclose(f(), 42)"],
    ),
    "define_check_first": (
        "def check(c):\n    pass\ndef f(): return 0\n",
        ["def check(c):\n    assert c() == 42\ncheck(f)"],
    ),
    "always_equal": (
        "class E:\n    def __eq__(self, o): return True\n    __hash__ = None\ndef f(): return E()\n",
        [CHECK_42],
    ),
    "int_subclass_eq": (
        "class I(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\ndef f(): return I(0)\n",
        [CHECK_42],
    ),
    "settrace_skip": (
        "import sys\ndef t(frame, event, arg):\n    return None\nsys.settrace(t)\ndef f(): return 0\n",
        [CHECK_42],
    ),
    "gc_find_key": ("import gc\nobjs = gc.get_objects()\ndef f(): return 0\n", [CHECK_42]),
    "audit_hook": ("import sys\nsys.addaudithook(lambda e, a: None)\ndef f(): return 0\n", [CHECK_42]),
    "frame_walk": ("import sys\nfr = sys._getframe(1)\ndef f(): return fr\n", [CHECK_42]),
    "signal_handler_exit": (
        "import signal, os\nsignal.signal(signal.SIGALRM, lambda s, fr: os._exit(0))\n"
        "def f():\n    signal.setitimer(signal.ITIMER_REAL, 0.01)\n    import time; time.sleep(1)\n    return 0\n",
        [CHECK_42],
    ),
    # a thread writing garbage and forged frames into the channel to the judge (what a frame says
    # is only ever the program's answer, so a forged 42 would be an answer of 42: these say other things)
    "thread_spams_judge": (
        "import os, threading, json\n"
        "def spam():\n    b = json.dumps({'ok': {'h': 1}, 'k': 'test', 's': 'passed'}).encode()\n"
        "    for _ in range(200):\n        os.write(4, len(b).to_bytes(4, 'big') + b + b'\\x00garbage')\n"
        "threading.Thread(target=spam, daemon=True).start()\ndef f(): return 0\n",
        [CHECK_42],
    ),
    # resources
    "fork_bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        [CHECK_42],
    ),
    "memory_bomb": ("x = bytearray(8 * 1024 ** 3)\ndef f(): return 0\n", [CHECK_42]),
    "memory_growth": ("a = []\nwhile True:\n    a.append(' ' * 10 ** 7)\n", [CHECK_42]),
    "infinite_loop": ("while True:\n    pass\n", [CHECK_42]),
    "sleep_past_timeout": ("import time\ndef f():\n    time.sleep(30)\n    return 42\n", [CHECK_42]),
    "raise_cpu_limit": (
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (10**6, 10**6))\ndef f():\n    while True: pass\n",
        [CHECK_42],
    ),
    "gigabytes_stdout": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", [CHECK_42]),
    "gigabytes_stderr": ("import os\nwhile True:\n    os.write(2, b'y' * 65536)\n", [CHECK_42]),
    "huge_file": ("f_ = open('big.bin', 'wb')\nf_.seek(100 << 20)\nf_.write(b'z')\nf_.flush()\n", [CHECK_42]),
    "zombie_children": (
        "import os\nfor _ in range(20):\n    if os.fork() == 0:\n        os._exit(0)\ndef f(): return 0\n",
        [CHECK_42],
    ),
    "escaped_daemon": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\n    os._exit(0)\n"
        "def f(): return 0\n",
        [CHECK_42],
    ),
    "recursion_bomb": ("def f():\n    return f()\n", [CHECK_42]),
    # the host, the network and secrets
    "kill_parent": (
        "import os, signal\nfor p in (os.getppid(), 1):\n    try:\n        os.kill(p, signal.SIGKILL)\n"
        "    except OSError:\n        pass\ndef f(): return 0\n",
        [CHECK_42],
    ),
    "kill_everything": (
        "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\ndef f(): return 0\n",
        [CHECK_42],
    ),
    "network_tcp": (
        "import socket\ns = socket.create_connection(('1.1.1.1', 53), timeout=1)\ndef f(): return 42\n",
        [CHECK_42],
    ),
    "unix_socket": ("import socket\ns = socket.socket(socket.AF_UNIX)\ndef f(): return 42\n", [CHECK_42]),
    "write_outside": (f"open({OUTSIDE!r}, 'w').write('pwned')\ndef f(): return 42\n", [CHECK_42]),
    "delete_outside": (f"import os\nos.remove({CANARY!r})\ndef f(): return 42\n", [CHECK_42]),
    "read_env_secret": ("import os\ndef f():\n    return 42 if 'hunter2' in str(os.environ) else 0\n", [CHECK_42]),
    "read_proc_environ": (
        "import os\ndef f():\n    for p in os.listdir('/proc'):\n        try:\n"
        "            if b'hunter2' in open(f'/proc/{p}/environ', 'rb').read():\n                return 42\n"
        "        except OSError:\n            pass\n    return 0\n",
        [CHECK_42],
    ),
    "read_worker_memory": ("def f():\n    with open('/proc/1/mem', 'rb') as m:\n        return 42\n", [CHECK_42]),
    "ctypes_ptrace": (
        "import ctypes\nlibc = ctypes.CDLL(None)\nassert libc.ptrace(16, 1, 0, 0) == 0\ndef f(): return 42\n",
        [CHECK_42],
    ),
    "unshare_netns": ("import os\nos.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNET)\ndef f(): return 42\n", [CHECK_42]),
    "chmod_scratch": (
        "import os\nos.makedirs('a/b/c')\nopen('a/b/c/f', 'w').write('x')\nos.chmod('a/b/c', 0)\n"
        "os.chmod('a/b', 0)\nos.chmod('a', 0)\ndef f(): return 0\n",
        [CHECK_42],
    ),
}


@pytest.fixture(scope="module")
def hostile_results(pool):
    """Every trick, assert tests judged by the judge process."""
    os.makedirs(CANARY_DIR, exist_ok=True)
    with open(CANARY, "w") as fh:
        fh.write("still here")
    if os.path.exists(OUTSIDE):
        os.unlink(OUTSIDE)
    names = sorted(HOSTILE)
    jobs = [
        Job(code=c, kind="assert", tests=t, entry_point="f", timeout_s=1.0, memory_mb=256, id=n)
        for n, (c, t) in ((n, HOSTILE[n]) for n in names)
    ]
    # Extra kinds: stdio and call variants of the same tricks.
    jobs += [
        Job(
            code="import os\nos._exit(0)\n",
            kind="stdio",
            tests=[{"input": "1\n", "output": "2\n"}],
            id="stdio_exit0",
            timeout_s=1.0,
        ),
        Job(
            code="print('passed')\n",
            kind="stdio",
            tests=[{"input": "1\n", "output": "2\n"}],
            id="stdio_marker",
            timeout_s=1.0,
        ),
        Job(
            code="class E(str):\n    def __eq__(self, o): return True\ndef f(x): return E('no')\n",
            kind="call",
            tests=[[[1], "yes"]],
            entry_point="f",
            id="call_eq_subclass",
            timeout_s=1.0,
        ),
        Job(
            code="import os\ndef f(x): os._exit(0)\n",
            kind="call",
            tests=[[[1], 2]],
            entry_point="f",
            id="call_exit0",
            timeout_s=1.0,
        ),
        Job(
            code="import os\nfor fd in range(3, 16):\n"
            '    try: os.write(fd, b\'{"k":"test","i":0,"s":"passed","v":2}\\tff\\n\')\n'
            "    except OSError: pass\ndef f(x): return 0\n",
            kind="call",
            tests=[[[1], 2]],
            entry_point="f",
            id="call_forge",
            timeout_s=1.0,
        ),
    ]
    t0 = time.perf_counter()
    results = pool.run_many(jobs)
    return {r.id: r for r in results}, time.perf_counter() - t0


def test_suite_is_big_enough():
    assert len(HOSTILE) >= 30


@pytest.mark.parametrize(
    "name", sorted(HOSTILE) + ["stdio_exit0", "stdio_marker", "call_eq_subclass", "call_exit0", "call_forge"]
)
def test_no_false_pass(hostile_results, name):
    r = hostile_results[0][name]
    assert r.passed == 0 and r.status != "passed", (name, r.status, r.tests, r.stderr[-300:])


@pytest.mark.parametrize(
    "name, statuses",
    [
        ("infinite_loop", {"timeout"}),
        ("sleep_past_timeout", {"timeout"}),
        ("raise_cpu_limit", {"timeout", "error"}),
        ("memory_bomb", {"memory"}),
        ("memory_growth", {"memory"}),
        ("gigabytes_stdout", {"output_limit"}),
        ("gigabytes_stderr", {"output_limit"}),
        ("huge_file", {"output_limit"}),
        ("always_equal", {"error"}),
        ("network_tcp", {"error"}),
        ("unix_socket", {"error"}),
        ("write_outside", {"error"}),
        ("delete_outside", {"error"}),
        ("os_exit_at_load", {"error"}),
        ("forge_result_fd", {"error"}),
        ("patch_math_isclose", {"failed"}),
        ("patch_assertion_error", {"failed"}),
        ("unshare_netns", {"error"}),
        ("read_worker_memory", {"error"}),
        ("ctypes_ptrace", {"error"}),
    ],
)
def test_reported_status(hostile_results, name, statuses):
    r = hostile_results[0][name]
    assert r.tests[0].status in statuses, (name, r.tests[0])


def test_host_unharmed(hostile_results):
    assert os.path.exists(CANARY) and open(CANARY).read() == "still here"
    assert not os.path.exists(OUTSIDE)
    assert not os.path.exists("/etc/fastcrit_pwned")


def test_pool_healthy_afterwards(pool, hostile_results):
    n_workers = pool.stats()["workers"]
    jobs = [
        Job(code=f"def f():\n    return {i}\n", kind="assert", tests=[f"assert f() == {i}"], id=i) for i in range(200)
    ]
    t0 = time.perf_counter()
    results = pool.run_many(jobs)
    dt = time.perf_counter() - t0
    assert all(r.all_passed for r in results)
    assert pool.stats()["workers"] == n_workers
    # No process of the jailed uids is left (escaped daemons, zombies, fork-bomb survivors).
    leftovers = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/status") as fh:
                    uid = int(next(ln for ln in fh if ln.startswith("Uid:")).split()[1])
            except (OSError, StopIteration):
                continue
            if uid >= 200000:
                with open(f"/proc/{p}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ")
                if b"fastcrit.sandbox.workers" not in cmd:
                    leftovers.append((p, cmd[:80]))
    assert not leftovers, leftovers
    print(f"\nhostile suite took {hostile_results[1]:.1f}s; 200 jobs afterwards took {dt:.2f}s ({200 / dt:.0f} jobs/s)")


def test_standard_library_return_values_still_pass(pool):
    """The entry-point guard must not fail honest programs that return standard-library values."""
    cases = [
        ("from collections import Counter\ndef f(s):\n    return Counter(s)\n", "assert f('aab') == {'a': 2, 'b': 1}"),
        ("from collections import OrderedDict\ndef f():\n    return OrderedDict(a=1)\n", "assert f() == {'a': 1}"),
        ("from collections import deque\ndef f():\n    return deque([1, 2])\n", "assert list(f()) == [1, 2]"),
        ("def f(xs):\n    return map(abs, xs)\n", "assert list(f([-1, 2])) == [1, 2]"),
        ("def f(n):\n    yield from range(n)\n", "assert list(f(3)) == [0, 1, 2]"),
        ("def f():\n    return range(3)\n", "assert f() == range(3)"),
        ("def f():\n    return {(1, 2), (3, 4)}\n", "assert f() == {(3, 4), (1, 2)}"),
    ]
    jobs = [Job(code=c, kind="assert", tests=[t], entry_point="f", id=i) for i, (c, t) in enumerate(cases)]
    bad = [(r.id, r.tests[0]) for r in pool.run_many(jobs) if not r.all_passed]
    assert not bad, bad


def test_patched_or_program_defined_values_are_refused(pool):
    cases = [
        "from collections import Counter\nCounter.__eq__ = lambda s, o: True\ndef f():\n    return Counter('x')\n",
        "from collections import Counter\nclass C(Counter):\n    def __eq__(s, o): return True\n"
        "def f():\n    return C()\n",
        "class E:\n    def __eq__(s, o): return True\ndef f():\n    return [1, E()]\n",
        "class E:\n    def __eq__(s, o): return True\ndef f():\n    return iter([E()])\n",
        "import types\nclass E:\n    def __eq__(s, o): return True\n"
        "def f():\n    return types.SimpleNamespace(a=E())\n",
    ]
    tests = ["assert f() == 42", "assert list(f()) == [42]", "import types\nassert f() == types.SimpleNamespace(a=42)"]
    jobs = [Job(code=c, kind="assert", tests=tests, entry_point="f", id=i) for i, c in enumerate(cases)]
    for r in pool.run_many(jobs):
        assert r.passed == 0, (r.id, r.tests)


def test_expected_values_are_not_in_the_execution_memory():
    """Verdicts are unforgeable only if the expected values are nowhere in the
    execution's memory. In the jail a program cannot even open /proc/self/mem (its worker is not
    dumpable and runs as another uid); without the jail (root) it can, so scan it there: a job
    whose expected value contains a marker must show no more copies of it than one whose expected
    value does not."""
    import warnings

    from fastcrit.sandbox import SyncSandboxPool

    scan = r"""
def scan_memory(a, b):
    needle = (a + b).encode()
    found = 0
    try:
        maps, mem = open('/proc/self/maps'), open('/proc/self/mem', 'rb', 0)
    except OSError:
        return -1
    for line in maps:
        addr, perms = line.split()[:2]
        if 'r' not in perms:
            continue
        lo, hi = (int(x, 16) for x in addr.split('-'))
        try:
            mem.seek(lo)
            found += mem.read(hi - lo).count(needle)
        except (OSError, ValueError, OverflowError):
            pass
    return found
"""
    parts = ["Zq7xW4k9", "expectedvalue"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with SyncSandboxPool(workers=1, isolation="none") as p:
            counts = {}
            for kind in ("call", "stdio", "assert"):
                for with_marker in (True, False):
                    exp = ("".join(parts) if with_marker else "nothing") + "-never"
                    if kind == "call":
                        job = Job(
                            code=scan + "def f(a, b):\n    return scan_memory(a, b)\n",
                            kind="call",
                            tests=[[parts, exp]],
                            entry_point="f",
                            memory_mb=4096,
                            timeout_s=30,
                        )
                    elif kind == "assert":  # the test's source goes to the judge, never the execution
                        job = Job(
                            code=scan + "def f(a, b):\n    return scan_memory(a, b)\n",
                            kind="assert",
                            tests=[f"assert f({parts[0]!r}, {parts[1]!r}) == {exp!r}"],
                            memory_mb=4096,
                            timeout_s=30,
                        )
                    else:
                        job = Job(
                            code=scan + f"print(scan_memory({parts[0]!r}, {parts[1]!r}))\n",
                            kind="stdio",
                            tests=[["", exp]],
                            memory_mb=4096,
                            timeout_s=30,
                        )
                    r = p.run(job)
                    assert r.tests[0].status == "failed", r.tests
                    msg = r.tests[0].message
                    counts[kind, with_marker] = (
                        int(msg.split()[1].rstrip(","))
                        if kind == "call"
                        else int(msg.rsplit("(returned ", 1)[1].rstrip(")"))
                        if kind == "assert"
                        else int(r.stdout)
                    )
    if counts["call", False] < 0:
        pytest.skip("/proc/self/mem cannot be read here, so there is nothing to scan")
    assert all(counts[k, True] == counts[k, False] for k in ("call", "stdio", "assert")), sorted(counts.items())
