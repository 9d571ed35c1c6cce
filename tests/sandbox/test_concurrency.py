"""Thousands of mixed jobs in one concurrent run give the same results as one at a time."""

from fastcrit.sandbox import Job, SandboxPool
from fastcrit.sandbox.pool import new_event_loop


def mixed_jobs(n):
    jobs = []
    for i in range(n):
        k = i % 8
        if k == 0:
            jobs.append(
                Job(
                    code=f"def f(x):\n    return x * {i % 7}\n",
                    kind="assert",
                    tests=[f"assert f(3) == {3 * (i % 7)}", f"assert f(1) == {i % 5}"],
                    id=i,
                )
            )
        elif k == 1:
            jobs.append(
                Job(
                    code="n = int(input())\nprint(n * n)\n",
                    kind="stdio",
                    tests=[[f"{i}\n", f"{i * i}\n"], [f"{i}\n", f"{i * i + i % 3}\n"]],
                    id=i,
                )
            )
        elif k == 2:
            jobs.append(
                Job(
                    code="def g(a, b):\n    return [a + b, a * b]\n",
                    kind="call",
                    tests=[[[i, 2], [i + 2, 2 * i]], [[i, 3], [i + 3, 3 * i + i % 2]]],
                    entry_point="g",
                    id=i,
                )
            )
        elif k == 3:
            jobs.append(Job(code="def f(:\n", kind="assert", tests=["assert f() == 1"], id=i))  # syntax error
        elif k == 4:
            jobs.append(Job(code=f"raise ValueError({i})\n", kind="stdio", tests=[["", ""]], id=i))
        elif k == 5:
            jobs.append(
                Job(
                    code="import sys\nprint(sum(map(int, sys.stdin.read().split())))\n",
                    kind="stdio",
                    tests=[[f"{i} {i}\n", f"{2 * i}\n"]],
                    run_all_cases=False,
                    id=i,
                )
            )
        elif k == 6:
            jobs.append(
                Job(
                    code="def h(s):\n    return s[::-1]\n",
                    kind="call",
                    tests=[[["ab" * (i % 4)], "ba" * (i % 4)], [[str(i)], str(i)]],
                    entry_point="h",
                    run_all_cases=i % 3 == 0,
                    id=i,
                )
            )
        else:
            jobs.append(
                Job(
                    code="def f():\n    return 1 / 0\n",
                    kind="assert",
                    tests=["assert f() == 0", "assert 1"],
                    run_all_cases=i % 2 == 0,
                    id=i,
                )
            )
    return jobs


def signature(r):
    return (r.id, r.status, r.passed, r.total, tuple(t.status for t in r.tests))


def test_concurrent_equals_sequential(pool):
    jobs = mixed_jobs(2000)
    concurrent = pool.run_many(jobs)  # max_concurrency 256 in flight, 2 workers
    sequential = [pool.run(j) for j in jobs]
    assert [signature(r) for r in concurrent] == [signature(r) for r in sequential]
    # and the outcomes are the expected ones, not merely consistent
    by_kind = {}
    for j, r in zip(jobs, concurrent):
        by_kind.setdefault(j.id % 8, set()).add((r.passed, r.total))
    assert by_kind[3] == {(0, 1)} and by_kind[4] == {(0, 1)} and by_kind[5] == {(1, 1)}
    assert all(p in (1, 2) for p, _ in by_kind[0] | by_kind[1] | by_kind[2])


def test_stream_yields_every_job_once_and_queues_256_wide(jail_probe):
    async def go():
        isolation = "jail" if jail_probe.ok else "none"
        async with SandboxPool(workers=2, isolation=isolation, max_concurrency=256) as pool:
            jobs = [Job(code=f"print({i})\n", kind="stdio", tests=[["", f"{i}\n"]], id=i) for i in range(300)]
            seen = []
            async for i, r in pool.stream(jobs):
                assert r.id == i and r.all_passed
                seen.append(i)
            return seen

    loop = new_event_loop()
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            seen = loop.run_until_complete(go())
    finally:
        loop.close()
    assert sorted(seen) == list(range(300))


def test_invalid_job_in_a_batch_is_reported_not_raised(pool):
    res = pool.run_many(
        [
            {"code": "", "kind": "nope", "tests": []},
            {"code": "print(1)", "kind": "stdio", "tests": [["", "1"]], "id": "ok"},
        ]
    )
    assert res[0].status == "error" and "invalid job" in res[0].message and "'kind'" in res[0].message
    assert res[1].all_passed


def test_cancelled_jobs_leave_workers_usable(jail_probe):
    """A consumer that stops early cancels jobs mid-call; the workers must still answer the next
    jobs with their own results (a half-read answer must never be handed to another job)."""
    import warnings

    async def go():
        isolation = "jail" if jail_probe.ok else "none"
        async with SandboxPool(workers=2, isolation=isolation) as pool:
            slow = [
                Job(
                    code="import time\ntime.sleep(0.2)\nprint('slow')",
                    kind="stdio",
                    tests=[["", "no"], ["", "no"], ["", "no"]],
                    id=i,
                )
                for i in range(4)
            ]
            async for _ in pool.stream(slow):
                break  # the other three are cancelled, some while running
            jobs = [Job(code=f"print({i})", kind="stdio", tests=[["", f"{i}"]], id=i) for i in range(20)]
            return await pool.run_many(jobs)

    loop = new_event_loop()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = loop.run_until_complete(go())
    finally:
        loop.close()
    assert [r.id for r in res] == list(range(20)) and all(r.all_passed for r in res), res


def test_worker_death_fails_only_the_running_job():
    """Without the jail a program can kill its worker. The job it ran is an error; the jobs queued
    behind it on that worker are run again (on the restarted worker) and pass."""
    import warnings

    killer = Job(
        code="import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", kind="stdio", tests=[["", ""]], id="killer"
    )
    jobs = [killer] + [Job(code=f"print({i})", kind="stdio", tests=[["", f"{i}"]], id=i) for i in range(6)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        from fastcrit.sandbox import SyncSandboxPool

        with SyncSandboxPool(workers=1, isolation="none") as p:
            res = p.run_many(jobs)
            again = p.run(Job(code="print('ok')", kind="stdio", tests=[["", "ok"]]))
    assert res[0].status == "error" and "worker" in res[0].message, res[0]
    assert all(r.all_passed for r in res[1:]), [(r.id, r.status, r.message) for r in res[1:]]
    assert again.all_passed


def test_stats_report_worker_cpu_and_memory(pool):
    before = pool.pool.worker_cpu_s()
    pool.run_many(
        [
            Job(
                code="s = sum(i * i for i in range(200000))\nprint(s)",
                kind="stdio",
                tests=[["", str(sum(i * i for i in range(200000)))]],
                id=i,
            )
            for i in range(20)
        ]
    )
    assert pool.pool.worker_cpu_s() > before
    st = pool.stats()
    assert len(st["worker_peak_rss_mb"]) == st["workers"] and all(0 < m < 500 for m in st["worker_peak_rss_mb"])
