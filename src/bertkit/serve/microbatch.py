"""Micro-batching of concurrent requests: one worker gathers queued requests into batches by tokens.

Requests wait in a bounded asyncio queue (full -> the caller answers 429). Each input's token count is
known when its request is queued (`cost(key, items)`, bertkit.serve.cost: the tokens the model will
run for each). A single worker task takes the first waiting request, then keeps gathering for at most
`max_wait_s`, until `max_batch_size` inputs or `max_batch_tokens` tokens are collected. It groups what it
gathered by endpoint and options, sorts each group's inputs by tokens, and cuts them into batches of at
most `max_batch_size` inputs and `max_batch_tokens` tokens (an input over the budget runs alone),
shortest first. Each batch is one predictor call on a single inference thread (so the event loop stays
free to answer /health, 429s and timeouts while the model computes), and a request is answered as soon
as its last input is computed, its results in its own order.

Design decisions:

- The budget is the sum of the inputs' tokens, not (inputs) x (longest input), because that is what
  bertkit's encoder computes. The predictors pad a batch to its longest input, but the encoder drops the
  padding after the embeddings (model/padding.py): every dense layer runs on the real tokens only, and on
  CPU attention runs per sequence (model/attention.py, `PerSequence`), so a batch's time grows with its
  total tokens (plus each sequence's own attention, quadratic in its own length), not with its width.
  TEI's --max-batch-tokens counts the same way for its padding-free models (core/src/queue.rs; padded
  ones count inputs x longest). Padding still costs the embedding lookup and the padded output (and
  attention on CUDA in fp32); sorting by length makes that small. So on CPU the budget bounds a call's
  time and memory and moves latency between short and long requests; it does not raise requests/s
  (measured: benchmarks/serve_load.py --mixed).
- Shortest first within what was gathered: short requests, most of the traffic, are answered while the
  long ones compute, instead of all waiting for the slowest input of a shared batch; and while one batch
  computes, the event loop sends the previous batch's answers and reads new requests.
- One worker and one inference thread. The model runs one batch at a time — that is what a CPU or a
  single GPU does best — and batching, not parallel calls, is where throughput comes from. An input
  whose request timed out before its batch starts is skipped; a batch whose call fails with a
  `BertkitError` (one bad input) is re-run request by request, so one bad request never fails its
  neighbours.

Observers (bertkit.serve.observability) hear of each queued request and each predictor call.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from bertkit.errors import BertkitError, ModelFault

log = logging.getLogger(__name__)

Runner = Callable[[Hashable, list[Any]], list[Any]]
Cost = Callable[[Hashable, list[Any]], list[int]]  # tokens of each item of one request


class QueueFullError(Exception):
    """The queue holds `max_queue` requests already."""


class NotRunningError(Exception):
    """The batcher is stopped (the server is shutting down)."""


class ClientGoneError(Exception):
    """The client closed its connection before its results were ready: its inputs not yet run are dropped."""


@dataclass(frozen=True)
class BatchRecord:
    """One predictor call, as observers see it."""

    key: Hashable
    inputs: int
    tokens: int
    seconds: float
    """Wall time of the predictor call (tokenizing, the model, decoding)."""
    queue_waits: tuple[float, ...]
    """Seconds from submit to this batch's start, for each request whose first input runs in it."""


@dataclass(frozen=True)
class RequestTiming:
    """Where one request's time went, as TEI's x-*-time headers and te_request_*_duration metrics report it."""

    tokenization: float
    """Seconds counting its tokens before it was queued (the predictor tokenizes again in its batch)."""
    queue: float
    """Seconds from queued to the start of its first batch."""
    inference: float
    """Seconds from the start of its first batch to its last result."""
    characters: int
    """Characters of its inputs (both texts of a pair)."""


class BatchObserver(Protocol):
    def submitted(self, key: Hashable, costs: Sequence[int]) -> None:
        """A request was queued (called in the submitting request's context)."""

    def completed(self, key: Hashable, timing: RequestTiming) -> None:
        """A request's results are ready (called in the submitting request's context)."""

    def ran(self, batch: BatchRecord) -> None:
        """A predictor call finished (on the event loop)."""


