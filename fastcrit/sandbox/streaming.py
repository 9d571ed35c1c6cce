"""Running many jobs through one backend's ``run`` (local pool or remote), shared by both."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

from .types import JobError, Result, error_result


async def stream_results(run: Callable[..., Awaitable[Result]], jobs: Iterable) -> AsyncIterator[tuple[int, Result]]:
    """Yield (index, result) as jobs finish. The backend's ``run`` bounds the concurrency; a job
    that is not valid yields an error result naming the problem, and so does a job whose run
    failed inside the sandbox's own code (never a pass, and never a stream that waits forever)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def one(i, job):
        try:
            r = await run(job)
        except JobError as exc:
            r = error_result(_job_id(job), 0, f"invalid job: {exc}")
        except Exception as exc:  # a bug of ours must not hang the caller or pass the job
            tests = getattr(job, "tests", None) or (job.get("tests") if isinstance(job, dict) else None)
            r = error_result(
                _job_id(job),
                len(tests) if isinstance(tests, list) else 0,
                f"sandbox internal error: {type(exc).__name__}: {exc}",
            )
        await queue.put((i, r))

    tasks = [asyncio.ensure_future(one(i, job)) for i, job in enumerate(jobs)]
    try:
        for _ in tasks:
            yield await queue.get()
    finally:
        for t in tasks:
            t.cancel()


def _job_id(job):
    return job.get("id") if isinstance(job, dict) else getattr(job, "id", None)


async def run_all(run: Callable[..., Awaitable[Result]], jobs: Iterable) -> list[Result]:
    """Results in the order of ``jobs``."""
    jobs = list(jobs)
    out: list = [None] * len(jobs)
    async for i, r in stream_results(run, jobs):
        out[i] = r
    return out
