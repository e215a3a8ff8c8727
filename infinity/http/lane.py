"""The short lane: a plain `POST` to an inference route, read and answered by its connection.

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

from starlette.responses import Response

from infinity.errors import ErrorType
from infinity.http.guards import Guard
from infinity.http.heads import header, serialized
from infinity.http.router import Permit
from infinity.http.shared import Shared
from infinity.observe import Seen

log = logging.getLogger("infinity.http")


def wire(response: Response, default_headers: list[tuple[bytes, bytes]], close: bool,
         extra: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """A response as the usual path writes it: the server's date and server headers, the response's own
    headers, the request id."""
    return serialized(response.status_code, (*default_headers, *response.raw_headers, *extra), bytes(response.body),
                      close)


class LaneRequest:
    """One request on the lane, from its head to its answer; its connection reads nothing else meanwhile, and is
    called back (`done(request, hold)`) once it is answered, to hold the connection after a 429 if `hold`."""

    def __init__(self, shared: Shared, guard: Guard, client: tuple[str, int] | None, path: str, head: bytes,
                 wanted: int, done: Callable[[LaneRequest, bool], None]) -> None:
        self.shared = shared
        self.router = shared.router
        self.guard = guard
        self.transport = guard.transport
        self.flow = guard.flow
        self.client = client
        self.path = path
        self.head = head  # kept to hand the request to the parser if need be
        self.wanted = wanted
        self.done = done
        self.body = bytearray()
        self.task: asyncio.Task[None] | None = None  # being answered
        self.permit: Permit | None = None  # ... and its permit in flight
        self.backlog = bytearray()  # what arrived meanwhile, read once the answer is written
        self.gone = False  # the client left while its request was answered
        self.closing = False  # the server drains: close after this answer

    def start(self, data: bytes, end: int) -> None:
        """The head `data[:end]` arrived, and after it `data[end:]`."""
        self.guard.disarm()
        if len(data) - end >= self.wanted:  # the usual case: the body came with its head
            self._answer(data[end:end + self.wanted], data[end + self.wanted:])
        else:
            self.body += data[end:]
            self.guard.arm(self.guard.limits.body_timeout)

    def received(self, data: bytes) -> None:
        if self.task is not None:
            self.backlog += data
            self.flow.pause_reading()
            return
        self.body += data
        if len(self.body) >= self.wanted:
            self.guard.disarm()
            body, rest = bytes(self.body[:self.wanted]), bytes(self.body[self.wanted:])
            self.body.clear()
            self._answer(body, rest)

    def _answer(self, body: bytes, rest: bytes) -> None:
        self.backlog += rest
        seen = self.router.observers.begin("POST", self.path, self._header)
        permit = self.router.admit(self.path)
        if isinstance(permit, Response):  # refused at once, in the route's own shape
            self._write(seen, permit)
            self.done(self, permit.status_code == 429 and not self.closing)
            return
        self.permit, self.gone = permit, False
        self.task = asyncio.get_running_loop().create_task(self._respond(seen, body, permit))
        self.shared.track(self.task)
        self.task.add_done_callback(self._answered)

    async def _respond(self, seen: Seen, body: bytes, permit: Permit) -> None:
        try:
            response = await self.router.serve(seen.path, body, permit, lambda: self.gone)
        except asyncio.CancelledError:  # the task never began: nothing can be written
            self.router.observers.end(seen, ErrorType.CLIENT_CLOSED.status, [])
            self.transport.close()
            return
        if self.transport.is_closing():
            self.router.observers.end(seen, response.status_code, response.raw_headers)
            return
        self._write(seen, response)
        if self.flow.write_paused:
            await self.flow.drain()  # a client that does not read its answers gets no more of them

    def _write(self, seen: Seen, response: Response) -> None:
        # the access line is written before the answer, so that a client that has its answer finds it
        self.shared.log_access(self.client, "POST", seen.path, "1.1", response.status_code)
        self.router.observers.end(seen, response.status_code, response.raw_headers)
        self.transport.write(wire(response, self.shared.default_headers, self.closing, (seen.header,)))

    def _header(self, name: str) -> str | None:
        value = header(self.head, name.encode("latin-1"))
        return None if value is None else value.decode("latin-1")

    def _answered(self, task: asyncio.Task[None]) -> None:
        if self.permit is not None:
            self.permit.release()  # the core released it already, unless the task was cancelled before it began
            self.permit = None
        self.task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("the lane failed on a request: %r", task.exception())
            self.transport.close()
        self.done(self, False)

    def lost(self) -> None:
        """The client left: an answer under way is cancelled, a body still arriving is counted as closed."""
        if self.task is not None:
            self.gone = True
            self.task.cancel()
        else:
            self.router.closed(self.path)
