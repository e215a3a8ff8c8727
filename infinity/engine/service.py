"""The core every route calls: admit -> tokenize -> batcher -> engine -> rows, with timings and token counts.

Routes never see the engine; the core never sees a route's JSON.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from infinity.engine.batcher import Batcher, BatchReport, Outcome, padded_tokens, parts, real_tokens
from infinity.engine.job import Job
from infinity.engine.model import LoadedModel
from infinity.engine.tokenization import Encoded, InputTooLong
from infinity.errors import NotReady, Overloaded, PayloadTooLarge, TooLong, ValidationError
from infinity.metrics import Metrics
from infinity.settings import Settings

log = logging.getLogger("infinity.service")

PROBE_TEXT = "ready"
INLINE_CHARS = 1024
LONE_S = 1.0  # requests have come one at a time for this long: the next small one may run on the event loop
T = TypeVar("T")


@dataclass
class Timings:
    tokenization_s: float = 0.0
    queue_s: float = 0.0
    inference_s: float = 0.0
    postprocess_s: float = 0.0
    total_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return self.tokenization_s + self.inference_s + self.postprocess_s


@dataclass
class Result:
    """The task-reduced rows of one request, aligned with its inputs."""
    rows: np.ndarray
    encoded: list[Encoded]  # each input's, aligned with rows (a text run in windows: as its task joins them)
    timings: Timings
    tokens: int  # the real tokens the engine read, every window's
    windows: int | None = None  # how many windows the texts ran in, where they did


class Permit:
    """One admitted request's permission to be in flight; releasing it twice frees it once."""

    def __init__(self, service: Service) -> None:
        self.service: Service | None = service

    def release(self) -> None:
        if self.service is not None:
            self.service.in_flight -= 1
            self.service = None


def joined(outcomes: list[Outcome]) -> Outcome:
    """The parts of one request as one outcome: rows in order (token rows padded to the longest part's width;
    each input's own length cuts them again), the longest wait, and the engine time of every part."""
    rows = [outcome.rows for outcome in outcomes]
    widest = np.max([row.shape for row in rows], axis=0)
    padded = [np.pad(row, [(0, 0), *((0, int(w) - n) for w, n in zip(widest[1:], row.shape[1:]))]) for row in rows]
    return Outcome(np.concatenate(padded), max(outcome.queue_s for outcome in outcomes),
                   sum(outcome.inference_s for outcome in outcomes), sum(outcome.batch_size for outcome in outcomes),
                   sum(outcome.batch_tokens for outcome in outcomes))


