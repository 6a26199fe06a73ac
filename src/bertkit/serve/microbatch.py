"""Micro-batching of concurrent requests: one worker gathers queued requests into model-sized batches.

Requests wait in a bounded asyncio queue (full -> the caller answers 429). A single worker task takes
the first waiting request, then keeps gathering for at most `max_wait_s` or until `max_batch_size`
inputs are collected, groups the gathered requests by endpoint and options, and runs each group as
one predictor call on a single inference thread (so the event loop stays free to answer /health,
429s and timeouts while the model computes).

Design decision: one worker and one inference thread. The model runs one batch at a time — that is
what a CPU or a single GPU does best — and batching, not parallel calls, is where throughput comes
from. A request that timed out before its batch starts is skipped; a group whose call fails with a
`BertkitError` (one bad input) is re-run request by request, so one bad request never fails its
neighbours.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bertkit.errors import BertkitError

log = logging.getLogger(__name__)

Runner = Callable[[Hashable, list[Any]], list[Any]]


class QueueFullError(Exception):
    """The queue holds `max_queue` requests already."""


class NotRunningError(Exception):
    """The batcher is stopped (the server is shutting down)."""


@dataclass
class _Job:
    key: Hashable  # endpoint + options: only jobs with equal keys share a predictor call
    items: list[Any]
    future: asyncio.Future = field(repr=False)


class MicroBatcher:
    """`await submit(key, items, timeout)` -> one result per item, computed by `run(key, items)`."""

    def __init__(self, run: Runner, max_batch_size: int = 32, max_wait_s: float = 0.005, max_queue: int = 256,
                 ) -> None:
        self._run = run
        self.max_batch_size, self.max_wait_s = max_batch_size, max_wait_s
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(maxsize=max_queue)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertkit-inference")
        self._worker: asyncio.Task | None = None

    @property
    def queued(self) -> int:
        """Requests waiting for the inference thread (not counting the batch it runs)."""
        return self._queue.qsize()

    async def call(self, function: Callable[[], Any]) -> Any:
        """Run `function()` on the inference thread (the warm-up uses it, so it never races a batch)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function)

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._work(), name="bertkit-microbatch")

    async def stop(self) -> None:
        """Answer what is queued, then stop the worker and the inference thread."""
        while not self._queue.empty() and self._worker is not None and not self._worker.done():
            await asyncio.sleep(0.01)
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        self._executor.shutdown(wait=True)

    async def submit(self, key: Hashable, items: Sequence[Any], timeout: float) -> list[Any]:
        """Queue a request and wait for its results; QueueFullError, NotRunningError or TimeoutError."""
        if self._worker is None or self._worker.done():
            raise NotRunningError
        job = _Job(key, list(items), asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            raise QueueFullError from None
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout)
        except TimeoutError:
            job.future.cancel()  # the worker skips it if its batch has not started
            raise

    async def _work(self) -> None:
        while True:
            jobs = await self._gather()
            groups: dict[Hashable, list[_Job]] = collections.defaultdict(list)
            for job in jobs:
                groups[job.key].append(job)
            for key, group in groups.items():
                await self._run_group(key, [job for job in group if not job.future.done()])

    async def _gather(self) -> list[_Job]:
        """The first waiting job, plus whatever arrives within max_wait_s, up to max_batch_size inputs."""
        loop = asyncio.get_running_loop()
        jobs = [await self._queue.get()]
        size, deadline = len(jobs[0].items), loop.time() + self.max_wait_s
        while size < self.max_batch_size:
            try:
                job = self._queue.get_nowait() if not self._queue.empty() else \
                    await asyncio.wait_for(self._queue.get(), deadline - loop.time())
            except TimeoutError:
                break
            jobs.append(job)
            size += len(job.items)
        return jobs

    async def _run_group(self, key: Hashable, jobs: list[_Job]) -> None:
        if not jobs:
            return
        items = [item for job in jobs for item in job.items]
        try:
            results = await self.call(lambda: self._run(key, items))
        except BertkitError as exc:
            if len(jobs) > 1:  # find the culprit: each request alone
                for job in jobs:
                    await self._run_group(key, [job])
                return
            _settle(jobs[0], exception=exc)
            return
        except Exception as exc:  # a bug: the request gets a 500, the worker lives on
            log.exception("inference failed for %s", key)
            for job in jobs:
                _settle(job, exception=exc)
            return
        start = 0
        for job in jobs:
            _settle(job, result=results[start:start + len(job.items)])
            start += len(job.items)


def _settle(job: _Job, result: Any = None, exception: BaseException | None = None) -> None:
    if job.future.done():  # timed out meanwhile: nobody is waiting
        return
    if exception is not None:
        job.future.set_exception(exception)
    else:
        job.future.set_result(result)
