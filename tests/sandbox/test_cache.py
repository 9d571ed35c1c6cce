import os

import pytest

from fastcrit.sandbox import Job, ResultCache, job_key, normalise
from fastcrit.sandbox.pool import SyncSandboxPool

A = '''
def solve(nums, k):
    """Return the k-th largest."""
    # sort, descending
    ordered = sorted(nums, reverse=True)
    answer = ordered[k - 1]
    return answer
'''
A_RENAMED = '''
def solve(nums, k):
    """Return the k-th largest."""
    tmp = sorted(nums,   reverse=True)   # other comment
    res = tmp[k-1]

    return res
'''
A_OTHER_PARAM = A.replace("nums", "values")  # a parameter is interface (keyword calls)
A_OTHER_LOGIC = A.replace("k - 1", "k")


def test_equivalent_programs_share_a_key():
    assert normalise(A) == normalise(A_RENAMED)
    j = lambda code: Job(code=code, kind="assert", tests=["assert solve([3, 1, 2], 1) == 3"])  # noqa: E731
    assert job_key(j(A)) == job_key(j(A_RENAMED))
    assert job_key(j(A)) != job_key(j(A_OTHER_PARAM))
    assert job_key(j(A)) != job_key(j(A_OTHER_LOGIC))
    # tests, limits and kind are part of the key
    assert job_key(j(A)) != job_key(Job(code=A, kind="assert", tests=["assert solve([3], 1) == 3"]))
    assert job_key(j(A)) != job_key(Job(code=A, kind="assert", tests=["assert solve([3, 1, 2], 1) == 3"], timeout_s=2))


@pytest.mark.parametrize("src", [
    "x = 7\ndef f():\n    x = 1\n    def g():\n        global x\n        return x\n    return g() + x\n",  # global in nested scope
    "def f():\n    y = 2\n    return locals()['y']\n",  # dynamic name access
    "def f():\n    z = 3\n    class C:\n        z = 4\n    return C.z\n",  # class attribute with the same name
    "def f():\n    w = 1\n    g = lambda w=5: w\n    return g(w=2)\n",  # keyword argument names
])
def test_names_that_are_observable_are_kept(src):
    ns1, ns2 = {}, {}
    exec(src, ns1)
    exec(normalise(src), ns2)
    assert ns1["f"]() == ns2["f"]()


def test_unparseable_code_is_keyed_raw():
    assert normalise("def f(:") != normalise("def f( :")


def test_cache_persists_across_pools_and_reports_hit_rate(tmp_path, jail_probe):
    path = str(tmp_path / "cache.sqlite")
    iso = "jail" if jail_probe.ok else "none"
    jobs = [Job(code=A, kind="assert", tests=["assert solve([3, 1, 2], 1) == 3"], id="a"),
            Job(code=A_OTHER_LOGIC, kind="assert", tests=["assert solve([3, 1, 2], 1) == 3"], id="b"),
            Job(code="while True: pass", kind="assert", tests=["pass"], timeout_s=0.2, id="t")]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with SyncSandboxPool(workers=1, isolation=iso, cache_path=path) as p:
            first = p.run_many(jobs)
            assert [r.cached for r in first] == [False, False, False]
            assert p.stats()["cache"]["hit_rate"] == 0.0
        assert os.path.getsize(path) > 0
        with SyncSandboxPool(workers=1, isolation=iso, cache_path=path) as p:
            again = p.run_many([Job(code=A_RENAMED, kind="assert", tests=["assert solve([3, 1, 2], 1) == 3"], id="a2"),
                                jobs[1], jobs[2]])
            stats = p.stats()["cache"]
    assert again[0].cached and again[0].all_passed and again[0].id == "a2"
    assert again[1].cached and again[1].status == "failed"
    assert not again[2].cached and again[2].status == "timeout"  # timeouts are never cached
    assert stats["hits"] == 2 and stats["misses"] == 1 and abs(stats["hit_rate"] - 2 / 3) < 1e-9
    assert stats["entries"] == 2


def test_result_cache_roundtrip(tmp_path):
    from fastcrit.sandbox.types import Result, TestResult

    c = ResultCache(str(tmp_path / "c.db"))
    r = Result(id=1, status="failed", passed=1, total=2, tests=[TestResult("passed"), TestResult("failed", "x")])
    c.put("k", r)
    got = c.get("k")
    assert got.cached and got.tests == r.tests and got.pass_rate == 0.5
    assert c.get("missing") is None and c.hit_rate == 0.5
