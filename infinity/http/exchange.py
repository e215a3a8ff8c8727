"""One request and its answer on a connection: the ASGI `receive` and `send` of one app call."""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message

from infinity.http.heads import serialized
from infinity.http.shared import Flow, Shared

log = logging.getLogger("infinity.http")

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_UNSAFE_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_INTERNAL_ERROR = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"),
                   (b"connection", b"close")]


class Exchange:
    """One request and its answer: the ASGI `receive` and `send` of one app call. `done` is called once the
    answer is whole."""

    def __init__(self, shared: Shared, transport: asyncio.Transport, flow: Flow, scope: dict[str, Any],
                 keep_alive: bool, expect_continue: bool, done: Callable[[], None]):
        self.shared = shared
        self.scope = scope
        self.transport = transport
        self.flow = flow
        self.done = done
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
        self.shared.log_access(scope["client"], scope["method"], target, scope["http_version"], status)
        says_close = False
        written = [*self.shared.default_headers]
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
        self.done()

