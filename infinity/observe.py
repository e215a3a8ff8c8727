"""What every request leaves behind besides its answer, whichever way it was read (the connection's lane or the
ASGI app): its request id (the caller's x-request-id, else a new one), echoed in the answer; a request log line
with its route, status and timings when JSON logs are on; a span when tracing is on. Turning either on changes
neither the path a request takes nor the bytes of its answer."""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infinity.logs import request_line, timings
from infinity.settings import Settings

if TYPE_CHECKING:
    from infinity.tracing import Tracing

REQUEST_ID = b"x-request-id"
Header = Callable[[str], "str | None"]  # a request header's value by lower-case name, None if absent


def request_id(given: str | None) -> str:
    return given if given and len(given) <= 200 and given.isprintable() else uuid.uuid4().hex


@dataclass
class Seen:
    """A request from its arrival to its answer."""
    request_id: str
    method: str
    path: str
    started: float  # perf_counter
    span: Any = None

    @property
    def header(self) -> tuple[bytes, bytes]:
        return REQUEST_ID, self.request_id.encode("latin-1")


@dataclass(frozen=True)
class Observers:
    log_requests: bool = False
    tracing: Tracing | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Observers:
        tracing = None
        if settings.otlp_endpoint:
            from infinity.tracing import Tracing

            tracing = Tracing(settings.otlp_endpoint)
        return cls(settings.json_logs, tracing)

    def begin(self, method: str, path: str, header: Header) -> Seen:
        seen = Seen(request_id(header("x-request-id")), method, path, time.perf_counter())
        if self.tracing is not None:
            seen.span = self.tracing.start(method, path, header("traceparent"), header("tracestate"))
        return seen

    def end(self, seen: Seen, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """The answer is written (or about to be): its span and its log line."""
        if self.tracing is None and not self.log_requests:
            return
        measured = timings(headers)
        if self.tracing is not None:
            self.tracing.finish(seen.span, status, measured)
        if self.log_requests:
            fields = {"request_id": seen.request_id, "method": seen.method, "route": seen.path, "status": status,
                      **measured, "total_ms": round((time.perf_counter() - seen.started) * 1000, 3)}
            request_line(f"{seen.method} {seen.path} {status}", fields)


class Observed:
    """The ASGI app's side: every request it answers is seen here, the 401s and 404s included."""

    def __init__(self, app: ASGIApp, observers: Observers) -> None:
        self.app = app
        self.observers = observers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        seen = self.observers.begin(scope["method"], scope["path"], Headers(scope=scope).get)
        answer: dict[str, Any] = {"status": 500, "headers": []}

        async def tagged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), seen.header]
                answer.update(status=message["status"], headers=headers)
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, tagged_send)
        finally:
            self.observers.end(seen, answer["status"], answer["headers"])
