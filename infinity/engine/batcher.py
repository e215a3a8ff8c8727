"""One queue, one engine thread (or `engines` of them): batches by padded tokens and rows, never waits for company.

A batch starts with the oldest entry and is filled with the queued entries nearest its length, as long as little
of it is padding, so rows of like lengths run together; since every batch takes the oldest, no entry waits for more
batches than there are entries ahead of it. Every entry taken into a batch gets its rows or the batch's error; if
a thread stops, every entry still queued or running is failed, so no caller can wait forever. With several engine
threads, each takes the next batch as it is free: batches run side by side on one session (onnxruntime's run is
thread-safe). While the engine is idle, a caller may run one request on its own thread instead (`run_here`).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from infinity.engine.tokenization import Encoded
from infinity.errors import BackendError, InfinityError, NotReady, Overloaded

log = logging.getLogger("infinity.batcher")

Step = Callable[[list[Encoded], bool], np.ndarray]  # (rows, tokens: every token's vector) -> answers


# A batch takes no row that would make it more than this share padding (padded over real tokens), beyond a few
# padded tokens any batch may carry (a short text's padding costs less than running it in a batch of its own)
PADDING_SHARE = 1.1
PADDING_ALLOWED = 16


def padded_tokens(items: list[Encoded]) -> int:
    """What a batch of these rows costs the engine: rows x the longest row."""
    return len(items) * max(len(item) for item in items)


def real_tokens(items: list[Encoded]) -> int:
    """The rows' own tokens, padding excluded."""
    return sum(len(item) for item in items)


@dataclass
class Outcome:
    rows: np.ndarray
    queue_s: float
    inference_s: float
    batch_size: int
    batch_tokens: int


@dataclass
class BatchReport:
    size: int
    tokens: int  # padded: rows x the longest row
    seconds: float
    error: InfinityError | None = None
    real_tokens: int = 0  # the rows' own tokens


@dataclass(eq=False)
class _Entry:
    items: list[Encoded]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Outcome]
    tokens: bool = False  # answered per token, not reduced: batched only with entries alike
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def longest(self) -> int:
        return max(len(item) for item in self.items)

    @property
    def real(self) -> int:
        return real_tokens(self.items)


Delivery = tuple[_Entry, Outcome | None, BaseException | None]  # an entry's outcome or error, for its loop


def _settle(deliveries: list[Delivery]) -> None:
    for entry, outcome, error in deliveries:
        if entry.future.done():
            continue
        if error is not None:
            entry.future.set_exception(error)
        else:
            entry.future.set_result(outcome)  # type: ignore[arg-type]


def _deliver(deliveries: list[Delivery]) -> None:
    """One wake-up per event loop for a whole batch, not one per request."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Delivery]] = {}
    for delivery in deliveries:
        by_loop.setdefault(delivery[0].loop, []).append(delivery)
    for loop, group in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, group)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
            pass


def overfull(rows: int, longest: int, max_batch_size: int, max_batch_tokens: int) -> bool:
    """More rows than max_batch_size, or more padded tokens (rows x longest) than max_batch_tokens."""
    return rows > max_batch_size or rows * longest > max_batch_tokens


def mostly_padding(rows: int, longest: int, real: int) -> bool:
    """More of a batch is padding than PADDING_SHARE and PADDING_ALLOWED let it be."""
    return rows * longest > max(PADDING_SHARE * real, real + PADDING_ALLOWED)


def parts(items: list[Encoded], max_rows: int) -> list[list[int]]:
    """One request's inputs, shortest first, cut into runs that each fill at most a batch with little padding:
    the batcher joins runs of like lengths, from this request and others."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    runs: list[list[int]] = []
    real = 0
    for i in order:
        run = runs[-1] if runs else []
        if not run or len(run) >= max_rows or mostly_padding(len(run) + 1, len(items[i]), real + len(items[i])):
            runs.append([i])
            real = len(items[i])
        else:
            run.append(i)
            real += len(items[i])
    return runs


