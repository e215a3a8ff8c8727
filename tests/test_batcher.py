"""The batcher with a fake step: batch shapes, failures, admission, cancellation, drain."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from infinity.engine.batcher import Batcher, BatchReport
from infinity.engine.tokenization import Encoded
from infinity.errors import BackendError, NotReady, Overloaded

WAIT = 30.0  # a hang guard, never a performance expectation


def item(length: int, marker: int = 1) -> Encoded:
    return Encoded(ids=[marker] * length, type_ids=[0] * length, offsets=[(0, 0)] * length,
                   special=[0] * length)


class FakeStep:
    """Answers each row with (first id, length); can hold a batch until released, or fail."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, int]]] = []
        self.kinds: list[bool] = []  # each batch's `tokens`
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.error: BaseException | None = None

    def hold(self) -> None:
        self.release.clear()

    def __call__(self, items: list[Encoded], tokens: bool = False) -> np.ndarray:
        self.batches.append([(i.ids[0], len(i)) for i in items])
        self.kinds.append(tokens)
        self.entered.set()
        self.release.wait(WAIT)
        if self.error is not None:
            raise self.error
        return np.array([[i.ids[0], len(i)] for i in items])


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(main(), WAIT))


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


def make(step: FakeStep, **limits: Any) -> tuple[Batcher, list[BatchReport]]:
    reports: list[BatchReport] = []
    options = {"max_batch_tokens": 1000, "max_batch_size": 8, "max_queue": 16, **limits}
    batcher = Batcher(step, on_batch=reports.append, **options)
    batcher.start()
    return batcher, reports


def test_a_lone_request_runs_without_waiting_for_company() -> None:
    step = FakeStep()

    async def main() -> None:
        batcher, reports = make(step)
        outcome = await batcher.submit([item(3, 7), item(5, 8)])
        assert outcome.rows.tolist() == [[7, 3], [8, 5]]
        assert (outcome.batch_size, outcome.batch_tokens) == (2, 10)
        await batcher.close(1.0)
        assert [r.size for r in reports] == [2]

    run(main)


def test_waiting_requests_share_a_batch_within_row_and_token_budgets() -> None:
    step = FakeStep()

    async def main() -> None:
        batcher, reports = make(step, max_batch_size=4, max_batch_tokens=39)
        step.hold()
        first = asyncio.ensure_future(batcher.submit([item(2, 1)]))
        await until(step.entered.is_set)
        # queued while the engine is busy: 2 rows + 2 rows fill the row budget; 2 x 20 > 39 tokens
        rest = [asyncio.ensure_future(batcher.submit(rows)) for rows in (
            [item(4, 2), item(4, 3)], [item(5, 4), item(5, 5)], [item(20, 6)], [item(3, 7)])]
        await until(lambda: batcher.depth == 4)
        step.release.set()
        outcomes = await asyncio.gather(first, *rest)
        assert step.batches == [[(1, 2)], [(2, 4), (3, 4), (4, 5), (5, 5)], [(6, 20)], [(7, 3)]]
        assert [o.rows[:, 0].tolist() for o in outcomes] == [[1], [2, 3], [4, 5], [6], [7]]
        assert outcomes[1].batch_tokens == 4 * 5  # padded to the longest row of its own batch only
        await batcher.close(1.0)
        assert [r.size for r in reports] == [1, 4, 1, 1]

    run(main)


def test_a_batch_takes_the_queued_entries_nearest_its_oldest_ones_length() -> None:
    step = FakeStep()

    async def main() -> None:
        batcher, reports = make(step, max_batch_size=2)
        step.hold()
        first = asyncio.ensure_future(batcher.submit([item(2, 1)]))
        await until(step.entered.is_set)
        lengths = (30, 3, 31, 4)  # in queue order, the short and the long interleaved
        queued = [asyncio.ensure_future(batcher.submit([item(length, n)])) for n, length in enumerate(lengths, 2)]
        await until(lambda: batcher.depth == len(lengths))
        step.release.set()
        outcomes = await asyncio.gather(first, *queued)
        await batcher.close(1.0)
        assert step.batches == [[(1, 2)], [(2, 30), (4, 31)], [(3, 3), (5, 4)]]
        assert [o.rows[0, 0] for o in outcomes] == [1, 2, 3, 4, 5]  # each its own answer
        assert sum(r.tokens for r in reports) == 2 + 62 + 8 and sum(r.real_tokens for r in reports) == 2 + 61 + 7

    run(main)


def test_a_long_entry_waits_only_for_the_entries_ahead_of_it_and_never_pads_short_ones() -> None:
    step = FakeStep()

    async def main() -> None:
        batcher, reports = make(step, max_batch_size=4)
        step.hold()
        first = asyncio.ensure_future(batcher.submit([item(2, 1)]))
        await until(step.entered.is_set)
        # three short entries, a long one, short ones behind it: the long one is never the nearest length
        lengths = [10] * 3 + [40] + [10] * 5
        queued = [asyncio.ensure_future(batcher.submit([item(length, n)])) for n, length in enumerate(lengths, 2)]
        await until(lambda: batcher.depth == len(lengths))
        step.release.set()
        await asyncio.gather(first, *queued)
        await batcher.close(1.0)
        # the first batch after the held one is the three ahead of it and one from behind; then the long one alone
        assert [[marker for marker, _ in batch] for batch in step.batches] == [[1], [2, 3, 4, 6], [5], [7, 8, 9, 10]]
        assert all(r.tokens <= max(1.1 * r.real_tokens, r.real_tokens + 16) for r in reports)

    run(main)


