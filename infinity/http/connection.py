"""HTTP/1.1 connections for an ASGI app, over httptools' public parser.

One `Connection` per socket: the parser's callbacks build each request's scope, one `Exchange` per request carries
its body to the app (`receive`) and its answer to the socket (`send`), and requests pipelined behind an answer
still being written wait their turn in order. Reading pauses while a body piles up unread and writing waits while
the client is not reading. `infinity.http.protocol` puts the guards on top; `infinity.http.lane` the short lane.
"""
from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools
from starlette.types import ASGIApp, Message

log = logging.getLogger("infinity.http")
access = logging.getLogger("infinity.access")

HIGH_WATER = 65536  # unread request body bytes at which reading pauses until the app asks for them
_PHRASES = {int(status): status.phrase for status in HTTPStatus}
STATUS_LINE = {code: f"HTTP/1.1 {code} {_PHRASES.get(code, '')}\r\n".encode("ascii") for code in range(100, 600)}
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_UNSAFE_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_INTERNAL_ERROR = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"),
                   (b"connection", b"close")]


def serialized(status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes = b"", close: bool = False) -> bytes:
    """A response as it goes on the wire: status line, headers (with connection: close when the connection ends
    after it), blank line, body. Every answer the server writes is made here."""
    lines = [STATUS_LINE[status]]
    for name, value in headers:
        lines += [name, b": ", value, b"\r\n"]
    if close:
        lines.append(b"connection: close\r\n")
    lines += [b"\r\n", body]
    return b"".join(lines)


@dataclass
class Shared:
    """What every connection of one server shares."""
    app: ASGIApp
    keep_alive: float  # seconds an idle connection stays open between requests
    access_log: bool = False
    state: dict[str, Any] = field(default_factory=dict)  # the app's lifespan state, copied into every scope
    connections: set[Connection] = field(default_factory=set)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # requests being answered
    default_headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tick()

    def tick(self) -> None:
        """Every answer's date and server headers; the server calls this once a second."""
        self.default_headers = [(b"date", formatdate(usegmt=True).encode("ascii")), (b"server", b"infinity")]

    def log_access(self, client: tuple[str, int] | None, method: str, target: str, version: str,
                   status: int) -> None:
        if self.access_log:
            address = f"{client[0]}:{client[1]}" if client else "-"
            access.info('%s - "%s %s HTTP/%s" %d', address, method, target, version, status)


