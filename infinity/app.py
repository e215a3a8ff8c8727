"""The ASGI app for one model: the routes of every API family this artifact serves. Every error is JSON."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import TypedDict

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infinity import api, openapi
from infinity.api.endpoint import Endpoint, View, closed, failure, handle, respond
from infinity.api.hf import HF
from infinity.api.ops import served_name, version
from infinity.auth import ApiKeys
from infinity.errors import InfinityError
from infinity.lane import Admit, Lane, Serve
from infinity.protection import Shedding, canned
from infinity.model import LoadedModel
from infinity.service import Place, Service
from infinity.settings import Settings

log = logging.getLogger("infinity.app")


class State(TypedDict):
    service: Service


async def http_error(request: HTTPRequest, exc: HTTPException) -> Response:
    error_type = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
    return HF.failure(exc.status_code, str(exc.detail), error_type, dict(exc.headers or {}))


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
                state["service"].metrics.failures.inc(scope.get("path", ""), "internal")
            if not started:
                await HF.failure(500, "internal server error", "internal")(scope, receive, send)


def lane_core(endpoints: dict[str, Endpoint], service: Service) -> tuple[Admit, Serve]:
    """The lane's way into the routes' core: admission when a body is complete, then the core, with the usual
    path's last resort around it."""

    def admit(path: str) -> Place | Response:
        try:
            return service.admit()
        except InfinityError as exc:
            return failure(endpoints[path], service, exc)

    async def serve(path: str, body: bytes, place: Place, gone: Callable[[], bool]) -> Response:
        async def read() -> bytes:
            return body

        try:
            return await respond(endpoints[path], service, read, gone=gone, place=place)
        except Exception:
            log.exception("unhandled error on POST %s", path)
            service.metrics.failures.inc(path, "internal")
            return HF.failure(500, "internal server error", "internal")

    return admit, serve


def refusal(endpoint: Endpoint, retry_after: int) -> bytes:
    """The whole 429 response of one route, in its family's error shape, for refusals made on the socket."""
    status = endpoint.family.status(429)
    body = endpoint.family.error(status, "the server is at capacity; retry later", "overloaded")
    return canned(status, HTTPStatus(status).phrase, "", "", f"retry-after: {retry_after}\r\n", body=body, close=False)


def _view(endpoint: Endpoint) -> View:
    if endpoint.view is not None:
        return endpoint.view

    async def view(request: HTTPRequest) -> Response:
        return await handle(endpoint, request)

    return view


def create_app(model: LoadedModel, settings: Settings) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        service = Service(model, settings)
        await service.start()
        shedding.full = lambda: service.full
        shedding.refused = lambda path: service.metrics.refused(path.decode("latin-1"))
        shedding.rejected = service.metrics.rejected.inc
        if lane is not None:
            lane.admit, lane.serve = lane_core(inference, service)
            lane.closed = lambda path: closed(inference[path], service)
        log.info("ready: %s on %s (%s)", model.manifest.source.task, model.manifest.target.name,
                 model.manifest.model.precision)
        try:
            yield {"service": service}
        finally:
            shedding.full = Shedding.full
            if lane is not None:
                lane.admit = lane.serve = None
            await service.close()

    served = api.endpoints(model, settings)
    inference = {e.path: e for e in served if e.inference}
    request_lines = {f"POST {path} ".encode(): path for path in inference}  # what a request starts with
    shedding = Shedding(answers={line: refusal(inference[path], settings.retry_after)
                                 for line, path in request_lines.items()})
    # API keys are checked by a middleware the lane would skip: with keys, every request takes the usual path
    lane = None if settings.api_keys else Lane(request_lines, settings.max_payload_bytes)
    everything = served + api.elsewhere(served, model.task.name)
    routes = [Route(e.path, _view(e), methods=[e.method]) for e in everything]
    guarded = {e.path: e.family for e in everything if e.protected}
    middleware = [Middleware(LastResort), Middleware(ApiKeys, keys=settings.api_keys, guarded=guarded)]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: http_error})  # type: ignore[dict-item]
    title = f"infinity: {model.manifest.source.task} with {served_name(model.manifest, settings)}"
    app.state.shedding = shedding
    app.state.lane = lane
    app.state.openapi = openapi.document(served, title, version(), secured=bool(settings.api_keys))
    return app
