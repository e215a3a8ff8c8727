"""Guards below the app: deadlines for slow clients, a bounded number of connections, and refusals written on
the socket in the route's error shape, without the app.

The connection itself bounds a request head before its parser sees it (`Connection.data_received`); what it
cannot wait for, a refusal, or a deadline, is here.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from infinity.errors import ErrorType
from infinity.http.heads import canned
from infinity.http.shared import Flow, Shared

log = logging.getLogger("infinity.http")

LINGER_S = 1.0  # a refused client may read our answer (and we drop what it still sends) this long
WARN_EVERY_S = 60.0


def room(shared: Shared) -> bool:
    """Whether another connection may open. At the cap an idle connection makes room (closed as a keep-alive
    timeout would close it, in Idle's order): idle sockets cannot lock out clients that have work."""
    if len(shared.connections) < shared.limits.max_connections:
        return True
    while (victim := shared.idle.first()) is not None:
        if not victim.transport.is_closing():
            shared.connections.discard(victim)
            victim.transport.close()
            shared.router.rejected("idle_evicted")
            return True
    now = time.monotonic()
    if now - shared.warned >= WARN_EVERY_S:
        shared.warned = now
        log.warning("refusing connections: %d are open, the limit", len(shared.connections))
    return False


class Guard:
    """One connection's deadline (what happens when it passes is the connection's `expired`), its hold after a
    429, and its refusal: answered in the route's shape, nothing more read, closed once the client has had it."""

    def __init__(self, shared: Shared, flow: Flow, expired: Callable[[], None]) -> None:
        self.router = shared.router
        self.limits = shared.limits
        self.flow = flow
        self.transport = flow.transport
        self.expired = expired
        self.loop = asyncio.get_running_loop()
        self.deadline: asyncio.TimerHandle | None = None
        self.held: asyncio.TimerHandle | None = None  # not read until a 429's Retry-After has passed
        self.refused = False

    def arm(self, seconds: float) -> None:
        self.disarm()
        self.deadline = self.loop.call_later(seconds, self._expired)

    def disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expired(self) -> None:
        self.deadline = None
        if self.refused:
            self.transport.abort()  # the client did not take its answer within the linger
        else:
            self.expired()

    def hold(self, then: Callable[[], None]) -> None:
        """After a 429, read nothing more from the connection until its Retry-After has passed, then do `then`.
        A client that re-sends at once waits in its own socket buffer instead of costing another refusal;
        one that honours Retry-After never notices."""
        self.flow.pause_reading()
        self.held = self.loop.call_later(self.limits.refusal_hold, self._release, then)

    def _release(self, then: Callable[[], None]) -> None:
        self.held = None
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        then()

    def refuse(self, path: bytes, kind: ErrorType, message: str, reason: str,
               extra: tuple[tuple[bytes, bytes], ...] = (), status: int | None = None, write: bool = True) -> None:
        """Answer (unless `write` is False: the app answered already) in the error shape of the route `path`, stop
        reading, and close once the client has had the answer."""
        status, body = self.router.error(path, kind, message, status)
        self.refused = True
        self.router.rejected(reason)
        if write:
            self.transport.write(canned(status, body, extra))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.arm(LINGER_S)

    def closed(self) -> None:
        self.disarm()
        if self.held is not None:
            self.held.cancel()
