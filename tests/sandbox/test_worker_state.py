"""State that outlives a job, and the result channel.

A warm worker runs one program after another. Nothing one execution leaves behind may reach the
next: not its files (HOME, TMPDIR, the current directory), not its processes, not IPC objects, not
a broken scratch directory. A program that damages its worker scores 0 and the jobs after it run
as if nothing happened. Every pool here has one worker, so consecutive jobs share it.
"""

import os
import time

import pytest

from fastcrit.sandbox import Job, SandboxConfig, SyncSandboxPool


@pytest.fixture(scope="module")
def one_worker(jail_probe):
    if not jail_probe.ok:
        pytest.skip(f"these tests need the jail, which cannot be set up here: {jail_probe.describe()}")
    # A small scratch tmpfs, so that filling it is quick.
    with SyncSandboxPool(SandboxConfig(workers=1, scratch_mb=32)) as p:
        yield p


def worker_pid(pool) -> int:
    (pid,) = pool.pool._worker_pids()
    return pid


WRITE_EVERYWHERE = """
import os, tempfile
def f():
    for d in (os.environ["HOME"], os.environ["TMPDIR"], tempfile.gettempdir(), os.getcwd()):
        with open(os.path.join(d, "carried-over.txt"), "w") as fh:
            fh.write("job 1 was here")
    return 1
"""

LOOK_EVERYWHERE = """
import os, tempfile
def f():
    found = []
    for d in {os.environ["HOME"], os.environ["TMPDIR"], tempfile.gettempdir(), os.getcwd(),
              os.path.dirname(os.getcwd())}:
        for root, dirs, files in os.walk(d):
            found += [os.path.join(root, n) for n in files if n.startswith("carried-over")]
    return sorted(set(found))
"""


def test_files_do_not_reach_the_next_job(one_worker):
    first = one_worker.run(Job(code=WRITE_EVERYWHERE, kind="call", tests=[[[], 1]], entry_point="f"))
    assert first.all_passed, first.tests
    second = one_worker.run(Job(code=LOOK_EVERYWHERE, kind="call", tests=[[[], []]], entry_point="f"))
    assert second.all_passed, second.tests


def test_tests_of_one_stdio_job_get_fresh_scratch_each(one_worker):
    """Each test of a stdio job is its own execution, with its own empty scratch directory."""
    code = (
        "import os\nif os.path.exists('state'):\n    print('second')\nelse:\n"
        "    open('state', 'w').write('x')\n    print('first')\n"
    )
    r = one_worker.run(Job(code=code, kind="stdio", tests=[["", "first"], ["", "first"], ["", "first"]]))
    assert r.all_passed, r.tests


HONEST_WRITER = """
import os
def f(n):
    with open("out.txt", "w") as fh:
        fh.write("x" * n)
    with open(os.path.join(os.environ["HOME"], ".cache"), "w") as fh:
        fh.write("y" * n)
    return os.path.getsize("out.txt")
"""
HONEST_STDIO = "import sys\nopen('input.copy', 'w').write(sys.stdin.read())\nprint(open('input.copy').read().strip())\n"


def next_jobs_pass(pool):
    """Honest programs that write files in their scratch directory, of each kind."""
    jobs = [
        Job(code=HONEST_WRITER, kind="call", tests=[[[1 << 20], 1 << 20]], entry_point="f"),
        Job(code=HONEST_WRITER, kind="assert", tests=["assert f(10) == 10"], entry_point="f"),
        Job(code=HONEST_WRITER + "assert f(3) == 3\n", kind="assert", tests=["assert f(5) == 5"]),
        Job(code=HONEST_STDIO, kind="stdio", tests=[["hello\n", "hello"], ["again\n", "again"]]),
    ]
    bad = [(r.status, r.message, r.tests) for r in (pool.run(j) for j in jobs) if not r.all_passed]
    assert not bad, bad


SABOTEURS = {
    "chmod 0500 HOME": "import os\nos.chmod(os.environ['HOME'], 0o500)\n",
    "chmod 0 cwd": "import os\nos.chmod('.', 0)\n",
    "xattr on HOME": "import os\nos.setxattr(os.environ['HOME'], 'user.note', b'from job 1')\n",
}


@pytest.mark.parametrize("name", sorted(SABOTEURS))
def test_saboteur_scores_zero_and_the_next_job_passes(one_worker, name):
    """A correct program that also damages the scratch directory it shares with later jobs gets
    no reward for it, and the jobs after it are not charged."""
    code = SABOTEURS[name] + "def f(x):\n    return x + 1\n"
    r = one_worker.run(Job(code=code, kind="call", tests=[[[1], 2], [[2], 3]], entry_point="f"))
    assert r.passed == 0 and r.status == "error", (r.status, r.tests)
    assert "scratch directory" in r.message and "scores 0" in r.message, r.message
    assert all(t.status == "error" and t.message == r.message for t in r.tests), r.tests
    next_jobs_pass(one_worker)


