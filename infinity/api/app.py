"""The ASGI app for one model: the routes of every API family this artifact serves. Every error is JSON."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypedDict

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infinity.api import openapi
from infinity.api.auth import ApiKeys
from infinity.api.endpoint import Endpoint, Family, View, handle
from infinity.api.hf import HF
from infinity.api.ops import served_name, version
from infinity.api.router import Router
from infinity.engine.service import Service
from infinity.errors import ErrorType
from infinity.observe import Observed

log = logging.getLogger("infinity.app")


class State(TypedDict):
    service: Service


def http_errors(families: dict[str, Family]) -> Callable[[Request, Exception], Awaitable[Response]]:
    """Starlette's own errors (a method the route does not take) in the error shape of the route's family."""

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        kind = {404: ErrorType.NOT_FOUND, 405: ErrorType.METHOD_NOT_ALLOWED}.get(status, ErrorType.HTTP)
        detail = exc.detail if isinstance(exc, HTTPException) else "internal server error"
        headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else None
        return families.get(request.url.path, HF).failure(kind, str(detail), headers, status=status)

    return http_error


class LastResort:
    """Anything unexpected becomes a JSON 500 in the route family's error shape; the server keeps serving."""

    def __init__(self, app: ASGIApp, failed: Callable[[str], None] = lambda path: None,
                 families: dict[str, Family] | None = None) -> None:
        self.app = app
        self.failed = failed  # counts a failure by the request's path
        self.families = families or {}

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
            self.failed(scope.get("path", ""))
            if not started:
                family = self.families.get(scope.get("path", ""), HF)
                await family.failure(ErrorType.INTERNAL, "internal server error")(scope, receive, send)


def _view(endpoint: Endpoint) -> View:
    if endpoint.view is not None:
        return endpoint.view

    async def view(request: Request) -> Response:
        return await handle(endpoint, request)

    return view


def create_app(router: Router) -> Starlette:
    service, settings = router.service, router.service.settings
    manifest = service.model.manifest

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        await service.start()
        log.info("ready: %s on %s (%s)", manifest.source.task, manifest.target.name, manifest.model.precision)
        try:
            yield {"service": service}
        finally:
            await service.close()

    routes = [Route(e.path, _view(e), methods=[e.method]) for e in router.routes]
    guarded = {e.path: e.family for e in router.routes if e.protected}
    def failed(path: str) -> None:
        service.metrics.failed(router.route_label(path), ErrorType.INTERNAL)

    families = router.families
    middleware = [Middleware(Observed, observers=router.observers),
                  Middleware(LastResort, failed=failed, families=families),
                  Middleware(ApiKeys, keys=settings.api_keys, guarded=guarded)]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: http_errors(families)})
    app.router.redirect_slashes = False  # "/predict/" is a 404 in JSON, not a 307 to follow
    title = f"infinity: {manifest.source.task} with {served_name(manifest, settings)}"
    app.state.openapi = openapi.document(router.served, title, version(), secured=bool(settings.api_keys))
    return app
