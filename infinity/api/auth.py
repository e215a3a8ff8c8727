"""API keys in front of every guarded route: one layer, not a check inside each handler."""
from __future__ import annotations

import hmac
import logging
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from infinity.api.endpoint import Family
from infinity.errors import ErrorType

log = logging.getLogger("infinity.auth")


def presented_key(header: Callable[[str], str | None]) -> str | None:
    """`Authorization: Bearer KEY` (OpenAI, Cohere, huggingface_hub, TEI clients) or `api-key: KEY` (Azure);
    `header` gives a header's value by its lower-case name."""
    authorization = header("authorization")
    if authorization:
        scheme, _, credentials = authorization.partition(" ")
        return credentials.strip() if scheme.lower() == "bearer" else None
    return header("api-key")


def matches(key: str | None, keys: tuple[bytes, ...]) -> bool:
    """Compares against every configured key, so the time taken says nothing about which one nearly matched."""
    given = (key or "").encode()
    found = False
    for candidate in keys:
        found |= hmac.compare_digest(given, candidate)
    return found and key is not None


class ApiKeys:
    def __init__(self, app: ASGIApp, keys: tuple[str, ...], guarded: dict[str, Family]) -> None:
        self.app = app
        self.keys = tuple(key.encode() for key in keys)
        self.guarded = guarded if keys else {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        family = self.guarded.get(scope.get("path", "")) if scope["type"] == "http" else None
        if family is None or matches(presented_key(Headers(scope=scope).get), self.keys):
            await self.app(scope, receive, send)
            return
        state = scope.get("state") or {}
        if "service" in state:
            state["service"].metrics.failed(scope["path"], ErrorType.UNAUTHORIZED)
        response = family.failure(ErrorType.UNAUTHORIZED,
                                  "a valid API key is required: send Authorization: Bearer <key>",
                                  headers={"WWW-Authenticate": 'Bearer realm="infinity"'})
        await response(scope, receive, send)