def test_saboteur_result_is_never_cached(jail_probe, tmp_path):
    """A score of 0 for damaging the worker says nothing about the program's answers: it is not
    stored, so the program is judged again next time."""
    if not jail_probe.ok:
        pytest.skip(f"no jail here: {jail_probe.describe()}")
    job = Job(
        code=SABOTEURS["chmod 0500 HOME"] + "def f(x):\n    return x + 1\n",
        kind="call",
        tests=[[[1], 2]],
        entry_point="f",
    )
    with SyncSandboxPool(SandboxConfig(workers=1, cache_path=str(tmp_path / "cache.sqlite"))) as p:
        first, second = p.run(job), p.run(job)
        assert len(p.pool.cache) == 0
    assert first.passed == 0 and "scores 0" in first.message, first
    assert not second.cached and second.passed == 0, second


def test_filled_scratch_is_freed_for_the_next_job(one_worker):
    """Filling the scratch tmpfs through HOME is the program's own business (its own writes fail);
    the space is back for the next job."""
    fill = """
import os
def f():
    written, i = 0, 0
    try:
        while True:
            with open(os.path.join(os.environ["HOME"], f"fill{i}.bin"), "wb") as fh:
                for _ in range(48):
                    fh.write(b"z" * (1 << 20))
                    written += 1 << 20
            i += 1
    except OSError:
        pass
    return written >= 24 << 20
"""
    r = one_worker.run(Job(code=fill, kind="call", tests=[[[], True]], entry_point="f", timeout_s=20))
    assert r.all_passed, r.tests
    next_jobs_pass(one_worker)


COUNT_FORKS = """
import os, time
def f():
    n = 0
    for _ in range(200):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    return n
"""


def test_process_limit_is_whole_after_a_fork_bomb(one_worker):
    """RLIMIT_NPROC counts every process of the worker's uid, dying ones and zombies included:
    after a fork bomb, or children that take a while to die (128 MiB each to tear down), orphans,
    zombies and escaped daemons, the next job can still start its 31 children."""
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    heavy = (
        "import os, time\nr, w = os.pipe()\nfor _ in range(31):\n    if os.fork() == 0:\n"
        "        b = b'x' * (128 << 20)\n        os.write(w, b'.')\n        time.sleep(60)\n"
        "for _ in range(31):\n    os.read(r, 1)\ndef f(): return 1\n"
    )
    leave = (
        "import os, time\nfor _ in range(10):\n    if os.fork() == 0:\n        os._exit(0)\n"
        "for _ in range(10):\n    if os.fork() == 0:\n        os.setsid()\n"
        "        if os.fork() == 0:\n            time.sleep(60)\n        os._exit(0)\n"
        "def f(): return 1\n"
    )
    # Heavy children three times: how long they take to die varies, and one try could be lucky.
    for name, code, limit in (
        ("fork bomb", bomb, 1),
        ("heavy children", heavy, 5),
        ("heavy children", heavy, 5),
        ("heavy children", heavy, 5),
        ("orphans and daemons", leave, 1),
    ):
        one_worker.run(Job(code=code, kind="call", tests=[[[], 1]], entry_point="f", timeout_s=limit))
        r = one_worker.run(Job(code=COUNT_FORKS, kind="call", tests=[[[], 31]], entry_point="f", timeout_s=5))
        assert r.all_passed, (name, r.tests)


