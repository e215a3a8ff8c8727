"""HTTP for one model: /predict, health, info, metrics, OpenAPI. Every error is JSON."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
from collections.abc import AsyncIterator
from importlib import metadata
from typing import Any, TypedDict

import onnxruntime
import orjson
import tokenizers
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infinity import openapi
from infinity.errors import InfinityError, PayloadTooLarge, ValidationError
from infinity.model import LoadedModel
from infinity.service import Prediction, Service
from infinity.settings import Settings

log = logging.getLogger("infinity.app")


class State(TypedDict):
    service: Service


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def error_response(status: int, message: str, error_type: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status, headers=headers)


def version() -> str:
    try:
        return metadata.version("infinity-multiverse")
    except metadata.PackageNotFoundError:
        return "unknown"


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


async def client_gone(receive: Receive) -> None:
    """Returns once the client disconnects (after the body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, work: asyncio.Task[Prediction]) -> Prediction | None:
    """Await work, cancelling it (which drops its queued entry) if the client goes away first."""
    watcher = asyncio.ensure_future(client_gone(request.receive))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        raise
    finally:
        watcher.cancel()
    if work.done():
        return work.result()
    work.cancel()
    return None


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


async def predict(request: Request) -> Response:
    service: Service = request.state.service
    body = await read_body(request, service.settings.max_payload_bytes)
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValidationError(f"the body is not valid JSON: {exc}") from None
    if service.batcher.idle:
        # Nothing to wait behind: the request almost surely starts once tokenized, and a running batch is
        # never cancelled, so watching for a disconnect would buy little and cost two tasks per request.
        prediction = await service.predict(payload)
    else:
        prediction = await until_disconnect(request, asyncio.ensure_future(service.predict(payload)))
    if prediction is None:
        log.info("client disconnected before its answer was ready")
        return Response(status_code=499)
    timings = prediction.timings
    headers = {"x-compute-time": _ms(timings.compute_s), "x-tokenization-time": _ms(timings.tokenization_s),
               "x-queue-time": _ms(timings.queue_s), "x-inference-time": _ms(timings.inference_s),
               "x-total-time": _ms(timings.total_s), "x-compute-tokens": str(prediction.tokens)}
    service.metrics.requests.inc("200")
    return JSONResponse(prediction.result, headers=headers)


async def live(request: Request) -> Response:
    return JSONResponse({"status": "live"})


async def ready(request: Request) -> Response:
    if await request.state.service.ready():
        return JSONResponse({"status": "ready"})
    return error_response(503, "the model is not ready", "unhealthy")


async def info(request: Request) -> Response:
    service: Service = request.state.service
    manifest, settings = service.model.manifest, service.settings
    return JSONResponse({
        "model": {"id": manifest.source.model, "revision": manifest.source.revision,
                  "type": manifest.source.model_type},
        "task": manifest.source.task,
        "target": {"name": manifest.target.name, "providers": manifest.target.providers,
                   "required_cpu_flags": manifest.target.required_cpu_flags},
        "precision": manifest.model.precision,
        "max_length": manifest.tokenizer.max_length,
        "labels": manifest.task.id2label,
        "parity": {"passed": manifest.parity.passed, "overridden": manifest.parity.overridden,
                   "reference": manifest.parity.reference, "metrics": manifest.parity.metrics,
                   "thresholds": manifest.parity.thresholds, "failures": manifest.parity.failures},
        "versions": {"infinity": version(), "onnxruntime": onnxruntime.__version__,
                     "tokenizers": tokenizers.__version__, "python": platform.python_version(),
                     "built_with": manifest.source.library_versions},
        "batching": {"max_batch_tokens": settings.max_batch_tokens, "max_batch_size": settings.max_batch_size,
                     "max_queue": settings.max_queue, "max_inputs_per_request": settings.max_inputs_per_request,
                     "max_payload_bytes": settings.max_payload_bytes, "threads": settings.threads},
    })


async def metrics(request: Request) -> Response:
    return Response(request.state.service.metrics.render(), media_type="text/plain; version=0.0.4")


async def openapi_json(request: Request) -> Response:
    return JSONResponse(openapi.document(request.state.service.model.manifest, version()))


async def infinity_error(request: Request, exc: InfinityError) -> Response:
    service: Service | None = getattr(request.state, "service", None)
    if service is not None:
        service.metrics.failures.inc(exc.error_type)
        service.metrics.requests.inc(str(exc.status_code))
    headers = {"Retry-After": str(service.settings.retry_after if service else 1)} if exc.status_code == 429 else None
    return error_response(exc.status_code, exc.message, exc.error_type, headers)


async def http_error(request: Request, exc: HTTPException) -> Response:
    error_type = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
    return error_response(exc.status_code, str(exc.detail), error_type, dict(exc.headers or {}))


class LastResort:
    """Anything unexpected becomes a JSON 500; the server keeps serving."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            state = scope.get("state") or {}
            if "service" in state:
                state["service"].metrics.failures.inc("internal")
            if not started:
                await error_response(500, "internal server error", "internal")(scope, receive, send)


def create_app(model: LoadedModel, settings: Settings) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        service = Service(model, settings)
        await service.start()
        log.info("ready: %s on %s (%s)", model.manifest.source.task, model.manifest.target.name,
                 model.manifest.model.precision)
        try:
            yield {"service": service}
        finally:
            await service.close()

    routes = [
        Route("/predict", predict, methods=["POST"]),
        Route("/health/live", live, methods=["GET"]),
        Route("/health/ready", ready, methods=["GET"]),
        Route("/info", info, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
    ]
    handlers = {InfinityError: infinity_error, HTTPException: http_error}
    return Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(LastResort)],
                     exception_handlers=handlers)  # type: ignore[arg-type]
