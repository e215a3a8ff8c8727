"""Guards below the app: a bounded request head, a bounded number of connections, deadlines for slow clients.

Handed every byte, the parser joins a header value piece by piece (a 128 MB header cost 27 s of CPU on the event
loop), and nothing times a client out before its first answer. This subclass gathers a request head itself and
feeds it to the parser whole, once it is known to fit; the usual request, whose head arrives in one read, goes
straight through after one search for its end.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infinity.errors import ErrorType
from infinity.http.connection import Connection
from infinity.http.heads import canned, declared_body, end_of_head, refusal, route_of, target_of

log = logging.getLogger("infinity.http")

LINGER_S = 1.0  # a refused client may read our answer (and we drop what it still sends) this long
WARN_EVERY_S = 60.0


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int
    max_connections: int
    header_timeout: float
    body_timeout: float
    refusal_hold: float  # seconds a connection is not read after a 429 (its Retry-After)


class Idle:
    """Open connections waiting for a request, in the order the cap closes them to make room: those that never
    sent one first, then those waiting for their next, each longest-waiting first. An idle flood churns through
    the cap within milliseconds; a client between two requests on its keep-alive connection must not be the
    longest-waiting one it finds."""

    def __init__(self) -> None:
        self.unused: dict[GuardedConnection, None] = {}
        self.between: dict[GuardedConnection, None] = {}

    def opened(self, connection: GuardedConnection) -> None:
        self.unused[connection] = None

    def answered(self, connection: GuardedConnection) -> None:
        self.between.pop(connection, None)  # to the end of the line
        self.between[connection] = None

    def drop(self, connection: GuardedConnection) -> None:
        """No longer waiting: a request began, or the connection closes."""
        self.unused.pop(connection, None)
        self.between.pop(connection, None)

    def first(self) -> GuardedConnection | None:
        """The next to close (no longer counted here), or None."""
        for waiting in (self.unused, self.between):
            if waiting:
                connection = next(iter(waiting))
                del waiting[connection]
                return connection
        return None


@dataclass
class Gate:
    """What the transport asks of the router, which is built before the server starts.

    Refusals decided on the socket: while `full()` holds, a whole small POST to an inference route that carries
    a valid key gets its route's 429 without a parser callback, an ASGI task or the app: a retry storm costs
    microseconds a try and leaves the event loop to the requests already admitted. A request without a valid
    key is never refused here: the app answers it 401, before any permit in flight is counted."""
    answers: dict[bytes, bytes] = field(default_factory=dict)  # request line's "POST /path " -> whole 429
    full: Callable[[], bool] = lambda: False
    authorized: Callable[[bytes], bool] = lambda head: True  # a head carries a valid key (or none is needed)
    # (path, error type, message, status if the error names its own) -> (status, body) in the route's family shape
    error: Callable[[bytes, ErrorType, str, int | None], tuple[int, dict[str, Any]]] = (
        lambda path, kind, message, status: (status or kind.status, {"error": message, "error_type": kind.value}))
    refused: Callable[[bytes], None] = lambda path: None  # counts a refusal (metrics)
    rejected: Callable[[str], None] = lambda reason: None  # counts a 4xx/5xx on the socket, or an idle eviction

    def answer(self, data: bytes, end: int) -> bytes | None:
        """The 429 for `data` if it is exactly one whole request to a shed path and the server is full."""
        answer = self.answers.get(route_of(data))
        if answer is None or not self.full():
            return None
        length = declared_body(data, end)
        if length is None or end + length != len(data) or not self.authorized(data[:end]):
            return None  # anything but one plain, authorized HTTP/1.1 keep-alive request takes the usual path
        self.refused(data[5:data.find(b" ", 5)])
        return answer


class GuardedConnection(Connection):
    limits: Limits
    gate: Gate
    idle: Idle
    last_warning = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head = bytearray()  # a request head gathered here, not yet handed to the parser
        self.in_message = False  # the parser has begun a request and not finished it
        self.head_done = False  # ... and has all of its head
        self.fed = 0  # head bytes the parser got while it held part of a head (a pipelined request)
        self.deadline: asyncio.TimerHandle | None = None
        self.refused = False
        self.held: asyncio.TimerHandle | None = None  # not read until a 429's Retry-After has passed
        self.counted = False  # among the server's connections (not refused at the cap)

    # connections

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self.shared.connections) >= self.limits.max_connections and not self._evict_idle():
            self.transport = transport  # type: ignore[assignment]
            self._warn("refusing connections: %d are open, the limit", len(self.shared.connections))
            self._reject(ErrorType.TOO_MANY_CONNECTIONS, "too many open connections; retry later",
                         "too_many_connections", extra=((b"retry-after", b"1"),))
            return
        super().connection_made(transport)
        self.counted = True
        self.idle.opened(self)
        self._arm(self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.held is not None:
            self.held.cancel()
        self.idle.drop(self)
        if not self.counted:  # refused at the cap
            return
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        waiting = self.queue or (self.exchange is not None and not self.exchange.response_complete)
        if not (self.in_message or self.head or waiting or self.transport.is_closing()):
            self.idle.answered(self)

    def _evict_idle(self) -> bool:
        """At the cap, an idle connection makes room (closed as a keep-alive timeout would close it, in Idle's
        order): idle sockets cannot lock out clients that have work."""
        while (victim := self.idle.first()) is not None:
            if not victim.transport.is_closing():
                self.shared.connections.discard(victim)
                victim.transport.close()
                self.gate.rejected("idle_evicted")
                return True
        return False

    # bytes in

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        limit = self.limits.max_header_bytes
        if self.in_message:
            if not self.head_done:
                room = limit - self.fed
                self.fed += len(data)
                if len(data) > room:
                    super().data_received(data[:room])
                    if self.in_message and not self.head_done and not self.transport.is_closing():
                        self._too_large()
                        return
                    data = data[room:]
            self._feed(data)
            return
        if not self.head:
            self.idle.drop(self)
            end = end_of_head(data, 0)
            if 0 <= end <= limit:  # the usual case: a whole head in one read
                if self.exchange is None or (self.exchange.response_complete and not self.queue):
                    self._whole_head(data, end)
                else:  # behind an answer still being written: the parser keeps the order of answers
                    self._feed(data)
                return
            self.stop_keep_alive()
            if self.deadline is None:
                self._arm(self.limits.header_timeout)
        start = max(0, len(self.head) - 3)
        self.head += data
        end = end_of_head(self.head, start)
        if end > limit or (end < 0 and len(self.head) > limit):
            self._too_large()
        elif end >= 0:
            whole = bytes(self.head)
            self.head.clear()
            self._feed(whole)

    def _whole_head(self, data: bytes, end: int) -> None:
        """A request whose head came whole in one read, on a connection with no answer pending."""
        shed = self.gate.answer(data, end)
        if shed is None:
            self._feed(data)
            return
        # answered as a keep-alive response: the connection is idle again once its hold is over
        self._disarm()  # the head arrived: its deadline must not close the connection later
        self.stop_keep_alive()
        self.transport.write(shed)
        self._hold(self._idle)

    def _idle(self) -> None:
        self.idle.answered(self)
        self.start_keep_alive()

    def _hold(self, then: Callable[[], None]) -> None:
        """After a 429, read nothing more from the connection until its Retry-After has passed, then do `then`.
        A client that re-sends at once waits in its own socket buffer instead of costing another refusal;
        one that honours Retry-After never notices. A held connection counts as idle: it may be evicted."""
        self.flow.pause_reading()
        self.idle.answered(self)
        self.held = self.loop.call_later(self.limits.refusal_hold, self._release, then)

    def _release(self, then: Callable[[], None]) -> None:
        self.held = None
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        then()

    def _feed(self, data: bytes) -> None:
        super().data_received(data)  # the parser's errors come back through bad_request
        if self.refused or self.transport.is_closing() or self.deadline is not None or not self.in_message:
            return
        self._arm(self.limits.body_timeout if self.head_done else self.limits.header_timeout)

    # parser callbacks

    def on_message_begin(self) -> None:
        if self.refused:
            return
        super().on_message_begin()
        self.in_message, self.head_done, self.fed = True, False, 0

    def on_url(self, url: bytes) -> None:
        if not self.refused:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.refused:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.refused:
            return
        self.head_done = True
        self._disarm()
        refused = refusal(self.parser.get_http_version(), self.headers, self.parser.should_upgrade())
        if refused is not None:
            status, message = refused
            self._reject(ErrorType.BAD_REQUEST, message, "bad_request", status=status)
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self.refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self.refused:
            return
        super().on_message_complete()
        self.in_message = False
        self._disarm()

    def bad_request(self, message: str) -> None:
        """A request the parser cannot read: a JSON 400 in the route's shape, then close."""
        if not self.refused:  # (an upgrade refused on its head comes back here once the parser stops)
            self._reject(ErrorType.BAD_REQUEST, "the request is not valid HTTP/1.1", "bad_request")

    # deadlines and refusals

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expired(self) -> None:
        self.deadline = None
        if self.refused:
            self.transport.abort()
        elif self.head or self.in_message:
            log.debug("a request from %s did not arrive in time", self.client)
            self._reject(ErrorType.REQUEST_TIMEOUT, "the request did not arrive in time", "timeout")
        else:
            self.transport.close()  # nothing arrived: close quietly, as a keep-alive timeout does

    def _too_large(self) -> None:
        self._reject(ErrorType.HEADER_TOO_LARGE, f"the request line and headers exceed "
                     f"{self.limits.max_header_bytes} bytes", "header_too_large")

    def _path(self) -> bytes:
        """The path of the request being refused, to answer in its route's shape (b"" if none is known)."""
        if self.in_message:
            return bytes(self.url).partition(b"?")[0]  # the target, as the parser has read it
        return target_of(self.head)

    def _reject(self, kind: ErrorType, message: str, reason: str, extra: tuple[tuple[bytes, bytes], ...] = (),
                status: int | None = None) -> None:
        """Answer without the app in the route's error shape, stop reading into the parser, and close once the
        client has had the answer."""
        status, body = self.gate.error(self._path(), kind, message, status)
        response = canned(status, body, extra)
        self.refused = True
        self.gate.rejected(reason)
        self.head.clear()
        self.idle.drop(self)
        exchange = self.exchange
        if exchange is not None and not exchange.response_complete:
            exchange.disconnected = True  # the app, if it waits on this body, hears a disconnect and writes nothing
            exchange.event.set()
        # a body that stalls after the app has answered (a 413 on its declared length) gets no second answer
        answered = self.in_message and self.head_done and exchange is not None and exchange.response_started
        if not answered:
            self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._arm(LINGER_S)

    def _warn(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - GuardedConnection.last_warning >= WARN_EVERY_S:
            GuardedConnection.last_warning = now
            log.warning(message, *args)


def protocol_class(limits: Limits, gate: Gate | None = None) -> type[GuardedConnection]:
    return type("GuardedConnection", (GuardedConnection,),
                {"limits": limits, "idle": Idle(), "gate": gate or Gate()})
