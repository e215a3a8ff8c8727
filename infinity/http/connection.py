"""HTTP/1.1 connections for an ASGI app, over httptools' public parser.

One `Connection` per socket: the parser's callbacks build each request's scope, one `Exchange` per request carries
its body to the app and its answer to the socket, and requests pipelined behind an answer still being written wait
their turn in order. Reading pauses while a body piles up unread and writing waits while the client is not reading.

Handed every byte, the parser joins a header value piece by piece (a 128 MB header cost 27 s of CPU on the event
loop), and nothing times a client out before its first answer: the connection gathers a request head itself and
feeds it to the parser whole once it is known to fit, and its `Guard` keeps its deadlines and writes its
refusals. The usual request, whose head arrives whole in one read, goes straight through after one search for its
end; that is the one point where the lane may take it (`infinity.http.lane`).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import httptools

from infinity.errors import ErrorType
from infinity.http.exchange import Exchange
from infinity.http.guards import Guard, room
from infinity.http.heads import end_of_head, refusal, target_of
from infinity.http.lane import LaneRequest
from infinity.http.router import plain
from infinity.http.shared import Flow, Shared

log = logging.getLogger("infinity.http")

HIGH_WATER = 65536  # unread request body bytes at which reading pauses until the app asks for them


class Connection(asyncio.Protocol):
    """One client socket: HTTP/1.1 requests in, the app's answers out, in order, kept alive between requests."""
    flow: Flow  # set by connection_made
    guard: Guard  # ... too

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.limits = shared.limits
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self.exchange: Exchange | None = None  # the request the parser is reading, or the last one
        self.queue: deque[Exchange] = deque()  # requests read whole behind an answer still being written
        self.head = bytearray()  # a request head arriving in pieces, not yet handed to the parser
        self.fed = 0  # head bytes the parser got while it held part of a head (a pipelined request)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_continue = False
        self.in_message = False  # the parser has begun a request and not finished it
        self.head_done = False  # ... and has all of its head
        self.taken: LaneRequest | None = None  # a request the lane is reading or answering
        self.counted = False  # among the server's connections (not refused at the cap)
        self.keep_alive_timer: asyncio.TimerHandle | None = None

    # connection events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.flow = Flow(self.transport)
        self.guard = Guard(self.shared, self.flow, self.expired)
        if not room(self.shared):
            self.reject(ErrorType.TOO_MANY_CONNECTIONS, "too many open connections; retry later",
                        "too_many_connections", extra=((b"retry-after", b"1"),))
            return
        self.counted = True
        self.shared.connections.add(self)
        self.shared.idle.opened(self)
        self.guard.arm(self.limits.header_timeout)
        self.client = _address(transport.get_extra_info("peername"))
        self.server = _address(transport.get_extra_info("sockname"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.taken is not None:
            self.taken.lost()
            if self.taken.task is None:
                self.taken = None
        self.guard.closed()
        self.shared.idle.drop(self)
        if not self.counted:
            return
        self.shared.connections.discard(self)
        self.stop_keep_alive()
        exchange = self.exchange
        if exchange is not None:
            if not exchange.response_complete:
                exchange.disconnected = True
            exchange.event.set()
        for waiting in self.queue:
            waiting.disconnected = True
        self.queue.clear()
        self.flow.resume_writing()

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()

    # bytes in

    def data_received(self, data: bytes) -> None:
        if self.guard.refused:
            return
        if self.taken is not None:
            self.taken.received(data)
        elif self.in_message:
            self.continued(data)
        elif self.head:
            self.gather(data)
        else:
            self.shared.idle.drop(self)
            end = end_of_head(data, 0)
            if 0 <= end <= self.limits.max_header_bytes:  # the usual case: a whole head in one read
                exchange = self.exchange
                if exchange is None or (exchange.response_complete and not self.queue):
                    self.arrived(data, end)
                else:  # behind an answer still being written: the parser keeps the order of answers
                    self.feed(data)
                return
            self.stop_keep_alive()
            if self.guard.deadline is None:
                self.guard.arm(self.limits.header_timeout)
            self.gather(data)

    def arrived(self, data: bytes, end: int) -> None:
        """A whole request head in one read (`data[:end]`, then its body), with no answer pending: the one point
        where a plain request (`router.plain`) skips the parser. A full server refuses it on the socket if it is
        exactly the bytes that arrived (a retry storm costs no parser callback, ASGI task or app: microseconds a
        try); otherwise the lane takes it if its body is within the limit (larger: the app answers 413)."""
        router = self.shared.router
        request = plain(router, data, end)
        if request is not None and router.full():
            if end + request.length == len(data):  # nothing pipelined behind it, nothing of its body still to come
                # answered as a keep-alive response: the connection is idle again once its hold is over
                self.guard.disarm()  # the head arrived: its deadline must not close the connection later
                self.stop_keep_alive()
                self.transport.write(router.refusal(request.path))
                self.hold(self.rest)
                return
        elif request is not None and self.shared.lane and request.length <= router.max_body:
            self.stop_keep_alive()
            self.taken = LaneRequest(self.shared, self.guard, self.client, request.path, data[:end],
                                     request.length, self.lane_done)
            self.taken.start(data, end)
            return
        self.feed(data)

    def gather(self, data: bytes) -> None:
        """A head arriving in pieces: to the parser once whole, refused once past the limit."""
        start = max(0, len(self.head) - 3)
        self.head += data
        end = end_of_head(self.head, start)
        limit = self.limits.max_header_bytes
        if end > limit or (end < 0 and len(self.head) > limit):
            self.too_large()
        elif end >= 0:
            whole = bytes(self.head)
            self.head.clear()
            self.feed(whole)

    def continued(self, data: bytes) -> None:
        """More of a request the parser has begun: its head still within the limit."""
        if not self.head_done:
            left = self.limits.max_header_bytes - self.fed
            self.fed += len(data)
            if len(data) > left:
                self.parse(data[:left])
                if self.in_message and not self.head_done and not self.transport.is_closing():
                    self.too_large()
                    return
                data = data[left:]
        self.feed(data)

    def feed(self, data: bytes) -> None:
        """Bytes to the parser; while its request is unfinished, that request's deadline runs."""
        self.parse(data)
        if self.guard.refused or self.transport.is_closing() or self.guard.deadline is not None or \
                not self.in_message:
            return
        self.guard.arm(self.limits.body_timeout if self.head_done else self.limits.header_timeout)

    def parse(self, data: bytes) -> None:
        self.stop_keep_alive()
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            if not self.guard.refused:  # (an upgrade refused on its head comes back here once the parser stops)
                self.reject(ErrorType.BAD_REQUEST, "the request is not valid HTTP/1.1", "bad_request")

    # the parser's callbacks

    def on_message_begin(self) -> None:
        if not self.guard.refused:
            self.url, self.headers, self.expect_continue = b"", [], False
            self.in_message, self.head_done, self.fed = True, False, 0

    def on_url(self, url: bytes) -> None:
        if not self.guard.refused:
            self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.guard.refused:
            return
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.guard.refused:
            return
        self.head_done = True
        self.guard.disarm()
        version = self.parser.get_http_version()
        refused = refusal(version, self.headers, self.parser.should_upgrade())
        if refused is not None:
            status, message = refused
            self.reject(ErrorType.BAD_REQUEST, message, "bad_request", status=status)
            return
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": version,
                 "server": self.server, "client": self.client, "scheme": "http",
                 "method": self.parser.get_method().decode("ascii"), "root_path": "",
                 "path": unquote(path) if "%" in path else path, "raw_path": raw_path,
                 "query_string": url.query or b"", "headers": self.headers, "state": self.shared.state.copy()}
        keep_alive = version == "1.1" and self.parser.should_keep_alive()
        previous, self.exchange = self.exchange, Exchange(self.shared, self.transport, self.flow, scope, keep_alive,
                                                          self.expect_continue, self.on_response_complete)
        if previous is None or previous.response_complete:
            self.start(self.exchange)
        else:  # answers go out in the order requests came: this one waits, and reading stops meanwhile
            self.flow.pause_reading()
            self.queue.append(self.exchange)

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        if self.guard.refused or exchange is None or exchange.response_complete:
            return
        exchange.body += body
        if len(exchange.body) > HIGH_WATER:
            self.flow.pause_reading()
        exchange.event.set()

    def on_message_complete(self) -> None:
        if self.guard.refused:
            return
        exchange = self.exchange
        if exchange is not None and not exchange.response_complete:
            exchange.more_body = False
            exchange.event.set()
        self.in_message = False
        self.guard.disarm()

    # answers

    def start(self, exchange: Exchange) -> None:
        self.shared.track(self.loop.create_task(exchange.run(self.shared.app)))

    def on_response_complete(self) -> None:
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.queue:
            self.start(self.queue.popleft())
        else:
            self.start_keep_alive()
        exchange = self.exchange
        waiting = self.queue or (exchange is not None and not exchange.response_complete)
        if not (self.in_message or self.head or waiting or self.transport.is_closing()):
            self.shared.idle.answered(self)

    def lane_done(self, request: LaneRequest, hold: bool) -> None:
        """The lane answered its request: after a 429, hold the connection; then close if the server drains,
        else read what came meanwhile, or wait idle."""
        if self.taken is request:
            self.taken = None
        if hold:
            self.hold(lambda: self.lane_done(request, False))
        elif not self.transport.is_closing():
            if request.closing:
                self.transport.close()
                return
            self.flow.resume_reading()
            if request.backlog:
                waiting = bytes(request.backlog)
                request.backlog.clear()
                self.data_received(waiting)
            else:
                self.rest()

    def hold(self, then: Callable[[], None]) -> None:
        """After a 429 written here, not read until its Retry-After has passed; idle meanwhile (it may be
        evicted)."""
        self.shared.idle.answered(self)
        self.guard.hold(then)

    def rest(self) -> None:
        """Nothing to read or answer: idle until the next request or the keep-alive timeout."""
        self.shared.idle.answered(self)
        self.start_keep_alive()

    def start_keep_alive(self) -> None:
        self.stop_keep_alive()
        self.keep_alive_timer = self.loop.call_later(self.shared.keep_alive, self.keep_alive_expired)

    def stop_keep_alive(self) -> None:
        if self.keep_alive_timer is not None:
            self.keep_alive_timer.cancel()
            self.keep_alive_timer = None

    def keep_alive_expired(self) -> None:
        self.keep_alive_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def shutdown(self) -> None:
        """The server drains: close now if idle, else once the answer being written is whole."""
        taken = self.taken
        if taken is not None:
            if taken.task is not None:
                taken.closing = True  # the lane closes the connection once its answer is written
                return
            self.taken = None  # still arriving: the usual path drains it (and answers 503 at the deadline)
            self.guard.disarm()
            self.feed(taken.head + bytes(taken.body))
        if self.exchange is None or self.exchange.response_complete:
            self.transport.close()
        else:
            self.exchange.keep_alive = False

    # deadlines and refusals

    def expired(self) -> None:
        arriving = self.taken is not None and self.taken.task is None
        if self.head or self.in_message or arriving:
            log.debug("a request from %s did not arrive in time", self.client)
            self.reject(ErrorType.REQUEST_TIMEOUT, "the request did not arrive in time", "timeout")
        else:
            self.transport.close()  # nothing arrived: close quietly, as a keep-alive timeout does

    def too_large(self) -> None:
        self.reject(ErrorType.HEADER_TOO_LARGE, f"the request line and headers exceed "
                    f"{self.limits.max_header_bytes} bytes", "header_too_large")

    def reject(self, kind: ErrorType, message: str, reason: str, extra: tuple[tuple[bytes, bytes], ...] = (),
               status: int | None = None) -> None:
        """Answer without the app, in the error shape of the route the request names, and close."""
        if self.taken is not None:
            path = self.taken.path.encode()
            if self.taken.task is None:
                self.taken = None  # its body never came whole: nothing of it is answered
        elif self.in_message:
            path = bytes(self.url).partition(b"?")[0]  # the target, as the parser has read it
        else:
            path = target_of(self.head)
        self.head.clear()
        self.shared.idle.drop(self)
        exchange = self.exchange
        if exchange is not None and not exchange.response_complete:
            exchange.disconnected = True  # the app, if it waits on this body, hears a disconnect and writes nothing
            exchange.event.set()
        # a body that stalls after the app has answered (a 413 on its declared length) gets no second answer
        answered = self.in_message and self.head_done and exchange is not None and exchange.response_started
        self.guard.refuse(path, kind, message, reason, extra, status, write=not answered)


def _address(value: Any) -> tuple[str, int] | None:
    return (str(value[0]), int(value[1])) if isinstance(value, tuple) and len(value) >= 2 else None
