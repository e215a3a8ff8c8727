"""The short lane: a plain `POST` to an inference route, read and answered by the connection itself.

On the usual path every header becomes part of an ASGI scope, a request cycle and its task are started, and the
body and the answer travel as ASGI messages through the Starlette stack: for an 8-token embedding that is about
half of the event loop's work per request. Here the head is checked with a few byte searches, the body is
gathered as it arrives, and the router answers it; the bytes written are those the usual path writes.
Anything else (chunked or unsized bodies, Expect, Connection other than keep-alive, HTTP/1.0, a request behind
an answer still pending) goes to the parser as before, and so does a request without a valid key, which the app
answers 401.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.responses import Response

from infinity.errors import ErrorType
from infinity.http.connection import serialized
from infinity.http.heads import declared_body, header, route_of
from infinity.http.protocol import GuardedConnection
from infinity.observe import Observers, Seen

log = logging.getLogger("infinity.http")


class Permit(Protocol):
    """A request's permit to be in flight, taken once its body is whole (so the next request on the socket sees it)."""

    def release(self) -> None: ...


class Router(Protocol):
    """The routes and what answers them, built before the server starts."""

    def admit(self, path: str) -> Permit | Response:
        """A permit in flight, or the route's refusal (429, 503)."""

    async def serve(self, path: str, body: bytes, permit: Any, gone: Callable[[], bool]) -> Response:
        """The answer to a whole body, with the permit admit() gave; `gone` says whether the client has left."""

    def closed(self, path: str) -> None:
        """Counts a client that left before its answer was ready."""


@dataclass
class Lane:
    """What the connection needs of the router: its inference routes and how to answer them."""
    routes: dict[bytes, str]  # request line up to the target, "POST /path " -> path
    max_body: int  # a larger declared body takes the usual path, which answers 413
    router: Router
    observers: Observers


def wire(response: Response, default_headers: list[tuple[bytes, bytes]], close: bool,
         extra: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """A response as the usual path writes it: the server's date and server headers, the response's own
    headers, the request id."""
    return serialized(response.status_code, (*default_headers, *response.raw_headers, *extra), bytes(response.body),
                      close)


class LaneConnection(GuardedConnection):
    lane: Lane

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.path: str | None = None  # the lane's request on this connection, from its head to its answer
        self.request_head = b""  # ... its head, kept to hand the request to the parser if need be
        self.body = bytearray()
        self.wanted = 0
        self.task: asyncio.Task[None] | None = None  # ... being answered
        self.permit: Permit | None = None  # ... and its permit in flight
        self.backlog = bytearray()  # what arrived meanwhile, read once the answer is written
        self.gone = False  # the client left while its request was answered
        self.closing = False  # the server drains: close after this answer

    # bytes in

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.task is not None:
            self.backlog += data
            self.flow.pause_reading()
        elif self.path is not None:
            self._gather(data)
        else:
            super().data_received(data)

    def _whole_head(self, data: bytes, end: int) -> None:
        serving = not self.gate.full()  # a full server refuses on the socket
        path = self.lane.routes.get(route_of(data)) if serving else None
        wanted = declared_body(data, end) if path is not None else None
        if wanted is None or wanted > self.lane.max_body or not self.gate.authorized(data[:end]):
            super()._whole_head(data, end)
            return
        self._disarm()
        self.stop_keep_alive()
        self.path, self.request_head, self.wanted = path, data[:end], wanted
        if len(data) - end >= wanted:  # the usual case: the body came with its head
            self._answer(data[end:end + wanted], data[end + wanted:])
        else:
            self.body += data[end:]
            self._arm(self.limits.body_timeout)

    def _gather(self, data: bytes) -> None:
        self.body += data
        if len(self.body) >= self.wanted:
            self._disarm()
            body, rest = bytes(self.body[:self.wanted]), bytes(self.body[self.wanted:])
            self.body.clear()
            self._answer(body, rest)

    def _to_parser(self) -> None:
        """The request goes the usual way after all, as if it had never been seen here."""
        sent = self.request_head + bytes(self.body)
        self.path, self.request_head = None, b""
        self.body.clear()
        self._disarm()
        self._feed(sent)

    # the answer

    def _answer(self, body: bytes, rest: bytes) -> None:
        self.backlog += rest
        path = self.path or ""
        seen = self.lane.observers.begin("POST", path, self._header)
        permit = self.lane.router.admit(path)
        if isinstance(permit, Response):  # refused at once, in the route's own shape
            self._write(seen, permit)
            if permit.status_code == 429 and not self.closing:
                self.path, self.request_head = None, b""  # answered: nothing of it is left to drain or count
                self._hold(self._next)
            else:
                self._next()
            return
        self.permit, self.gone = permit, False
        self.task = self.loop.create_task(self._respond(seen, body, permit))
        self.track(self.task)
        self.task.add_done_callback(self._answered)

    async def _respond(self, seen: Seen, body: bytes, permit: Permit) -> None:
        try:
            response = await self.lane.router.serve(seen.path, body, permit, lambda: self.gone)
        except asyncio.CancelledError:  # the task never began: nothing can be written
            self.lane.observers.end(seen, ErrorType.CLIENT_CLOSED.status, [])
            self.transport.close()
            return
        if self.transport.is_closing():
            self.lane.observers.end(seen, response.status_code, response.raw_headers)
            return
        self._write(seen, response)
        if self.flow.write_paused:
            await self.flow.drain()  # a client that does not read its answers gets no more of them

    def _write(self, seen: Seen, response: Response) -> None:
        # the access line is written before the answer, so that a client that has its answer finds it
        self.shared.log_access(self.client, "POST", seen.path, "1.1", response.status_code)
        self.lane.observers.end(seen, response.status_code, response.raw_headers)
        self.transport.write(wire(response, self.shared.default_headers, self.closing, (seen.header,)))

    def _header(self, name: str) -> str | None:
        value = header(self.request_head, name.encode("latin-1"))
        return None if value is None else value.decode("latin-1")

    def _answered(self, task: asyncio.Task[None]) -> None:
        if self.permit is not None:
            self.permit.release()  # the core released it already, unless the task was cancelled before it began
            self.permit = None
        self.task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("the lane failed on a request: %r", task.exception())
            self.transport.close()
        self._next()

    def _next(self) -> None:
        """The request is answered: close if asked to, else read what came meanwhile, or wait idle."""
        self.path, self.request_head = None, b""
        if self.transport.is_closing():
            return
        if self.closing:
            self.transport.close()
            return
        self.flow.resume_reading()
        if self.backlog:
            waiting = bytes(self.backlog)
            self.backlog.clear()
            self.data_received(waiting)
        else:
            self._idle()

    # connection events

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None:
            self.gone = True
            self.task.cancel()
        elif self.path is not None:
            self.lane.router.closed(self.path)
            self.path = None
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self.task is not None:
            self.closing = True
            return
        if self.path is not None:  # still arriving: the usual path drains it (and answers 503 at the deadline)
            self._to_parser()
        super().shutdown()

    def _path(self) -> bytes:
        return self.path.encode() if self.path is not None else super()._path()

    def _expired(self) -> None:
        if self.path is not None and self.task is None and not self.refused:
            log.debug("a request from %s did not arrive in time", self.client)
            self._reject(ErrorType.REQUEST_TIMEOUT, "the request did not arrive in time", "timeout")
            self.path = None
            self.body.clear()
            return
        super()._expired()


def protocol(base: type[GuardedConnection], lane: Lane) -> type[LaneConnection]:
    return type("LaneConnection", (LaneConnection, base), {"lane": lane})
