"""What a server's connections share, and the small parts each of them is built from: flow control over its
transport, the limits it is held to, and the line of idle connections the cap closes first."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any, Protocol

from starlette.types import ASGIApp

from infinity.http.router import Router

access = logging.getLogger("infinity.access")


class Open(Protocol):
    """An open client connection, as the server and the cap see it."""
    transport: asyncio.Transport

    def shutdown(self) -> None:
        """The server drains: close now if idle, else once the answer being written is whole."""


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
        self.unused: dict[Open, None] = {}
        self.between: dict[Open, None] = {}

    def opened(self, connection: Open) -> None:
        self.unused[connection] = None

    def answered(self, connection: Open) -> None:
        self.between.pop(connection, None)  # to the end of the line
        self.between[connection] = None

    def drop(self, connection: Open) -> None:
        """No longer waiting: a request began, or the connection closes."""
        self.unused.pop(connection, None)
        self.between.pop(connection, None)

    def first(self) -> Open | None:
        """The next to close (no longer counted here), or None."""
        for waiting in (self.unused, self.between):
            if waiting:
                connection = next(iter(waiting))
                del waiting[connection]
                return connection
        return None


@dataclass
class Shared:
    """What every connection of one server shares."""
    app: ASGIApp
    keep_alive: float  # seconds an idle connection stays open between requests
    limits: Limits
    router: Router
    lane: bool = True  # plain POSTs to inference routes are answered by the connection (off: all go to the app)
    access_log: bool = False
    state: dict[str, Any] = field(default_factory=dict)  # the app's lifespan state, copied into every scope
    connections: set[Open] = field(default_factory=set)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # requests being answered
    idle: Idle = field(default_factory=Idle)
    warned: float = 0.0  # when the connection cap was last logged
    default_headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tick()

    def tick(self) -> None:
        """Every answer's date and server headers; the server calls this once a second."""
        self.default_headers = [(b"date", formatdate(usegmt=True).encode("ascii")), (b"server", b"infinity")]

    def track(self, task: asyncio.Task[None]) -> None:
        """A request being answered: the server's drain waits for it."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

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
