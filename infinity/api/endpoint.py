"""One route = one Endpoint: its body schema, how the body becomes a core request, and how the rows become
its answer. The handler below is the only place that admits, reads, checks, watches for disconnects, times,
counts and renders errors, for every family alike."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from infinity.engine.job import Job
from infinity.engine.service import INLINE_CHARS, Permit, Result, Service
from infinity.errors import ErrorType, InfinityError, NotReady, PayloadTooLarge, TimedOut, TooLong, ValidationError
from infinity.schema import Schema

log = logging.getLogger("infinity.api")

Render = Callable[[Any], Any]  # the core's Result, or None for the routes that run no model
Prepare = Callable[[Any], tuple[Job | None, Render]]
View = Callable[[Request], Awaitable[Response]]


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def _same(status: int) -> int:
    return status


@dataclass(frozen=True)
class Field:
    """One field of an error body: its value, from the answer's status, message and error type, and its schema."""
    value: Callable[[int, str, ErrorType], Any]
    doc: dict[str, Any]


MESSAGE = Field(lambda status, message, kind: message, {"type": "string"})
TYPE = Field(lambda status, message, kind: kind.value, {"type": "string", "enum": [kind.value for kind in ErrorType]})
NULL = Field(lambda status, message, kind: None, {"type": "string", "nullable": True})


@dataclass(frozen=True)
class ErrorBody:
    """An API family's error body, from which both its answers and its OpenAPI schema are made."""
    fields: dict[str, Field | ErrorBody]

    def render(self, status: int, message: str, kind: ErrorType) -> dict[str, Any]:
        return {name: value.render(status, message, kind) if isinstance(value, ErrorBody)
                else value.value(status, message, kind) for name, value in self.fields.items()}

    @property
    def doc(self) -> dict[str, Any]:
        return {"type": "object", "required": list(self.fields),
                "properties": {name: value.doc for name, value in self.fields.items()}}


@dataclass(frozen=True)
class Family:
    """An API dialect: the shape of its error bodies, and the status it uses where ours differs."""
    name: str
    body: ErrorBody
    status: Callable[[int], int] = _same

    def error(self, kind: ErrorType, message: str, status: int | None = None) -> tuple[int, dict[str, Any]]:
        """The status and body of an error; `status` only where the error names its own (bad_request, http)."""
        code = self.status(kind.status if status is None else status)
        return code, self.body.render(code, message, kind)

    def failure(self, kind: ErrorType, message: str, headers: dict[str, str] | None = None,
                status: int | None = None) -> Response:
        code, body = self.error(kind, message, status)
        return JSONResponse(body, status_code=code, headers=headers)


@dataclass(frozen=True)
class Endpoint:
    path: str
    family: Family
    summary: str
    answer_doc: dict[str, Any]
    body: Schema | None = None  # inference routes: the request schema ...
    prepare: Prepare | None = None  # ... and what turns a checked body into a core request and its answer
    view: View | None = None  # other routes (health, info, metrics): a plain handler
    method: str = "POST"
    protected: bool = True  # needs an API key when the server has keys
    errors: dict[int, str] = field(default_factory=dict)  # documented error statuses
    media_type: str = "application/json"  # of a 200 answer
    truncation_switch: str = ""  # the body field that turns truncation on, as a too-long input's 422 names it

    def __post_init__(self) -> None:
        if (self.view is None) == (self.body is None or self.prepare is None):
            raise ValueError(f"{self.path}: an endpoint has either a view, or a body schema and a prepare")

    @property
    def inference(self) -> bool:
        return self.prepare is not None


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it is known to exceed the limit (declared or actually sent)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _client_gone(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[Result]) -> Result | None:
    """Await work, cancelling it (which drops its queued entry) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


def parse_json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValidationError(f"the body is not valid JSON: {exc}") from None


async def handle(endpoint: Endpoint, request: Request) -> Response:
    service: Service = request.state.service
    return await respond(endpoint, service, lambda: read_body(request, service.settings.max_payload_bytes),
                         lambda work: _unless_disconnected(request, work))


def run(service: Service, core: Job, lone: bool = True) -> Awaitable[Result]:
    """The core's answer; with a request_timeout, a 504 once it has passed (dropping the queued entry)."""
    timeout = service.settings.request_timeout
    return _within(service.run(core, lone), timeout) if timeout else service.run(core, lone)


async def _within(work: Awaitable[Result], timeout: float) -> Result:
    try:
        return await asyncio.wait_for(work, timeout)
    except asyncio.TimeoutError:
        raise TimedOut(f"no answer within {timeout:g} s (request_timeout)") from None


def _never() -> bool:
    return False


@dataclass
class Answered:
    answer: Any              # the route's answer, before its transport renders it
    result: Result | None    # the core's rows and timings; None for the routes that run no model
    computed: float          # perf_counter when the core answered, before the render


