"""Running many jobs through one backend's ``run`` (local pool or remote), shared by both."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable, Iterable

from .types import JobError, Result, error_result


async def stream_results(run: Callable[..., Awaitable[Result]],
                         jobs: Iterable) -> AsyncIterator[tuple[int, Result]]:
    """Yield (index, result) as jobs finish. The backend's ``run`` bounds the concurrency; a job
    that is not valid yields an error result naming the problem."""
    queue: asyncio.Queue = asyncio.Queue()

    async def one(i, job):
        try:
            r = await run(job)
        except JobError as exc:
            job_id = job.get("id") if isinstance(job, dict) else getattr(job, "id", None)
            r = error_result(job_id, 0, f"invalid job: {exc}")
        await queue.put((i, r))

    tasks = [asyncio.ensure_future(one(i, job)) for i, job in enumerate(jobs)]
    try:
        for _ in tasks:
            yield await queue.get()
    finally:
        for t in tasks:
            t.cancel()


async def run_all(run: Callable[..., Awaitable[Result]], jobs: Iterable) -> list[Result]:
    """Results in the order of ``jobs``."""
    jobs = list(jobs)
    out: list = [None] * len(jobs)
    async for i, r in stream_results(run, jobs):
        out[i] = r
    return out