@dataclass(eq=False)
class _Job:
    key: Hashable  # endpoint + options: only jobs with equal keys share a predictor call
    items: list[Any]
    costs: list[int]  # tokens of each item
    future: asyncio.Future = field(repr=False)
    queued_at: float  # time.monotonic() at submit
    started: bool = False  # its first input's batch has begun
    started_at: float = 0.0  # time.monotonic() when it did
    results: list[Any] = field(init=False)
    pending: int = field(init=False)  # items not computed yet

    def __post_init__(self) -> None:
        self.results, self.pending = [None] * len(self.items), len(self.items)


Slot = tuple[_Job, int]  # one input: its request and its position there


class MicroBatcher:
    """`await submit(key, items, timeout)` -> one result per item, computed by `run(key, items)` in batches
    of at most `max_batch_size` items and `max_batch_tokens` tokens, the items' tokens given by
    `cost(key, items)` (without `cost`, every item counts one token)."""

    def __init__(self, run: Runner, max_batch_size: int = 32, max_wait_s: float = 0.005, max_queue: int = 256,
                 max_batch_tokens: int = 16_384, cost: Cost | None = None) -> None:
        self._run = run
        self._cost = cost or (lambda key, items: [1] * len(items))
        self.max_batch_size, self.max_wait_s, self.max_batch_tokens = max_batch_size, max_wait_s, max_batch_tokens
        self.observers: list[BatchObserver] = []
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

    async def submit(self, key: Hashable, items: Sequence[Any], timeout: float,
                     client_gone: Callable[[], Awaitable[Any]] | None = None) -> list[Any]:
        """Queue a request and wait for its results; QueueFullError, NotRunningError or TimeoutError; and
        ClientGoneError when `client_gone()` (an awaitable that ends when the client disconnects) ends first:
        the request's inputs whose batch has not started are then dropped, so nobody computes for it."""
        if self._worker is None or self._worker.done():
            raise NotRunningError
        if self._queue.full():  # before counting tokens: a refused request costs no tokenizing
            raise QueueFullError
        items = list(items)
        counting = time.monotonic()
        costs = self._cost(key, items)
        tokenization = time.monotonic() - counting
        if len(costs) != len(items):  # a bug in the cost function: the request gets a 500
            raise RuntimeError(f"the cost function gave {len(costs)} counts for {len(items)} inputs")
        job = _Job(key, items, costs, asyncio.get_running_loop().create_future(), time.monotonic())
        self._notify("submitted", key, costs)
        self._queue.put_nowait(job)  # no await since the check: the queue cannot have filled
        try:
            results = await self._wait(job, timeout, client_gone)
        except (TimeoutError, ClientGoneError):
            job.future.cancel()  # the worker skips its inputs whose batch has not started
            raise
        self._notify("completed", key, RequestTiming(tokenization, job.started_at - job.queued_at,
                                                     time.monotonic() - job.started_at, _characters(items)))
        return results

    async def _wait(self, job: _Job, timeout: float, client_gone: Callable[[], Awaitable[Any]] | None) -> list[Any]:
        """The job's results within `timeout`, or ClientGoneError as soon as `client_gone()` ends."""
        if client_gone is None:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout)
        result = asyncio.ensure_future(asyncio.wait_for(asyncio.shield(job.future), timeout))
        gone = asyncio.ensure_future(client_gone())
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not result.done():
            result.cancel()
            raise ClientGoneError
        return result.result()

    async def _work(self) -> None:
        while True:
            jobs = await self._gather()
            groups: dict[Hashable, list[_Job]] = collections.defaultdict(list)
            for job in jobs:
                groups[job.key].append(job)
            for key, group in groups.items():
                for batch in self._batches(group):
                    await self._run_batch(key, batch)

    async def _gather(self) -> list[_Job]:
        """The first waiting job, plus whatever arrives within max_wait_s, up to max_batch_size inputs or
        max_batch_tokens tokens."""
        loop = asyncio.get_running_loop()
        jobs = [await self._queue.get()]
        size, tokens, deadline = len(jobs[0].items), sum(jobs[0].costs), loop.time() + self.max_wait_s
        while size < self.max_batch_size and tokens < self.max_batch_tokens:
            try:
                job = self._queue.get_nowait() if not self._queue.empty() else \
                    await asyncio.wait_for(self._queue.get(), deadline - loop.time())
            except TimeoutError:
                break
            if job.future.done():  # its client left (or it timed out) while queued: it takes no room in the batch
                continue
            jobs.append(job)
            size, tokens = size + len(job.items), tokens + sum(job.costs)
        return jobs

    def _batches(self, jobs: Sequence[_Job]) -> list[list[Slot]]:
        """The inputs of `jobs` (one key) shortest first, cut before an input that would take a batch past
        max_batch_size inputs or max_batch_tokens tokens; an input over the budget alone is a batch."""
        slots = sorted(((job, i) for job in jobs for i in range(len(job.items))), key=lambda s: s[0].costs[s[1]])
        batches: list[list[Slot]] = []
        tokens = 0
        for job, i in slots:
            if not batches or len(batches[-1]) == self.max_batch_size or tokens + job.costs[i] > self.max_batch_tokens:
                batches.append([])
                tokens = 0
            batches[-1].append((job, i))
            tokens += job.costs[i]
        return batches

    async def _run_batch(self, key: Hashable, slots: list[Slot]) -> None:
        slots = [(job, i) for job, i in slots if not job.future.done()]  # timed out, or failed in another batch
        if not slots:
            return
        jobs = list(dict.fromkeys(job for job, _ in slots))
        waits = _start(jobs)
        items = [job.items[i] for job, i in slots]
        began = time.perf_counter()
        try:
            results = await self.call(lambda: self._predict(key, items))
        except BertkitError as exc:
            self._record(key, slots, began, waits)
            if len(jobs) == 1:
                _settle(jobs[0], exception=exc)
                return
            for job in jobs:  # find the culprit: each request's inputs alone
                await self._run_batch(key, [slot for slot in slots if slot[0] is job])
            return
        except Exception as exc:  # a bug or a broken model: the requests get a 500, the worker lives on
            self._record(key, slots, began, waits)
            if isinstance(exc, ModelFault):  # its message says what to check; a traceback would add nothing
                log.error("inference failed for %s: %s", key, exc)
            else:
                log.exception("inference failed for %s", key)
            for job in jobs:
                _settle(job, exception=exc)
            return
        self._record(key, slots, began, waits)
        _store(slots, results)

    def _predict(self, key: Hashable, items: list[Any]) -> list[Any]:
        results = self._run(key, items)
        if len(results) != len(items):  # zip would leave requests unanswered until their timeout
            raise RuntimeError(f"the runner returned {len(results)} results for {len(items)} inputs")
        return results

    def _record(self, key: Hashable, slots: list[Slot], began: float, waits: tuple[float, ...]) -> None:
        self._notify("ran", BatchRecord(key, len(slots), sum(job.costs[i] for job, i in slots),
                                        time.perf_counter() - began, waits))

    def _notify(self, event: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                method = getattr(observer, event, None)
                if method is not None:  # an observer may hear only some events
                    method(*args)
            except Exception:  # metrics or logs that fail must not stop serving
                log.exception("batch observer %r failed on %s", observer, event)


def _start(jobs: list[_Job]) -> tuple[float, ...]:
    """Mark the jobs whose first input starts now; their seconds in the queue."""
    now, waits = time.monotonic(), []
    for job in jobs:
        if not job.started:
            job.started, job.started_at = True, now
            waits.append(now - job.queued_at)
    return tuple(waits)


def _characters(items: Sequence[Any]) -> int:
    """Characters of a request's inputs: texts, or the texts of pairs (a None pair counts none)."""
    return sum(len(part) for item in items for part in (item if isinstance(item, tuple) else (item,))
               if isinstance(part, str))


def _store(slots: list[Slot], results: list[Any]) -> None:
    """Put each result at its input's place; answer the requests that are complete."""
    for (job, i), result in zip(slots, results):
        job.results[i] = result
        job.pending -= 1
        if not job.pending:
            _settle(job, result=job.results)


def _settle(job: _Job, result: Any = None, exception: BaseException | None = None) -> None:
    if job.future.done():  # timed out meanwhile: nobody is waiting
        return
    if exception is not None:
        job.future.set_exception(exception)
    else:
        job.future.set_result(result)