def test_token_requests_are_batched_only_with_token_requests() -> None:
    step = FakeStep()

    async def main() -> None:
        batcher, _ = make(step)
        step.hold()
        first = asyncio.ensure_future(batcher.submit([item(2, 1)]))
        await until(step.entered.is_set)
        kinds = (False, True, True, False, False, True)
        queued = [asyncio.ensure_future(batcher.submit([item(2, n)], tokens=kind)) for n, kind in enumerate(kinds, 2)]
        await until(lambda: batcher.depth == len(kinds))
        step.release.set()
        await asyncio.gather(first, *queued)
        await batcher.close(1.0)
        # each batch takes the queued entries of its oldest one's kind, past those of the other kind
        assert step.kinds == [False, False, True]
        assert [[marker for marker, _ in batch] for batch in step.batches] == [[1], [2, 5, 6], [3, 4, 7]]

    run(main)


def test_a_failing_step_answers_every_request_in_its_batch() -> None:
    step = FakeStep()

    async def main() -> None:
        batcher, reports = make(step)
        step.hold()
        first = asyncio.ensure_future(batcher.submit([item(2, 1)]))
        await until(step.entered.is_set)
        queued = [asyncio.ensure_future(batcher.submit([item(3, n)])) for n in (2, 3, 4)]
        await until(lambda: batcher.depth == 3)
        step.error = RuntimeError("kernel exploded")
        step.release.set()
        results = await asyncio.gather(first, *queued, return_exceptions=True)
        assert all(isinstance(r, BackendError) and "kernel exploded" in r.message for r in results)
        assert len(step.batches) == 2 and len(step.batches[1]) == 3
        step.error = None
        assert (await batcher.submit([item(1, 9)])).rows.tolist() == [[9, 1]]  # the thread survives
        await batcher.close(1.0)
        assert [r.error is not None for r in reports] == [True, True, False]

    run(main)


def test_a_dying_engine_thread_fails_everyone_waiting() -> None:
    class Fatal(BaseException):
        pass

    step = FakeStep()

    async def main() -> None:
        batcher, _ = make(step)
        step.hold()
        running = asyncio.ensure_future(batcher.submit([item(2, 1)]))
        await until(step.entered.is_set)
        queued = asyncio.ensure_future(batcher.submit([item(2, 2)]))
        await until(lambda: batcher.depth == 1)
        step.error = Fatal()
        step.release.set()
        results = await asyncio.gather(running, queued, return_exceptions=True)
        assert all(isinstance(r, BackendError) for r in results)
        await until(lambda: not batcher.alive)
        with pytest.raises(BackendError):
            await batcher.submit([item(1)])

    run(main)


def test_a_full_queue_is_refused() -> None:
    step = FakeStep()

    async def main() -> None:
        batcher, _ = make(step, max_queue=2)
        step.hold()
        running = asyncio.ensure_future(batcher.submit([item(2, 1)]))
        await until(step.entered.is_set)
        queued = [asyncio.ensure_future(batcher.submit([item(2, n)])) for n in (2, 3)]
        await until(lambda: batcher.depth == 2)
        with pytest.raises(Overloaded):
            await batcher.submit([item(2, 4)])
        probe = asyncio.ensure_future(batcher.submit([item(1, 5)], admit_always=True))
        step.release.set()
        await asyncio.gather(running, probe, *queued)
        await batcher.close(1.0)

    run(main)


def test_a_cancelled_request_is_dropped_before_it_costs_compute() -> None:
    step = FakeStep()

    async def main() -> None:
        batcher, _ = make(step)
        step.hold()
        running = asyncio.ensure_future(batcher.submit([item(2, 1)]))
        await until(step.entered.is_set)
        gone = asyncio.ensure_future(batcher.submit([item(2, 2)]))
        kept = asyncio.ensure_future(batcher.submit([item(2, 3)]))
        await until(lambda: batcher.depth == 2)
        gone.cancel()
        await until(lambda: batcher.depth == 1)
        step.release.set()
        await asyncio.gather(running, kept)
        assert [row[0] for batch in step.batches for row in batch] == [1, 3]
        await batcher.close(1.0)

    run(main)


def test_idle_means_nothing_queued_and_nothing_running() -> None:
    step = FakeStep()

    async def main() -> None:
        batcher, _ = make(step)
        assert batcher.idle
        step.hold()
        running = asyncio.ensure_future(batcher.submit([item(2, 1)]))
        await until(step.entered.is_set)
        assert not batcher.idle and batcher.depth == 0  # running, nothing queued
        queued = asyncio.ensure_future(batcher.submit([item(2, 2)]))
        await until(lambda: batcher.depth == 1)
        assert not batcher.idle
        step.release.set()
        await asyncio.gather(running, queued)
        await until(lambda: batcher.idle)
        await batcher.close(1.0)

    run(main)


