"""The result cache: keyed by the exact job (program text, tests, limits), the pool settings that
change verdicts and the sandbox's own code; only verdicts the program itself decided are stored."""

import os
import shutil
import stat
import subprocess
import sys
import warnings

import pytest

from fastcrit.sandbox import Job, ResultCache, SandboxConfig, job_key
from fastcrit.sandbox.pool import SyncSandboxPool
from fastcrit.sandbox.types import Result
from fastcrit.sandbox.types import TestResult as Verdict

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
A_OTHER_LOGIC = A.replace("k - 1", "k")
TEST = "assert solve([3, 1, 2], 1) == 3"
CFG = SandboxConfig()


def _job(code, **kw):
    return Job(code=code, kind="assert", tests=[TEST], **kw)


def test_the_key_is_the_exact_job():
    assert job_key(_job(A), CFG) == job_key(_job(A), CFG)
    for other in (A_RENAMED, A_OTHER_LOGIC, A + "\n", A.replace("# sort", "#  sort"), "x=1", "x = 1"):
        assert job_key(_job(other), CFG) != job_key(_job(A), CFG), other
    assert job_key(Job(code="x=1", kind="assert", tests=["pass"]), CFG) != job_key(
        Job(code="x = 1", kind="assert", tests=["pass"]), CFG
    )
    base = job_key(_job(A), CFG)
    assert base != job_key(Job(code=A, kind="assert", tests=["assert solve([3], 1) == 3"]), CFG)
    assert base != job_key(_job(A, timeout_s=2), CFG)
    assert base != job_key(_job(A, memory_mb=512), CFG)
    assert base != job_key(_job(A, run_all_cases=False), CFG)
    assert base != job_key(_job(A, entry_point="solve"), CFG)
    call = lambda e: Job(code=A, kind="call", tests=[{"args": [[3], 1], "expected": e}], entry_point="solve")
    assert len({job_key(call(e), CFG) for e in (1, 1.0, True, "1", [1], None)}) == 6


@pytest.mark.parametrize(
    "change",
    [
        dict(isolation="none"),
        dict(max_output_bytes=1000),
        dict(max_processes=2),
        dict(max_file_mb=1),
        dict(preimport=("math",)),
        dict(backend="remote"),
        dict(remote_url="http://elsewhere:8080"),
        dict(tail_bytes=16),  # a cached result carries the tails
    ],
)
def test_the_key_holds_the_settings_that_change_results(change):
    assert job_key(_job(A), CFG) != job_key(_job(A), SandboxConfig(**change))


@pytest.mark.parametrize(
    "same",
    [
        dict(workers=7),
        dict(max_concurrency=3),
        dict(cache_path="/tmp/x.db"),
        dict(remote_retries=9),
        dict(timeout_s=3.0),
        dict(memory_mb=100),
    ],
)
def test_the_key_ignores_settings_that_do_not(same):
    assert job_key(_job(A), CFG) == job_key(_job(A), SandboxConfig(**same))


