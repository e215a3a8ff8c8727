"""Real `python -m infinity serve` processes on 127.0.0.1 (bench/process.py: Server), for tests that talk HTTP to
them."""
from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.responses import Response

from bench.process import WAIT, Server
from infinity.errors import ErrorType
from infinity.http.connection import Connection
from infinity.http.heads import canned
from infinity.http.router import Permit
from infinity.http.server import limits
from infinity.http.shared import Shared
from infinity.observe import Observers
from infinity.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def metric(server: Server, name: str) -> float:
    """The sum of a metric's samples on the server's /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
    return sum(float(row.rsplit(" ", 1)[1]) for row in text.splitlines()
               if row.startswith(name + " ") or row.startswith(name + "{"))


def until(condition: Callable[[], bool]) -> None:
    """Waits for `condition` to hold, up to WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


@contextmanager
def running(artifact: Path, log: Path, *args: str, env: dict[str, str] | None = None,
            preexec_fn: Callable[[], None] | None = None) -> Iterator[Server]:
    """Start a server and wait until /health/ready answers 200; kill it on the way out.
    preexec_fn runs in the child before the server starts (e.g. to lower its open-file limit)."""
    environ = {**os.environ, "INFINITY_THREADS": "1", "INFINITY_LOG_LEVEL": "info", **(env or {})}
    server = Server.infinity(artifact, *args, log=log, cwd=ROOT, env=environ, preexec_fn=preexec_fn)
    try:
        server.wait_ready(WAIT)
        yield server
    finally:
        server.kill()


class Reader:
    """Responses with content-length bodies, one after another from one connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def _fill(self, enough: Callable[[], bool]) -> None:
        while not enough():
            chunk = self.sock.recv(65536)
            assert chunk, f"closed before a whole response: {self.buffer[:300]!r}"
            self.buffer += chunk

    def response(self) -> tuple[bytes, bytes]:
        self._fill(lambda: b"\r\n\r\n" in self.buffer)
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        self.buffer = rest
        self._fill(lambda: len(self.buffer) >= length)
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return head, body

    def closed(self) -> bool:
        return not self.buffer and self.sock.recv(1) == b""


class Unrouted:
    """A router with no inference routes, for a bare connection under a test's own app: every request goes
    to the app, and errors are in a plain shape."""
    observers = Observers()
    max_body = 0

    def route(self, line: bytes) -> str | None:
        return None

    def authorized(self, head: bytes) -> bool:
        return True

    def full(self) -> bool:
        return False

    def refusal(self, path: str) -> bytes:
        return canned(429, {"error": "the server is at capacity; retry later"}, close=False)

    def error(self, path: bytes, kind: ErrorType, message: str, status: int | None) -> tuple[int, dict[str, Any]]:
        return status or kind.status, {"error": message, "error_type": kind.value}

    def rejected(self, reason: str) -> None:
        pass

    def admit(self, path: str) -> Permit | Response:
        raise LookupError(f"no inference route {path}")

    async def serve(self, path: str, body: bytes, permit: Any, gone: Callable[[], bool]) -> Response:
        raise LookupError(f"no inference route {path}")

    def closed(self, path: str) -> None:
        pass


def connections(app: Any, check: Callable[[str, int], Awaitable[None]], router: Any = None,
                keep_alive: float = 5.0) -> Shared:
    """Run `check(host, port)` against a server of the transport's connections on 127.0.0.1, under `app` (ASGI) and
    `router` (default: `Unrouted`); the server's shared state."""
    shared = Shared(app, keep_alive=keep_alive, limits=limits(Settings()), router=router or Unrouted())

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(lambda: Connection(shared), "127.0.0.1", 0)
        try:
            await asyncio.wait_for(check(*server.sockets[0].getsockname()[:2]), 20)
        finally:
            server.close()

    asyncio.run(main())
    return shared