class Batcher:
    def __init__(self, step: Step, max_batch_tokens: int, max_batch_size: int, max_queue: int,
                 on_batch: Callable[[BatchReport], None] | None = None, engines: int = 1) -> None:
        self.step = step
        self.engines = engines
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.on_batch = on_batch
        self._queue: collections.deque[_Entry] = collections.deque()
        self._running: list[_Entry] = []  # the entries of every batch running now
        self._here = False  # a request runs on its caller's thread (run_here)
        self._cond = threading.Condition()
        self._accepting = True
        self._stop = False
        self._stopped = False
        self._threads: list[threading.Thread] = []

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing running: a request submitted now starts at once."""
        return not self._queue and not self._running and not self._here

    @property
    def alive(self) -> bool:
        return bool(self._threads) and all(thread.is_alive() for thread in self._threads)

    def start(self) -> None:
        names = ["infinity-engine"] if self.engines == 1 else [f"infinity-engine-{n}" for n in range(self.engines)]
        self._threads = [threading.Thread(target=self._run, name=name, daemon=True) for name in names]
        for thread in self._threads:
            thread.start()

    async def submit(self, items: list[Encoded], admit_always: bool = False, tokens: bool = False) -> Outcome:
        """Queue one request's rows and wait for them; cancelling the caller drops the entry if still queued."""
        (outcome,) = await self.submit_parts([items], admit_always, tokens)
        return outcome

    async def submit_parts(self, parts: list[list[Encoded]], admit_always: bool = False,
                           tokens: bool = False) -> list[Outcome]:
        """Queue one request's rows as several entries at once (each at most a batch), refused together when the
        queue is full, and wait for them all; the first failure is the request's. `tokens`: the step answers
        every token's vector instead of the task's reduction."""
        if not parts or not all(parts):
            raise ValueError("nothing to run")
        loop = asyncio.get_running_loop()
        entries = [_Entry(items, loop, loop.create_future(), tokens) for items in parts]
        with self._cond:
            if self._stopped and not self._stop:
                raise BackendError("the engine thread stopped")
            if not self._accepting or self._stopped:
                raise NotReady("the server is shutting down")
            if not self._threads:
                raise NotReady("the engine has not started")
            if not admit_always and len(self._queue) >= self.max_queue:
                raise Overloaded(f"{len(self._queue)} requests are already waiting; retry later")
            self._queue.extend(entries)
            self._cond.notify(len(entries))
        try:
            results = await asyncio.gather(*(entry.future for entry in entries), return_exceptions=True)
        except asyncio.CancelledError:
            with self._cond:
                for entry in entries:
                    if entry in self._queue:
                        self._queue.remove(entry)
            raise
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [result for result in results if isinstance(result, Outcome)]

    async def close(self, timeout: float) -> None:
        """Refuse new work, let queued work finish (up to timeout), then stop the thread."""
        with self._cond:
            self._accepting = False
        deadline = time.monotonic() + timeout
        while (self._queue or self._running) and self.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for thread in self._threads:
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 5.0)

    def _run(self) -> None:
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                self._execute(batch)
        except BaseException:  # the thread ends here; the finally below answers everyone still waiting
            log.exception("the engine thread stopped")
        finally:
            with self._cond:
                self._stopped = True  # the other engine threads end too: the engine is not whole
                waiting = list(self._queue) + self._running
                self._queue.clear()
                self._running = []
                self._cond.notify_all()
            error: InfinityError = NotReady("the server shut down before this request ran") if self._stop \
                else BackendError("the engine thread stopped")
            _deliver([(entry, None, error) for entry in waiting])

    def _next_batch(self) -> list[_Entry] | None:
        with self._cond:
            while not self._queue and not self._stop and not self._stopped:
                self._cond.wait()
            if self._stop or self._stopped:
                return None
            batch = self._fill()
            self._running.extend(batch)
            return batch

    def _fill(self) -> list[_Entry]:
        """The oldest entry, then the queued entries nearest its length, while they fit the batch's rows and padded
        tokens and leave it little padding."""
        head = self._queue.popleft()
        batch, rows, longest, real = [head], len(head.items), head.longest, head.real
        nearest = sorted((entry for entry in self._queue if entry.tokens == head.tokens),
                         key=lambda entry: abs(entry.longest - head.longest))
        for entry in nearest:
            grown_rows, grown_longest = rows + len(entry.items), max(longest, entry.longest)
            if overfull(grown_rows, grown_longest, self.max_batch_size, self.max_batch_tokens) or mostly_padding(
                    grown_rows, grown_longest, real + entry.real):
                continue
            batch.append(entry)
            rows, longest, real = grown_rows, grown_longest, real + entry.real
        taken = set(map(id, batch))
        remaining = [entry for entry in self._queue if id(entry) not in taken]
        self._queue.clear()
        self._queue.extend(remaining)
        return batch

    def run_here(self, items: list[Encoded], tokens: bool = False) -> Outcome | None:
        """Run one request's rows on the calling thread, if the engine is idle and accepting: no hand-off to
        the engine thread and back. None: it is not (submit it instead)."""
        with self._cond:
            if not self.idle or not self._accepting or self._stop or not self.alive:
                return None
            self._here = True
        try:
            rows, _, seconds, padded = self._step(items, tokens)
        finally:
            self._here = False
        return Outcome(rows, 0.0, seconds, len(items), padded)

    def _step(self, items: list[Encoded], tokens: bool) -> tuple[np.ndarray, float, float, int]:
        """The model on one batch, its errors mapped and reported: (rows, start, seconds, padded tokens)."""
        padded, real = padded_tokens(items), real_tokens(items)
        started = time.perf_counter()
        try:
            rows = self.step(items, tokens)
            if len(rows) != len(items):
                raise BackendError(f"the model returned {len(rows)} rows for {len(items)} inputs")
        except BaseException as exc:
            error = exc if isinstance(exc, InfinityError) else BackendError(str(exc) or repr(exc))
            log.error("batch of %d failed: %s", len(items), error)
            self._report(BatchReport(len(items), padded, time.perf_counter() - started, error, real))
            if not isinstance(exc, Exception):
                raise
            raise error from None
        seconds = time.perf_counter() - started
        self._report(BatchReport(len(items), padded, seconds, real_tokens=real))
        return rows, started, seconds, padded

    def _execute(self, batch: list[_Entry]) -> None:
        items = [item for entry in batch for item in entry.items]
        try:
            rows, started, seconds, padded = self._step(items, batch[0].tokens)
        except InfinityError as error:
            self._finished(batch)
            _deliver([(entry, None, error) for entry in batch])
            return
        except BaseException as exc:
            self._finished(batch)
            _deliver([(entry, None, BackendError(str(exc) or repr(exc))) for entry in batch])
            raise
        deliveries: list[Delivery] = []
        offset = 0
        for entry in batch:
            count = len(entry.items)
            outcome = Outcome(rows[offset:offset + count], started - entry.enqueued, seconds, len(items), padded)
            deliveries.append((entry, outcome, None))
            offset += count
        self._finished(batch)  # idle before anyone hears of it: a caller woken by the delivery may run_here at once
        _deliver(deliveries)

    def _finished(self, batch: list[_Entry]) -> None:
        done = set(map(id, batch))
        with self._cond:
            self._running = [entry for entry in self._running if id(entry) not in done]

    def _report(self, report: BatchReport) -> None:
        if self.on_batch is None:
            return
        try:
            self.on_batch(report)
        except Exception:  # a broken observer must not stop the engine
            log.exception("batch observer failed")