def test_a_change_of_the_sandbox_code_changes_every_key(tmp_path):
    """Old entries must not answer for new verdict logic: each of two copies of the package gets
    its own keys once one line of its comparison code differs."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    keys = []
    for name, extra in (("same1", ""), ("same2", ""), ("changed", "\n# a changed line\n")):
        dst = tmp_path / name / "fastcrit"
        shutil.copytree(
            os.path.join(root, "fastcrit", "sandbox"), dst / "sandbox", ignore=shutil.ignore_patterns("__pycache__")
        )
        shutil.copy(os.path.join(root, "fastcrit", "__init__.py"), dst / "__init__.py")
        with open(dst / "sandbox" / "compare.py", "a") as f:
            f.write(extra)
        code = (
            "from fastcrit.sandbox import Job, SandboxConfig, job_key\n"
            "print(job_key(Job(code='x = 1', kind='assert', tests=['pass']), SandboxConfig()))"
        )
        out = subprocess.run(
            [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path / name)!r})\n" + code],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        keys.append(out.stdout.strip())
    assert keys[0] == keys[1] and keys[2] != keys[0], keys


# Programs that AST normalisation (renaming locals, dropping blank lines) made one: they behave
# differently, so neither may get the other's verdicts.
LINENO = "def f():\n    return f.__code__.co_firstlineno\n"
VARNAMES = "def f():\n    {v} = 1\n    return f.__code__.co_varnames[0]\n"


def _pool(path, iso):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return SyncSandboxPool(workers=1, isolation=iso, cache_path=path)


def test_programs_that_only_look_alike_do_not_share_verdicts(tmp_path, jail_probe):
    iso = "jail" if jail_probe.ok else "none"
    pairs = [
        (LINENO, "\n\n" + LINENO, "assert f() == 1"),
        (VARNAMES.format(v="x"), VARNAMES.format(v="y"), "assert f() == 'x'"),
    ]
    with _pool(str(tmp_path / "c.sqlite"), iso) as p:
        for right, lookalike, test in pairs:
            for entry_point in ("f", None):  # with and without an entry point
                first = p.run(Job(code=right, kind="assert", tests=[test], entry_point=entry_point))
                second = p.run(Job(code=lookalike, kind="assert", tests=[test], entry_point=entry_point))
                assert first.all_passed and not first.cached
                assert not second.cached and second.status == "failed", (lookalike, second)


def test_cache_persists_across_pools_and_reports_hit_rate(tmp_path, jail_probe):
    path = str(tmp_path / "cache.sqlite")
    iso = "jail" if jail_probe.ok else "none"
    jobs = [
        _job(A, id="a"),
        _job(A_OTHER_LOGIC, id="b"),
        Job(code="while True: pass", kind="assert", tests=["pass"], timeout_s=0.2, id="t"),
    ]
    with _pool(path, iso) as p:
        first = p.run_many(jobs)
        assert [r.cached for r in first] == [False, False, False]
        assert p.stats()["cache"]["hit_rate"] == 0.0
    assert os.path.getsize(path) > 0
    with _pool(path, iso) as p:
        again = p.run_many([_job(A, id="a2"), jobs[1], jobs[2], _job(A_RENAMED, id="r")])
        stats = p.stats()["cache"]
    assert again[0].cached and again[0].all_passed and again[0].id == "a2"
    assert again[1].cached and again[1].status == "failed"
    assert not again[2].cached and again[2].status == "timeout"  # timeouts are never cached
    assert not again[3].cached and again[3].all_passed  # other text, other program
    assert stats["hits"] == 2 and stats["misses"] == 2 and stats["hit_rate"] == 0.5
    assert stats["entries"] == 3


def test_result_cache_roundtrip(tmp_path):
    c = ResultCache(str(tmp_path / "c.db"))
    r = Result(id=1, status="failed", passed=1, total=2, tests=[Verdict("passed"), Verdict("failed", "x")])
    c.put("k", r)
    got = c.get("k")
    assert got.cached and got.tests == r.tests and got.pass_rate == 0.5
    assert c.get("missing") is None and c.hit_rate == 0.5


def _result(*tests, message=""):
    passed = sum(t.status == "passed" for t in tests)
    status = "passed" if passed == len(tests) else next(t.status for t in tests if t.status != "passed")
    return Result(id=0, status=status, passed=passed, total=len(tests), tests=list(tests), message=message)


@pytest.mark.parametrize(
    "result",
    [
        # a worker that raised while running the job (workers.py answers every test so)
        _result(Verdict("error", "sandbox worker error: UnicodeEncodeError('utf-8', ...)")),
        _result(Verdict("passed"), Verdict("error", "sandbox worker sent an unjudged pass")),
        _result(Verdict("passed"), Verdict("error", "sandbox could not judge the returned value: OverflowError")),
        _result(Verdict("passed"), Verdict("timeout", "wall-clock timeout")),
        _result(Verdict("error", "sandbox worker 0 died"), message="sandbox worker 0 died"),
        _result(),  # no verdict at all
    ],
    ids=["worker_error", "unjudged", "could_not_judge", "timeout", "job_level", "empty"],
)
def test_verdicts_the_program_did_not_decide_are_never_cached(tmp_path, result):
    c = ResultCache(str(tmp_path / "c.db"))
    c.put("k", result)
    assert c.get("k") is None and len(c) == 0


@pytest.mark.parametrize(
    "result",
    [
        _result(Verdict("passed"), Verdict("failed", "returned 8.0, expected 8")),
        _result(Verdict("error", "ValueError: sandbox")),  # the program's own exception, whatever it says
        _result(Verdict("memory", "MemoryError"), Verdict("skipped")),
    ],
    ids=["failed", "program_error", "memory"],
)
def test_verdicts_of_the_program_are_cached(tmp_path, result):
    c = ResultCache(str(tmp_path / "c.db"))
    c.put("k", result)
    assert c.get("k").tests == result.tests


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_cache_file_is_private(tmp_path):
    old_umask = os.umask(0o022)
    try:
        path = str(tmp_path / "c.sqlite")
        c = ResultCache(path)
        c.put("k", _result(Verdict("passed")))
        files = [path] + [path + s for s in ("-wal", "-shm") if os.path.exists(path + s)]
        assert len(files) == 3  # WAL mode: the journal files exist while the cache is open
        assert {f: _mode(f) for f in files} == {f: 0o600 for f in files}
        c.close()
        # a file an earlier version left readable by others is made private when opened
        os.chmod(path, 0o644)
        ResultCache(path).close()
        assert _mode(path) == 0o600
    finally:
        os.umask(old_umask)