async def compute(endpoint: Endpoint, service: Service, body: Any, size: int,
                  watch: Callable[[Awaitable[Result]], Awaitable[Result | None]] | None = None,
                  permit: Permit | None = None, lone: bool = True) -> Answered | None:
    """A parsed body's answer, for every transport: admission, the body's check, the task's request, the core and
    the render. `size`: the body's bytes, which decide where a route that runs no model renders; `watch` awaits the
    core unless the client leaves first (None: the client left; no watch: await it); `permit`, if given, was
    admitted already; `lone` (Service.run). Raises the InfinityError each transport renders in its own shape."""
    with service.admission(permit):
        core, render = endpoint.prepare(endpoint.body.check(body, "body"))  # type: ignore[union-attr,misc]
        result = None
        if core is not None:
            if watch is None or service.batcher.idle:
                # Nothing to wait behind: the request starts once tokenized, and a running batch is never
                # cancelled, so watching for a disconnect would buy little and cost two tasks per request.
                result = await run(service, core, lone)
            else:
                result = await watch(run(service, core, lone))
                if result is None:
                    return None
        computed = time.perf_counter()
        small = (core.chars if core is not None else size) <= INLINE_CHARS
        return Answered(await service.offload(render, result, small=small), result, computed)


async def respond(endpoint: Endpoint, service: Service, read: Callable[[], Awaitable[bytes]],
                  watch: Callable[[Awaitable[Result]], Awaitable[Result | None]] | None = None,
                  gone: Callable[[], bool] = _never, permit: Permit | None = None) -> Response:
    """One inference request, from admission to its response: `read` gives the body; `watch` awaits the
    result unless the client leaves first (None: await it); `gone` says whether a cancellation came from
    the client leaving rather than from the drain deadline; `permit`, if given, was admitted already."""
    started = time.perf_counter()
    try:
        # the body is whole before a permit in flight is taken: stalled bodies can never fill the server
        body = await read()
        answered = await compute(endpoint, service, parse_json(body), len(body), watch, permit)
        if answered is None:
            return closed(endpoint, service)
    except TooLong as exc:
        return failure(endpoint, service, exc.advising(endpoint.truncation_switch))
    except InfinityError as exc:
        return failure(endpoint, service, exc)
    except ClientDisconnect:
        return closed(endpoint, service)
    except asyncio.CancelledError:
        if gone():
            return closed(endpoint, service)
        # Otherwise only the server cancels a handler: its drain deadline passed with this request unanswered.
        return failure(endpoint, service, NotReady("the server shut down before this request was answered"))
    done = time.perf_counter()
    result = answered.result
    timings = result.timings if result is not None else None
    headers = {"x-total-time": _ms(done - started)}
    if timings is not None:
        timings.postprocess_s, timings.total_s = done - answered.computed, done - started
        headers.update({"x-compute-time": _ms(timings.compute_s), "x-tokenization-time": _ms(timings.tokenization_s),
                        "x-queue-time": _ms(timings.queue_s), "x-inference-time": _ms(timings.inference_s),
                        "x-compute-tokens": str(result.tokens)})  # type: ignore[union-attr]
        if result.windows is not None:  # type: ignore[union-attr]
            headers["x-compute-windows"] = str(result.windows)  # type: ignore[union-attr]
    else:
        headers["x-compute-time"] = _ms(done - answered.computed)
    service.metrics.request.labels(endpoint.path).observe(done - started)
    service.metrics.answered(endpoint.path, 200)
    return JSONResponse(answered.answer, headers=headers)


def failure(endpoint: Endpoint, service: Service, exc: InfinityError) -> Response:
    service.metrics.failed(endpoint.path, exc.error_type, endpoint.family.status(exc.status_code))
    headers = {"Retry-After": str(service.settings.retry_after)} if exc.error_type is ErrorType.OVERLOADED else None
    return endpoint.family.failure(exc.error_type, exc.message, headers)


def closed(endpoint: Endpoint, service: Service) -> Response:
    log.info("%s: the client disconnected before its answer was ready", endpoint.path)
    service.metrics.failed(endpoint.path, ErrorType.CLIENT_CLOSED)
    return Response(status_code=ErrorType.CLIENT_CLOSED.status)


def not_served(path: str, family: Family, needs: str, task: str) -> View:
    """A route of another task: a 404 in the route's own error shape that says why."""
    message = f"{path} needs a {needs} model; this server runs {task}"
    if needs == task:  # a route of this task that this artifact cannot answer: token vectors pooled in its graph
        message = f"{path} is not available: this {task} artifact's graph answers pooled vectors only"

    async def view(request: Request) -> Response:
        return family.failure(ErrorType.NOT_FOUND, message)

    return view
