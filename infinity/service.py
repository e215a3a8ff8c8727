"""The serving pipeline for one model: validate -> tokenize (worker pool) -> batcher -> respond."""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from infinity.batcher import Batcher, BatchReport
from infinity.errors import NotReady, PayloadTooLarge, ValidationError
from infinity.metrics import Metrics
from infinity.model import LoadedModel
from infinity.settings import Settings
from infinity.tasks import Request
from infinity.tokenization import Encoded, InputTooLong

log = logging.getLogger("infinity.service")

BODY_KEYS = {"inputs", "parameters", "options"}  # "options" is accepted and ignored, as the HF Inference API sends it
PROBE_TEXT = "ready"
INLINE_CHARS = 1024


@dataclass
class Timings:
    tokenization_s: float
    queue_s: float
    inference_s: float
    postprocess_s: float
    total_s: float

    @property
    def compute_s(self) -> float:
        return self.tokenization_s + self.inference_s + self.postprocess_s


@dataclass
class Prediction:
    result: Any
    timings: Timings
    tokens: int


def unpack(payload: Any) -> tuple[Any, Any]:
    if not isinstance(payload, dict):
        raise ValidationError('the body must be a JSON object {"inputs": ..., "parameters": {...}}')
    unknown = sorted(set(payload) - BODY_KEYS)
    if unknown:
        raise ValidationError(f"unknown fields in the body: {', '.join(map(str, unknown))}")
    if "inputs" not in payload:
        raise ValidationError("the body has no inputs")
    return payload["inputs"], payload.get("parameters")


class Service:
    def __init__(self, model: LoadedModel, settings: Settings) -> None:
        self.model = model
        self.settings = settings
        self.batcher = Batcher(model.forward, settings.max_batch_tokens, settings.max_batch_size,
                               settings.max_queue, on_batch=self._on_batch)
        self.metrics = Metrics(lambda: self.batcher.depth)
        self.workers = ThreadPoolExecutor(settings.tokenizer_workers, thread_name_prefix="infinity-worker")
        self.warm = False
        self.healthy = False
        self._probe_lock = asyncio.Lock()

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

    async def predict(self, payload: Any) -> Prediction:
        started = time.perf_counter()
        if not self.warm:
            raise NotReady("the model is not ready yet")
        inputs, parameters = unpack(payload)
        request = self.model.task.parse(inputs, parameters)
        if len(request.texts) > self.settings.max_inputs_per_request:
            raise PayloadTooLarge(f"{len(request.texts)} inputs in one request; "
                                  f"the limit is {self.settings.max_inputs_per_request}")
        # Small requests are tokenized and answered on the event loop: well under a millisecond of work,
        # cheaper than two thread hops. Larger ones go to the worker pool so the loop stays responsive.
        inline = sum(len(t) if isinstance(t, str) else len(t[0]) + len(t[1]) for t in request.texts) <= INLINE_CHARS
        loop = asyncio.get_running_loop()
        encoded = self._encode(request) if inline else await loop.run_in_executor(self.workers, self._encode, request)
        tokenized = time.perf_counter()
        outcome = await self.batcher.submit(encoded)
        answered = time.perf_counter()
        respond = self.model.task.respond
        result = respond(outcome.rows, request, encoded) if inline else await loop.run_in_executor(
            self.workers, respond, outcome.rows, request, encoded)
        done = time.perf_counter()
        timings = Timings(tokenization_s=tokenized - started, queue_s=outcome.queue_s,
                          inference_s=outcome.inference_s, postprocess_s=done - answered, total_s=done - started)
        self.metrics.tokenization.observe(timings.tokenization_s)
        self.metrics.queue.observe(timings.queue_s)
        self.metrics.request.observe(timings.total_s)
        return Prediction(result, timings, sum(len(item) for item in encoded))

    def _encode(self, request: Request) -> list[Encoded]:
        try:
            return self.model.encode(request)
        except InputTooLong as exc:
            raise ValidationError(str(exc)) from None
        except Exception as exc:  # tokenizers rejects some strings (lone surrogates) with its own errors
            raise ValidationError(f"could not tokenize the inputs: {exc}") from None

    def _on_batch(self, report: BatchReport) -> None:
        self.metrics.batch_size.observe(report.size)
        self.metrics.batch_tokens.observe(report.tokens)
        self.metrics.inference.observe(report.seconds)
        if report.error is not None:
            self.healthy = False
