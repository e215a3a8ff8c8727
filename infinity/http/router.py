"""What the transport asks of the routes: the one seam between http/ and the API, which `infinity.api.router.Router`
implements, built before the server starts.

The connection asks it whether a request may skip the app (a plain POST to an inference route, `route`), refuses
such a request on the socket while the server is full (`full`, `refusal`), answers it on the lane (`admit`, `serve`,
`closed`), and writes its own refusals (a head too large, a client too slow) in the route's error shape (`error`).
A request without a valid key (`authorized`) always goes to the app, which answers 401 before counting anything.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from starlette.responses import Response

from infinity.errors import ErrorType
from infinity.http.heads import declared_body, route_of
from infinity.observe import Observers


class Permit(Protocol):
    """A request's permit to be in flight, taken once its body is whole (so the next request on the socket sees it)."""

    def release(self) -> None: ...


class Router(Protocol):
    observers: Observers  # request ids, log lines and spans for requests the lane answers

    @property
    def max_body(self) -> int:
        """Body bytes the lane reads; a larger declared body goes to the app, which answers 413."""

    def route(self, line: bytes) -> str | None:
        """The path of the inference route a request line up to its target ("POST /path ") names, or None."""

    def authorized(self, head: bytes) -> bool:
        """The head carries a valid key, or the server needs none."""

    def full(self) -> bool:
        """Every permit is taken: a new request would be refused."""

    def refusal(self, path: str) -> bytes:
        """The route's whole keep-alive 429, counted as refused: written on the socket while the server is full."""

    def error(self, path: bytes, kind: ErrorType, message: str, status: int | None) -> tuple[int, dict[str, Any]]:
        """(status, body) of an error in the route's family shape; `status` when the error names its own."""

    def rejected(self, reason: str) -> None:
        """Counts a request refused on the socket (4xx/5xx), or an idle connection closed to make room."""

    def admit(self, path: str) -> Permit | Response:
        """A permit in flight, or the route's refusal (429, 503)."""

    async def serve(self, path: str, body: bytes, permit: Any, gone: Callable[[], bool]) -> Response:
        """The answer to a whole body, with the permit admit() gave; `gone` says whether the client has left."""

    def closed(self, path: str) -> None:
        """Counts a client that left before its answer was ready."""


class Plain(NamedTuple):
    """A plain sized HTTP/1.1 keep-alive POST with a valid key (or none needed) to an inference route: the only
    request the lane answers, or a full server refuses on the socket."""
    path: str
    length: int  # of its body, as its head declares


def plain(router: Router, data: bytes, end: int) -> Plain | None:
    """The whole head `data[:end]` read once: a `Plain` request, or None for anything else, which the parser takes
    (and the app answers: 401 without a valid key, before any permit in flight is counted)."""
    path = router.route(route_of(data))
    length = declared_body(data, end) if path is not None else None
    if path is None or length is None or not router.authorized(data[:end]):
        return None
    return Plain(path, length)