def test_run_here_runs_on_the_callers_thread_only_while_the_engine_is_idle() -> None:
    step = FakeStep()
    threads: list[str] = []
    original = step.__call__

    def recording(items: list[Encoded], tokens: bool = False) -> np.ndarray:
        threads.append(threading.current_thread().name)
        return original(items, tokens)

    async def main() -> None:
        batcher, reports = make(recording)  # type: ignore[arg-type]
        outcome = batcher.run_here([item(3, 7), item(5, 8)])
        assert outcome is not None and outcome.rows.tolist() == [[7, 3], [8, 5]]
        assert (outcome.queue_s, outcome.batch_size, outcome.batch_tokens) == (0.0, 2, 10)
        assert threads == [threading.current_thread().name] and batcher.idle
        step.entered.clear()
        step.hold()
        running = asyncio.ensure_future(batcher.submit([item(2, 1)]))
        await until(step.entered.is_set)
        assert batcher.run_here([item(2, 2)]) is None  # the engine is busy: the caller must queue
        step.release.set()
        await running
        assert threads[1] == "infinity-engine"
        step.error = RuntimeError("kernel exploded")
        with pytest.raises(BackendError, match="kernel exploded"):
            batcher.run_here([item(1, 3)])
        step.error = None
        await batcher.close(1.0)
        assert batcher.run_here([item(1, 4)]) is None  # closed: nothing runs anywhere
        assert [(r.size, r.error is not None) for r in reports] == [(2, False), (1, False), (1, True)]

    run(main)


def test_close_drains_queued_work_then_refuses_new_work() -> None:
    step = FakeStep()

    async def main() -> None:
        batcher, _ = make(step)
        step.hold()
        pending = [asyncio.ensure_future(batcher.submit([item(2, n)])) for n in (1, 2, 3)]
        await until(step.entered.is_set)
        closing = asyncio.ensure_future(batcher.close(WAIT))
        await asyncio.sleep(0)
        with pytest.raises(NotReady):
            await batcher.submit([item(1)])
        step.release.set()
        outcomes = await asyncio.gather(*pending)
        await closing
        assert [o.rows[0, 0] for o in outcomes] == [1, 2, 3]
        assert not batcher.alive

    run(main)


def test_close_after_its_timeout_fails_what_never_ran() -> None:
    step = FakeStep()

    async def main() -> None:
        batcher, _ = make(step)
        step.hold()
        running = asyncio.ensure_future(batcher.submit([item(2, 1)]))
        await until(step.entered.is_set)
        stuck = asyncio.ensure_future(batcher.submit([item(2, 2)]))
        await until(lambda: batcher.depth == 1)
        closing = asyncio.ensure_future(batcher.close(0.0))
        await asyncio.sleep(0)  # close() stops the thread before its first await
        step.release.set()
        await closing
        assert (await running).rows.tolist() == [[1, 2]]
        with pytest.raises(NotReady):
            await stuck

    run(main)


def test_engines_run_batches_side_by_side_and_each_entry_gets_its_own_rows() -> None:
    """Two engine threads: the step only returns once two batches are inside it at the same time (one engine
    alone would break the barrier), and a request cut into many parts wakes both."""
    inside = threading.Barrier(2, timeout=WAIT)
    seen: list[list[int]] = []

    def step(items: list[Encoded], tokens: bool = False) -> np.ndarray:
        seen.append([i.ids[0] for i in items])
        if len(seen) <= 2:
            inside.wait()
        return np.array([[i.ids[0], len(i)] for i in items])

    async def main() -> None:
        batcher = Batcher(step, max_batch_tokens=1000, max_batch_size=2, max_queue=16, engines=2)
        batcher.start()
        parts = [[item(3, 2 * n), item(3, 2 * n + 1)] for n in range(6)]
        outcomes = await batcher.submit_parts(parts)
        assert [o.rows.tolist() for o in outcomes] == [[[2 * n, 3], [2 * n + 1, 3]] for n in range(6)]
        assert sorted(sum(seen, [])) == list(range(12)) and len(seen) == 6
        assert batcher.idle
        await batcher.close(1.0)
        assert not batcher.alive

    run(main)


def test_one_dying_engine_thread_stops_the_others_and_fails_everyone() -> None:
    class Fatal(BaseException):
        pass

    step = FakeStep()

    async def main() -> None:
        batcher, _ = make(step, engines=2)
        engines = [t for t in threading.enumerate() if t.name.startswith("infinity-engine-") and t.is_alive()]
        assert len(engines) == 2
        step.error = Fatal()
        result = await asyncio.gather(batcher.submit([item(2, 1)]), return_exceptions=True)
        assert isinstance(result[0], BackendError)
        await until(lambda: not any(t.is_alive() for t in engines))
        assert not batcher.alive
        with pytest.raises(BackendError):
            await batcher.submit([item(1)])

    run(main)
