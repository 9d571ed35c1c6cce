"""State that outlives a job, and the result channel.

A warm worker runs one program after another. Nothing one execution leaves behind may reach the
next: not its files (HOME, TMPDIR, the current directory), not its processes, not IPC objects, not
a broken scratch directory. A program that damages its worker scores 0 and the jobs after it run
as if nothing happened. Every pool here has one worker, so consecutive jobs share it.
"""
import pytest

from fastcrit.sandbox import Job, SandboxConfig, SyncSandboxPool


@pytest.fixture(scope="module")
def one_worker(jail_probe):
    if not jail_probe.ok:
        pytest.skip(f"these tests need the jail, which cannot be set up here: {jail_probe.describe()}")
    with SyncSandboxPool(SandboxConfig(workers=1)) as p:
        yield p


def worker_pid(pool) -> int:
    (pid,) = pool.pool._worker_pids()
    return pid


HONEST_WRITER = '''
import os
def f(n):
    with open("out.txt", "w") as fh:
        fh.write("x" * n)
    with open(os.path.join(os.environ["HOME"], ".cache"), "w") as fh:
        fh.write("y" * n)
    return os.path.getsize("out.txt")
'''
HONEST_STDIO = "import sys\nopen('input.copy', 'w').write(sys.stdin.read())\nprint(open('input.copy').read().strip())\n"


def next_jobs_pass(pool):
    """Honest programs that write files in their scratch directory, of each kind."""
    jobs = [Job(code=HONEST_WRITER, kind="call", tests=[[[1 << 20], 1 << 20]], entry_point="f"),
            Job(code=HONEST_WRITER, kind="assert", tests=["assert f(10) == 10"], entry_point="f"),
            Job(code=HONEST_WRITER + "assert f(3) == 3\n", kind="assert", tests=["assert f(5) == 5"]),
            Job(code=HONEST_STDIO, kind="stdio", tests=[["hello\n", "hello"], ["again\n", "again"]])]
    bad = [(r.status, r.message, r.tests) for r in (pool.run(j) for j in jobs) if not r.all_passed]
    assert not bad, bad


BIG = '''
def f(n):
    return list(range(n))
'''


def test_large_return_values_pass(one_worker):
    """A correct program returning ~1 MiB of JSON (far past a pipe's 64 KiB) passes, as a call and
    as a data-only assert judged in the pool."""
    n = 150_000  # "0, 1, ..., 149999" is ~1 MiB of JSON
    # A generous limit: the value must be read as it is written, long before the deadline (a
    # worker that reads only at deadlines returns, if at all, after the whole 30 s).
    r = one_worker.run(Job(code=BIG, kind="call", tests=[[[n], list(range(n))], [[3], [0, 1, 2]]],
                           entry_point="f", timeout_s=30))
    assert r.all_passed and r.elapsed_s < 15, (r.elapsed_s, r.tests)
    r = one_worker.run(Job(code=BIG, kind="assert", entry_point="f", timeout_s=30,
                           tests=[f"assert f({n}) == list(range({n}))", "assert f(2) == [0, 1]"]))
    assert r.all_passed and r.judged_in == "pool" and r.elapsed_s < 15, (r.elapsed_s, r.judged_in, r.tests)


def test_return_value_over_the_limit_is_output_limit(one_worker):
    """A value past the result channel's limit (16 MiB) is ``output_limit`` as soon as the worker
    has read that much: not a timeout, not a hang. The other tests still run."""
    code = "def f(n):\n    return 'x' * n\n"
    limit = 16 << 20  # the documented default (docs/sandbox.md)
    r = one_worker.run(Job(code=code, kind="call", tests=[[[limit + 1024], "x"], [[2], "xx"]], entry_point="f",
                           timeout_s=60, memory_mb=1024))
    assert [t.status for t in r.tests] == ["output_limit", "passed"], r.tests
    assert "return values over" in r.tests[0].message, r.tests[0].message
    assert SandboxConfig().max_result_bytes == limit
    next_jobs_pass(one_worker)


def test_big_results_do_not_leave_the_worker_bigger(one_worker):
    """The worker forks every execution, copying page tables for all it holds: a job's big
    return values must not leave it grown for the jobs after it."""
    def rss_mb():
        with open(f"/proc/{worker_pid(one_worker)}/status") as fh:
            return next(int(ln.split()[1]) for ln in fh if ln.startswith("VmRSS:")) / 1024

    one_worker.run(Job(code="def f():\n    return 1\n", kind="call", tests=[[[], 1]], entry_point="f"))
    before = rss_mb()
    n = 1_500_000  # ~10 MiB of JSON per value
    for _ in range(3):
        r = one_worker.run(Job(code=BIG, kind="call", tests=[[[n], list(range(n))]], entry_point="f", timeout_s=30))
        assert r.all_passed, r.tests
    assert rss_mb() < before + 32, (before, rss_mb())