class Service:
    def __init__(self, model: LoadedModel, settings: Settings) -> None:
        self.model = model
        self.settings = settings
        self.batcher = Batcher(model.forward, settings.max_batch_tokens, settings.max_batch_size,
                               settings.max_queue, on_batch=self._on_batch, engines=settings.engines)
        self.metrics = Metrics(lambda: self.batcher.depth)
        self.metrics.serving(model.manifest.target.name, model.bundle.bundle.names if model.bundle else ())
        self.workers = ThreadPoolExecutor(settings.tokenizer_workers, thread_name_prefix="infinity-worker")
        self.warm = False
        self.healthy = False
        self._probe_lock = asyncio.Lock()
        # requests between admission and answer: a full queue plus one full batch, so a 429 is decided by
        # counting, once a body is whole and before it is parsed or tokenized
        self.in_flight = 0
        self.max_in_flight = settings.max_queue + settings.max_batch_size
        self.overlapped = 0.0  # when a request was last admitted while another was in flight

    async def start(self) -> None:
        """Start the engine thread and warm it up; a failed warm-up leaves the service unhealthy, not dead."""
        self.batcher.start()
        try:
            await self.probe()
        except Exception as exc:
            log.error("warm-up failed: %s", exc)
        self.warm = True

    async def close(self) -> None:
        self.warm = False
        await self.batcher.close(self.settings.drain_timeout)
        self.workers.shutdown(wait=False, cancel_futures=True)

    async def probe(self) -> None:
        """A real tiny forward pass through the engine thread; success makes the service healthy again."""
        items = self.model.tokenizer.encode([PROBE_TEXT])
        await self.batcher.submit(items, admit_always=True)
        self.healthy = True

    async def ready(self) -> bool:
        if not self.warm or not self.batcher.alive:
            return False
        if self.healthy:
            return True
        async with self._probe_lock:
            if not self.healthy:
                try:
                    await self.probe()
                except Exception as exc:
                    log.warning("readiness probe failed: %s", exc)
        return self.healthy

    @property
    def full(self) -> bool:
        """A new request would be refused now: a full queue plus one full batch are already admitted."""
        return self.in_flight >= self.max_in_flight or self.batcher.depth >= self.settings.max_queue

    def admit(self) -> Permit:
        """A permit in flight for one request, held until its answer is ready; none free is a 429 at once."""
        if not self.warm:
            raise NotReady("the model is not ready yet")
        if self.full:
            raise Overloaded(f"{self.in_flight} requests are already in flight; retry later")
        if self.in_flight:
            self.overlapped = time.perf_counter()
        self.in_flight += 1
        return Permit(self)

    @contextlib.contextmanager
    def admission(self, permit: Permit | None = None) -> Iterator[None]:
        """Hold a permit (taken here unless given) from a whole body until the answer is ready."""
        permit = permit or self.admit()
        try:
            yield
        finally:
            permit.release()

    async def run(self, request: Job, lone: bool = True) -> Result:
        """Tokenize, queue and run one request: as one batch entry, or, past max_batch_size inputs, as entries of
        at most that many queued together and joined into one answer. `lone` False: never on the event loop (for a
        transport whose next requests wait unread while the loop is busy, which would keep every one alone)."""
        started = time.perf_counter()
        if request.size > self.settings.max_inputs_per_request:
            raise PayloadTooLarge(f"{request.size} inputs in one request; the limit is "
                                  f"{self.settings.max_inputs_per_request} (--max-inputs-per-request)")
        windows = None
        if self._chunked(request):
            windows = await self.offload(self._windows, request, small=request.chars <= INLINE_CHARS)
            encoded = [window for text in windows for window in text]
        else:
            encoded = await self.offload(self._encode, request, small=request.chars <= INLINE_CHARS)
        tokenized = time.perf_counter()
        runs = parts(encoded, self.settings.max_batch_size) if len(encoded) > 1 else [[0]]
        outcome: Outcome | None = None
        if len(runs) > 1:
            # each run pads to its own longest input, and the batcher joins runs of like lengths
            outcome = joined(await self.batcher.submit_parts([[encoded[i] for i in run] for run in runs],
                                                             tokens=request.tokens))
            order = np.concatenate(runs)
            outcome.rows = outcome.rows[np.argsort(order, kind="stable")]  # the client's order again
        elif lone and self._lone(encoded, tokenized):
            outcome = self.batcher.run_here(encoded, request.tokens)
        if outcome is None:
            outcome = await self.batcher.submit(encoded, tokens=request.tokens)
        timings = Timings(tokenization_s=tokenized - started, queue_s=outcome.queue_s,
                          inference_s=outcome.inference_s)
        self.metrics.tokenization.observe(timings.tokenization_s)
        self.metrics.queue.observe(timings.queue_s)
        if windows is None:
            return Result(outcome.rows, encoded, timings, real_tokens(encoded))
        rows, texts = self.model.task.joined(outcome.rows, windows, request.tokens)
        return Result(rows, texts, timings, real_tokens(encoded), windows=len(encoded))

    async def offload(self, work: Callable[..., T], *args: Any, small: bool) -> T:
        """Small work runs on the event loop (cheaper than two thread hops); larger work in the worker pool."""
        if small:
            return work(*args)
        return await asyncio.get_running_loop().run_in_executor(self.workers, work, *args)

    def _lone(self, encoded: list[Encoded], now: float) -> bool:
        """Requests have come one at a time for a while, and this one is small: it runs on the event loop, which
        has nothing else to do, and saves two thread wake-ups. Once requests overlap, they go to the engine
        thread again, where the next ones are read and tokenized while a batch runs."""
        return (now - self.overlapped > LONE_S and self.in_flight <= 1
                and padded_tokens(encoded) <= self.settings.lone_request_tokens)

    def _chunked(self, request: Job) -> bool:
        """Texts past the maximum length run whole, in windows, as the request or else the server says: texts only
        (token ids run as given), where the task runs them so."""
        chunk = self.settings.chunk_long_inputs if request.chunk is None else request.chunk
        return chunk and request.token_ids is None and self.model.task.in_windows(request)

    def _windows(self, request: Job) -> list[list[Encoded]]:
        try:
            windows = self.model.windows(request, self.settings.chunk_overlap)
        except Exception as exc:  # tokenizers rejects some strings (lone surrogates) with its own errors
            raise ValidationError(f"could not tokenize the inputs: {exc}") from None
        limit = self.settings.max_chunks_per_input
        for index, text in enumerate(windows):
            if len(text) > limit:
                length = min(request.max_length or self.model.tokenizer.max_length, self.model.tokenizer.max_length)
                raise PayloadTooLarge(f"input {index} takes {len(text)} windows of {length} tokens; the limit is "
                                      f"{limit} (--max-chunks-per-input)")
        if request.tokens or self.model.task.rows_per_token:
            # an answer of every token's numbers is held to what a request without chunking can ask for
            most = self.settings.max_inputs_per_request * self.model.tokenizer.max_length
            tokens = sum(len(window) for text in windows for window in text)
            if tokens > most:
                raise PayloadTooLarge(f"the texts take {tokens} tokens in their windows, and an answer of every "
                                      f"token's vectors holds at most {most} (--max-inputs-per-request x the maximum "
                                      f"length); send fewer or shorter texts")
        return windows

    def _encode(self, request: Job) -> list[Encoded]:
        try:
            return self.model.encode(request)
        except InputTooLong as exc:
            raise TooLong(too_long(exc, request), cuttable=request.token_ids is None) from None
        except Exception as exc:  # tokenizers rejects some strings (lone surrogates) with its own errors
            raise ValidationError(f"could not tokenize the inputs: {exc}") from None

    def _on_batch(self, report: BatchReport) -> None:
        self.metrics.batch_size.observe(report.size)
        self.metrics.batch_tokens.observe(report.tokens)
        self.metrics.padded_tokens.inc(report.tokens)
        self.metrics.real_tokens.inc(report.real_tokens)
        self.metrics.inference.observe(report.seconds)
        if report.error is not None:
            self.healthy = False


def too_long(exc: InputTooLong, request: Job) -> str:
    """The 422 for an input the model cannot take whole: which input, whose maximum, and what the client can do (the
    API layer adds how its own body turns truncation on)."""
    role = request.role if request.role and request.max_length == exc.max_length else None
    limit = f"the maximum of {exc.max_length} for a {role}" if role else f"the model's maximum of {exc.max_length}"
    if request.token_ids is not None:  # run as given, never cut
        return f"input {exc.index} has {exc.length} token ids, more than {limit}; send at most {exc.max_length}"
    what = f"input {exc.index}" + (", a text pair," if isinstance(request.texts[exc.index], tuple) else "")
    return f"{what} has {exc.length} tokens, more than {limit}; send shorter text"