SYSV = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
KEY = 0x5eed
"""


def test_ipc_objects_do_not_reach_the_next_job(one_worker):
    """SysV message queues outlive their process in the worker's IPC namespace; the jail refuses
    them (and shared memory, semaphores, POSIX queues)."""
    leave = SYSV + (
        "q = libc.msgget(KEY, 0o1600)\n"  # IPC_CREAT | 0600
        "print('created' if q >= 0 else 'refused')\n"
    )
    find = SYSV + "print('found' if libc.msgget(KEY, 0) >= 0 else 'absent')\n"
    one_worker.run(Job(code=leave, kind="stdio", tests=[["", "created"]]))
    r = one_worker.run(Job(code=find, kind="stdio", tests=[["", "absent"]]))
    assert r.all_passed, r.tests
    probes = SYSV + (
        "import os\nout = []\n"
        "for name, args in (('shmget', (KEY, 4096, 0o1600)), ('semget', (KEY, 1, 0o1600)),\n"
        "                   ('msgget', (KEY, 0o1600))):\n"
        "    out.append(name + (' refused' if getattr(libc, name)(*args) < 0 else ' allowed'))\n"
        "mq = libc.mq_open(b'/fastcrit-probe', os.O_CREAT | os.O_RDWR, 0o600, None)\n"
        "out.append('mq_open' + (' refused' if mq < 0 else ' allowed'))\nprint(' '.join(out))\n"
    )
    r = one_worker.run(
        Job(code=probes, kind="stdio", tests=[["", "shmget refused semget refused msgget refused mq_open refused"]])
    )
    assert r.all_passed, r.tests


def test_worker_that_cannot_be_restored_is_replaced(one_worker):
    """No program in the jail can leave something its worker cannot remove (they share a uid and
    the rest of the tmpfs is read-only), so this test makes one from the host, as root, through
    the worker's /proc/PID/root: a root-owned directory with a file in it. The job whose cleanup
    finds it scores 0, the worker is replaced, and the job queued behind it on the same worker
    runs on the new one and passes."""
    if os.geteuid() != 0:
        pytest.skip("planting a root-owned directory in the worker's scratch needs root")
    old = worker_pid(one_worker)
    home = f"/proc/{old}/root{one_worker.pool._workers[0].scratch}/home"
    os.mkdir(os.path.join(home, "planted"), 0o700)
    open(os.path.join(home, "planted", "stuck"), "w").close()
    jobs = [
        Job(code=f"def f():\n    return {i}\n", kind="call", tests=[[[], i]], entry_point="f", id=i) for i in range(4)
    ]
    res = one_worker.run_many(jobs)
    assert res[0].passed == 0 and "replaced" in res[0].message, (res[0].status, res[0].message)
    assert all(r.all_passed for r in res[1:]), [(r.id, r.status, r.message) for r in res[1:]]
    assert worker_pid(one_worker) != old
    next_jobs_pass(one_worker)


BIG = """
def f(n):
    return list(range(n))
"""


def test_large_return_values_pass(one_worker):
    """A correct program returning ~1 MiB of JSON (far past a pipe's 64 KiB) passes, as a call and
    as an assert judged by the judge."""
    n = 150_000  # "0, 1, ..., 149999" is ~1 MiB of JSON
    # A generous limit: the value must be read as it is written, long before the deadline (a
    # worker that reads only at deadlines returns, if at all, after the whole 30 s).
    r = one_worker.run(
        Job(code=BIG, kind="call", tests=[[[n], list(range(n))], [[3], [0, 1, 2]]], entry_point="f", timeout_s=30)
    )
    assert r.all_passed and r.elapsed_s < 15, (r.elapsed_s, r.tests)
    r = one_worker.run(
        Job(
            code=BIG,
            kind="assert",
            entry_point="f",
            timeout_s=30,
            tests=[f"assert f({n}) == list(range({n}))", "assert f(2) == [0, 1]"],
        )
    )
    assert r.all_passed and r.judged_in == "judge" and r.elapsed_s < 15, (r.elapsed_s, r.judged_in, r.tests)


def test_return_value_over_the_limit_is_output_limit(one_worker):
    """A value past the result channel's limit (16 MiB) is ``output_limit`` as soon as the worker
    has read that much: not a timeout, not a hang. The other tests still run."""
    code = "def f(n):\n    return 'x' * n\n"
    limit = 16 << 20  # the documented default (docs/sandbox.md)
    r = one_worker.run(
        Job(
            code=code,
            kind="call",
            tests=[[[limit + 1024], "x"], [[2], "xx"]],
            entry_point="f",
            timeout_s=60,
            memory_mb=1024,
        )
    )
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


def test_a_forged_record_time_cannot_put_off_the_deadline(one_worker):
    """A `call` execution holds the key of its records: a program can find it and sign records
    dated far in the future. The worker never takes a record's time past now."""
    code = (
        "import gc, os, time, hashlib\n"
        "def f(x):\n"
        "    for o in gc.get_objects():\n"
        "        if type(o).__name__ == 'Reporter':\n"
        "            body = '\\x1f'.join(('loaded', '-1', '', repr(time.monotonic() + 1e9), '', '')).encode()\n"
        "            mac = hashlib.blake2b(b'%d:' % o._seq + body, key=o._key, digest_size=16).hexdigest().encode()\n"
        "            os.write(o._fd, body + b'\\t' + mac + b'\\n')\n"
        "            o._seq += 1\n"
        "    time.sleep(60)\n"
    )
    t0 = time.monotonic()
    r = one_worker.run(Job(code=code, kind="call", tests=[[[1], 1]], entry_point="f", timeout_s=1.0))
    assert r.tests[0].status == "timeout" and time.monotonic() - t0 < 10, (r.tests, time.monotonic() - t0)
