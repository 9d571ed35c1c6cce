"""run_many / stream never wait forever: a job whose run fails inside our own code is an error."""

import asyncio

from fastcrit.sandbox import Job
from fastcrit.sandbox.streaming import run_all


def test_a_failing_run_becomes_an_error_result_not_a_hang():
    async def run(job):
        if job.id == 1:
            raise RuntimeError("boom")
        await asyncio.sleep(0)
        from fastcrit.sandbox.types import TestResult, summarise

        return summarise(job.id, [TestResult("passed")])

    jobs = [Job(code="", kind="assert", tests=["pass", "pass"], id=i) for i in range(3)]
    out = asyncio.run(asyncio.wait_for(run_all(run, jobs), timeout=10))
    assert [r.id for r in out] == [0, 1, 2]
    assert out[0].all_passed and out[2].all_passed
    assert out[1].passed == 0 and out[1].total == 2 and out[1].status == "error"
    assert "sandbox internal error: RuntimeError: boom" in out[1].message
