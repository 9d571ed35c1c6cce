"""Hostile programs (and weird tests) that once got a wrong verdict, a sandbox fault instead of a
verdict, or stalled a worker. Each runs with the jail where the machine allows it, else without
(isolation "none"): none of them needs the jail to show its defect."""

import importlib.util
import os
import time
import warnings

import pytest

from fastcrit.sandbox import Job, SandboxConfig, SyncSandboxPool, harness

# Finds the harness's record writer on the stack (any program can: it runs in the same process),
# as a program that wants to forge records would.
FIND_REPORTER = """
import sys
_fr, rep = sys._getframe(0), None
while _fr is not None and rep is None:
    rep = _fr.f_locals.get("reporter")
    _fr = _fr.f_back
"""

# Kills every other child of the worker (the judge among them), then goes on.
KILL_SIBLINGS = """
import os, signal
_pp = os.getppid()
for _k in open(f"/proc/{_pp}/task/{_pp}/children").read().split():
    if int(_k) != os.getpid():
        try:
            os.kill(int(_k), signal.SIGKILL)
        except OSError:
            pass
"""


@pytest.fixture(scope="module")
def lone_worker(jail_probe):
    """One worker, so that consecutive jobs share it (and its judge)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with SyncSandboxPool(workers=1, isolation="jail" if jail_probe.ok else "none") as p:
            yield p


def test_unprintable_assert_message_fails_only_its_test(pool):
    # ``assert x, value`` with an int too long for str(): the failed test's message used to raise
    # in the judge, which died, and took the job's other tests (here a pass) with it.
    job = Job(
        code="def f():\n    return 10 ** 5000\n",
        kind="assert",
        tests=["assert f() == 42, f()", "assert f() > 0", "assert f() == 1, {'v': f()}"],
        entry_point="f",
    )
    r = pool.run(job)
    assert [t.status for t in r.tests] == ["failed", "passed", "failed"], r.tests
    assert "cannot be shown" in r.tests[0].message


def test_program_that_kills_its_judge_gets_errors_not_a_sandbox_fault(pool):
    # The sweep after the execution reaped the dead judge and closed its socket; the worker then
    # read from it and raised ("sandbox worker error"), a fault of ours instead of a verdict.
    for code in (
        KILL_SIBLINGS + "def f():\n    return 42\n",
        "def f():\n" + _indent(KILL_SIBLINGS) + "    return 42\n",
    ):
        r = pool.run(Job(code=code, kind="assert", tests=["assert f() == 42"] * 2, entry_point="f", timeout_s=5))
        assert r.passed == 0 and all(t.status == "error" for t in r.tests), r.tests
        assert not any("sandbox worker error" in t.message for t in r.tests), r.tests
    # and the pool goes on judging
    ok = pool.run(Job(code="def f():\n    return 42\n", kind="assert", tests=["assert f() == 42"], entry_point="f"))
    assert ok.all_passed, ok.tests


def _indent(src: str) -> str:
    return "".join("    " + ln + "\n" for ln in src.strip("\n").splitlines())


@pytest.mark.parametrize("status", ["returned", "passed", "skipped", "timeout"])
def test_forged_load_record_is_tampering(pool, status):
    # A "code" record (the program did not load) carries its status to every remaining test; a
    # forged "returned" one had no value and raised in the worker, others passed through as is.
    code = FIND_REPORTER + f"rep.send({{'k': 'code', 's': {status!r}, 'm': 'x'}})\nimport os\nos._exit(0)\n"
    r = pool.run(Job(code=code, kind="call", tests=[[[1], 2], [[2], 3]], entry_point="f"))
    assert [t.status for t in r.tests] == ["error", "error"], r.tests
    assert all("tampered" in t.message for t in r.tests), r.tests


def test_many_records_do_not_wait_for_the_deadline(pool):
    # More verdict records than the judge's socket holds: the judge blocked writing them, which
    # nobody read while the execution lived, and the job waited for the test's time limit.
    n = 600
    job = Job(
        code="def f():\n    return 0\n",
        kind="assert",
        tests=["assert f() == 42, 'x' * 400"] * n,
        entry_point="f",
        timeout_s=10,
    )
    t0 = time.perf_counter()
    r = pool.run(job)
    dt = time.perf_counter() - t0
    assert [t.status for t in r.tests] == ["failed"] * n
    assert dt < 5, f"{n} failing tests took {dt:.1f}s"


def test_memory_a_job_left_in_the_judge_is_not_charged_to_the_next(lone_worker):
    # The judge outlives jobs. A program whose values made it map a few hundred MB (freed, kept
    # mapped) left the next jobs on that worker without the memory_mb they asked for: a correct
    # program then got "memory".
    good = Job(
        code="def f(n):\n    return list(range(n))\n",
        kind="assert",
        tests=["assert len(f(300000)) == 300000", "assert sorted(f(200000)) == list(range(200000))"],
        entry_point="f",
        memory_mb=128,
        timeout_s=20,
    )
    assert lone_worker.run(good).all_passed
    bloat = Job(
        code="def f():\n    return [[] for _ in range(3_000_000)]\n",
        kind="assert",
        tests=["x = f()\nassert 0"],
        entry_point="f",
        memory_mb=1024,
        timeout_s=20,
    )
    assert lone_worker.run(bloat).tests[0].status == "failed"
    after = lone_worker.run(good)
    assert after.all_passed, after.tests


def test_empty_test_is_an_error_not_a_pass(pool):
    # A test with no statement checks nothing: it passed every program that loaded.
    job = Job(
        code="def f():\n    return 0\n",
        kind="assert",
        tests=["", "  \n# only a comment\n", "assert f() == 0"],
        entry_point="f",
    )
    r = pool.run(job)
    assert [t.status for t in r.tests] == ["error", "error", "passed"], r.tests
    assert all("empty" in t.message for t in r.tests[:2])


def test_long_program_is_compiled_under_its_limits(pool):
    # Compiling takes about a second per 2 MB: done in the worker, it was outside every limit (a
    # 0.2 s test passed after seconds of compiling, for each stdio test again).
    assert harness.Prepared({"code": "x = 1\n" * 10}).code is not None
    long_code = "x = 1\n" * 600_000 + "print(input())\n"
    assert harness.Prepared({"code": long_code}).code is None  # left to the execution
    r = pool.run(Job(code=long_code, kind="stdio", tests=[["1\n", "1\n"]] * 2, timeout_s=0.2))
    assert r.passed == 0 and {t.status for t in r.tests} <= {"timeout", "memory"}, r.tests
    # A long program within its limits still runs (and one that does not compile still says why).
    ok = pool.run(Job(code="x = 1\n" * 6_000 + "print(input())\n", kind="stdio", tests=[["7\n", "7\n"]]))
    assert ok.all_passed, ok.tests
    bad = pool.run(Job(code="x = 1\n" * 6_000 + "def f(:\n", kind="call", tests=[[[], 1]], entry_point="f"))
    assert bad.tests[0].status == "error" and "SyntaxError" in bad.tests[0].message, bad.tests


def test_hostile_audit_leaves_no_stray_processes(jail_probe):
    """Nothing of the programs above is left: the pools' uids own no process but their workers
    and judges (jail only: without it everything runs as this user)."""
    if not jail_probe.ok:
        pytest.skip("without the jail executions run under this uid")
    stray = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/status") as fh:
                uid = int(next(ln for ln in fh if ln.startswith("Uid:")).split()[1])
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                cmd = fh.read()
        except (OSError, StopIteration):
            continue
        if uid >= 200000 and b"fastcrit.sandbox.workers" not in cmd:
            stray.append((p, cmd[:80]))
    assert not stray, stray


# The settings of the worker (first) and of its judge, as a program sees them: every one of them
# is inherited by the executions a worker forks. Of the address-space limit only the hard one: the
# judge sets its soft one itself for each assert job it serves (so it differs between a fresh judge
# and one that has served a job, and the attacks lower both).
SETTINGS_PROBE = """
import os, resource
pp = os.getppid()
kids = sorted(int(k) for k in open(f"/proc/{pp}/task/{pp}/children").read().split() if int(k) != os.getpid())
print([
    (os.getpriority(os.PRIO_PROCESS, p), os.sched_getscheduler(p), sorted(os.sched_getaffinity(p)),
     resource.prlimit(p, resource.RLIMIT_AS)[1], resource.prlimit(p, resource.RLIMIT_NOFILE))
    for p in [pp] + kids
])
"""

SETTINGS_ATTACKS = {
    "address_space": "resource.prlimit(p, resource.RLIMIT_AS, (256 << 20, 256 << 20))",
    "open_files": "resource.prlimit(p, resource.RLIMIT_NOFILE, (24, 24))",
    "nice": "os.setpriority(os.PRIO_PROCESS, p, 19)",
    "sched_idle": "os.sched_setscheduler(p, os.SCHED_IDLE, os.sched_param(0))",
    "one_cpu": "os.sched_setaffinity(p, {min(os.sched_getaffinity(p))})",
}


@pytest.mark.parametrize("judge_only", [False, True], ids=["worker", "judge"])
@pytest.mark.parametrize("attack", sorted(SETTINGS_ATTACKS))
def test_process_settings_a_program_changed_do_not_reach_later_jobs(lone_worker, attack, judge_only):
    # Same uid, so prlimit/setpriority/sched_setscheduler/sched_setaffinity on its worker and judge
    # were allowed, and undoable by neither (a hard limit cannot be raised again, nor a nice value
    # lowered): every later job on that worker ran with 256 MB, at nice 19, on one CPU ...
    probe = Job(code=SETTINGS_PROBE, kind="stdio", tests=[["", "-"]])
    before = lone_worker.run(probe).stdout
    targets = "[]" if judge_only else "[pp]"
    code = (
        "import os, resource\npp = os.getppid()\n"
        "kids = [int(k) for k in open(f'/proc/{pp}/task/{pp}/children').read().split() if int(k) != os.getpid()]\n"
        f"for p in {targets} + kids:\n    {SETTINGS_ATTACKS[attack]}\n"
        "def f():\n    return 42\n"
    )
    r = lone_worker.run(Job(code=code, kind="assert", tests=["assert f() == 42"], entry_point="f"))
    if not judge_only:  # the worker cannot be put back: the job scores 0 and the worker is replaced
        assert r.status == "error" and "could not restore" in r.tests[0].message, r.tests
    after = lone_worker.run(probe).stdout
    assert after == before
    # and a job that needs memory and open files in the program and in the judge still passes
    ok = lone_worker.run(
        Job(
            code="def f(n):\n    return len(bytearray(n)) + len([open('/dev/null') for _ in range(40)])\n",
            kind="assert",
            tests=["assert f(300 << 20) == (300 << 20) + 40 and len(bytearray(300 << 20)) > 0"],
            entry_point="f",
            timeout_s=20,
        )
    )
    assert ok.all_passed, ok.tests


def test_stdio_job_stdout_is_bounded_over_its_tests(jail_probe):
    # Each passing stdio test's stdout travels to the pool for comparison; 1 MiB a test over
    # hundreds of tests was hundreds of MB per job in the worker and the pool. The job's together
    # take max_result_bytes, as call and assert jobs' values do; a test past it is output_limit.
    big = "import sys\nsys.stdout.write('7' * 300_000 + '\\n')\n"
    tests = [{"input": "", "output": "7" * 300_000} for _ in range(5)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        isolation = "jail" if jail_probe.ok else "none"
        cfg = SandboxConfig(workers=1, isolation=isolation, max_result_bytes=1 << 20)
        with SyncSandboxPool(cfg) as p:
            r = p.run(Job(code=big, kind="stdio", tests=tests))
            assert [t.status for t in r.tests] == ["passed"] * 3 + ["output_limit"] * 2, r.tests
            assert "max_result_bytes" in r.tests[3].message
            # within the budget, every test is compared as before
            ok = p.run(Job(code=big, kind="stdio", tests=tests[:3]))
            assert [t.status for t in ok.tests] == ["passed"] * 3


# A test that uses a module it did not import (``math.isclose`` where the program imported math)
# used to get the program's object under that name: a fake ``math`` or a patched numpy decided
# the check. And a program's StopIteration, raised inside map(), ended the test's loop as if every
# case had been checked.
CHECKER_ATTACKS = {
    "fake_math_object": (
        "class M:\n    isclose = staticmethod(lambda *a, **k: True)\nmath = M()\ndef f(): return 0\n",
        "assert math.isclose(f(), 42)",
    ),
    "fake_math_module": (
        "import types\nmath = types.ModuleType('mymath')\nmath.isclose = lambda *a, **k: True\ndef f(): return 0\n",
        "assert math.isclose(f(), 42)",
    ),
    "other_module_as_math": (
        "import types\nmath = types.ModuleType('fastcrit.sandbox.judge')\ndef f(): return 0\n",
        "assert math.Refused",
    ),
    "patched_numpy": (
        "import numpy as np\nnp.allclose = lambda *a, **k: True\ndef f(): return [0, 0]\n",
        "assert np.allclose(f(), [1, 2])",
    ),
    "stop_iteration_in_all_map": (
        "def f(x):\n    raise StopIteration\n",
        "assert all(map(lambda x: f(x) == 2 * x, [1, 2, 3]))",
    ),
    "stop_iteration_in_for_map": (
        "class S(StopIteration):\n    pass\ndef f(x):\n    raise S\n",
        "for a, b in zip(map(f, [1, 2]), [2, 4]):\n    assert a == b",
    ),
}


@pytest.mark.parametrize("attack", sorted(CHECKER_ATTACKS))
def test_program_cannot_supply_the_tests_checker(pool, attack):
    code, test = CHECKER_ATTACKS[attack]
    if "numpy" in code:
        pytest.importorskip("numpy")
    r = pool.run(Job(code=code, kind="assert", tests=[test], entry_point="f", timeout_s=5))
    assert r.passed == 0 and r.tests[0].status in ("failed", "error"), r.tests


def test_modules_and_iterators_of_honest_programs_still_work(pool):
    jobs = [
        ("import math\ndef f(): return math.pi\n", "assert math.isclose(f(), 3.14159265, rel_tol=1e-6)"),
        ("def random(n): return n * 2\ndef f(): return 0\n", "assert random(3) == 6"),  # a stdlib name, called
        ("def f():\n    yield 1\n    yield 2\n", "it = iter(f())\nassert list(it) == [1, 2]\nassert next(it, 7) == 7"),
        (
            "class It:\n    n = 0\n    def __iter__(s): return s\n    def __next__(s):\n        s.n += 1\n"
            "        if s.n > 2: raise StopIteration\n        return s.n\ndef f(): return It()\n",
            "assert list(f()) == [1, 2]",
        ),
    ]
    if importlib.util.find_spec("numpy") is not None:
        jobs.append(("import numpy as np\ndef f(): return [1.0, 2.0]\n", "assert np.allclose(f(), [1, 2])"))
    rs = pool.run_many([Job(code=c, kind="assert", tests=[t], entry_point="f", timeout_s=5) for c, t in jobs])
    assert all(r.all_passed for r in rs), [r.tests for r in rs]