class Flow:
    """Reading paused while a body waits for the app, writing held back while the client does not read."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.read_paused = False
        self.write_paused = False
        self._writable = asyncio.Event()
        self._writable.set()

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.write_paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._writable.set()

    async def drain(self) -> None:
        await self._writable.wait()


class Exchange:
    """One request and its answer: the ASGI `receive` and `send` of one app call."""

    def __init__(self, connection: Connection, scope: dict[str, Any], keep_alive: bool, expect_continue: bool):
        self.connection = connection
        self.scope = scope
        self.transport = connection.transport
        self.flow = connection.flow
        self.event = asyncio.Event()  # set when body arrives, the request ends, or the client leaves
        self.body = bytearray()
        self.more_body = True
        self.disconnected = False
        self.keep_alive = keep_alive
        self.continue_due = expect_continue  # a 100 Continue is written when the app first reads the body
        self.response_started = False
        self.response_complete = False
        self.chunked: bool | None = None
        self.remaining = 0  # body bytes a declared content-length still expects

    async def run(self, app: ASGIApp) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("the app failed on %s %s", self.scope["method"], self.scope["path"], exc_info=exc)
            if not self.response_started:
                await self.internal_error()
            else:
                self.transport.close()
            if not isinstance(exc, Exception):
                raise
        else:
            if not self.response_started and not self.disconnected:
                log.error("the app returned without answering %s %s", self.scope["method"], self.scope["path"])
                await self.internal_error()
            elif not self.response_complete and not self.disconnected:
                log.error("the app returned before its answer to %s %s was whole", self.scope["method"],
                          self.scope["path"])
                self.transport.close()

    async def internal_error(self) -> None:
        await self.send({"type": "http.response.start", "status": 500, "headers": _INTERNAL_ERROR})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})

    async def receive(self) -> Message:
        if self.continue_due and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.continue_due = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            await self.event.wait()
            self.event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body, self.body = bytes(self.body), bytearray()
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: Message) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {message['type']}")
            self.start(message["status"], message.get("headers", []))
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"expected http.response.body, got {message['type']}")
            self.write(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"{message['type']} sent after the response was complete")

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.response_started = True
        self.continue_due = False
        scope = self.scope
        target = scope["path"] + ("?" + scope["query_string"].decode("ascii") if scope["query_string"] else "")
        self.connection.shared.log_access(scope["client"], scope["method"], target, scope["http_version"], status)
        says_close = False
        written = [*self.connection.shared.default_headers]
        for name, value in headers:
            if _TOKEN.fullmatch(name) is None or _UNSAFE_VALUE.search(value) is not None:
                raise RuntimeError(f"invalid response header {name!r}")
            name = name.lower()
            if name == b"content-length" and self.chunked is None:
                self.remaining, self.chunked = int(value), False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.remaining, self.chunked = 0, True
            elif name == b"connection" and b"close" in [token.strip() for token in value.lower().split(b",")]:
                self.keep_alive, says_close = False, True
            written.append((name, value))
        if self.chunked is None and scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked = True
            written.append((b"transfer-encoding", b"chunked"))
        self.transport.write(serialized(status, written, close=not self.keep_alive and not says_close))

    def write(self, body: bytes, more_body: bool) -> None:
        if self.scope["method"] == "HEAD":
            self.remaining = 0
        elif self.chunked:
            chunk = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
            if not more_body:
                chunk.append(b"0\r\n\r\n")
            self.transport.write(b"".join(chunk))
        else:
            if len(body) > self.remaining:
                raise RuntimeError("the response body is longer than its content-length")
            self.remaining -= len(body)
            self.transport.write(body)
        if more_body:
            return
        if self.remaining:
            raise RuntimeError("the response body is shorter than its content-length")
        self.response_complete = True
        self.event.set()
        if not self.keep_alive:
            self.transport.close()
        self.connection.on_response_complete()


class Connection(asyncio.Protocol):
    """One client socket: HTTP/1.1 requests in, the app's answers out, in order, kept alive between requests."""
    flow: Flow  # set by connection_made

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self.exchange: Exchange | None = None  # the request the parser is reading, or the last one
        self.queue: deque[Exchange] = deque()  # requests read whole behind an answer still being written
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_continue = False
        self.keep_alive_timer: asyncio.TimerHandle | None = None

    # connection events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.flow = Flow(self.transport)
        self.shared.connections.add(self)
        self.client = _address(transport.get_extra_info("peername"))
        self.server = _address(transport.get_extra_info("sockname"))

    def connection_lost(self, exc: Exception | None) -> None:
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

    def data_received(self, data: bytes) -> None:
        self.stop_keep_alive()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.bad_request("protocol upgrades are not supported")
        except httptools.HttpParserError:
            self.bad_request("the request is not valid HTTP/1.1")

    def bad_request(self, message: str) -> None:
        """A request the parser cannot read: 400, then close."""
        body = message.encode()
        self.transport.write(STATUS_LINE[400] + b"content-type: text/plain; charset=utf-8\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body)
        self.transport.close()

    # the parser's callbacks

    def on_message_begin(self) -> None:
        self.url, self.headers, self.expect_continue = b"", [], False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        version = self.parser.get_http_version()
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": version,
                 "server": self.server, "client": self.client, "scheme": "http",
                 "method": self.parser.get_method().decode("ascii"), "root_path": "",
                 "path": unquote(path) if "%" in path else path, "raw_path": raw_path,
                 "query_string": url.query or b"", "headers": self.headers, "state": self.shared.state.copy()}
        keep_alive = version == "1.1" and self.parser.should_keep_alive()
        previous, self.exchange = self.exchange, Exchange(self, scope, keep_alive, self.expect_continue)
        if previous is None or previous.response_complete:
            self.start(self.exchange)
        else:  # answers go out in the order requests came: this one waits, and reading stops meanwhile
            self.flow.pause_reading()
            self.queue.append(self.exchange)

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        if exchange is None or exchange.response_complete:
            return
        exchange.body += body
        if len(exchange.body) > HIGH_WATER:
            self.flow.pause_reading()
        exchange.event.set()

    def on_message_complete(self) -> None:
        exchange = self.exchange
        if exchange is None or exchange.response_complete:
            return
        exchange.more_body = False
        exchange.event.set()

    # answers

    def start(self, exchange: Exchange) -> None:
        self.track(self.loop.create_task(exchange.run(self.shared.app)))

    def track(self, task: asyncio.Task[None]) -> None:
        """A request being answered: the server's drain waits for it."""
        self.shared.tasks.add(task)
        task.add_done_callback(self.shared.tasks.discard)

    def on_response_complete(self) -> None:
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.queue:
            self.start(self.queue.popleft())
        else:
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
        if self.exchange is None or self.exchange.response_complete:
            self.transport.close()
        else:
            self.exchange.keep_alive = False


def _address(value: Any) -> tuple[str, int] | None:
    return (str(value[0]), int(value[1])) if isinstance(value, tuple) and len(value) >= 2 else None
