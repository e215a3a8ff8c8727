"""The router, built once before the server starts: the service, the routes this artifact serves, and what the
transport asks of them (`infinity.http.router.Router`). The app's handlers and the lane both call into it; nothing
is assigned later."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from starlette.responses import Response

from infinity import api
from infinity.api.auth import matches, presented_key
from infinity.api.endpoint import Endpoint, Family, closed, failure, respond
from infinity.api.hf import HF
from infinity.engine.model import LoadedModel
from infinity.engine.service import Permit, Service
from infinity.errors import ErrorType, InfinityError
from infinity.http.heads import canned, header
from infinity.observe import Observers
from infinity.settings import Settings

log = logging.getLogger("infinity.core")


@dataclass
class Router:
    service: Service
    served: list[Endpoint]  # the routes this artifact serves, in the order the OpenAPI document lists them
    routes: list[Endpoint]  # ... and the other tasks' routes, which answer 404 saying why
    keys: tuple[bytes, ...]
    observers: Observers  # request ids, request log lines and spans, for every request on either path

    @classmethod
    def build(cls, model: LoadedModel, settings: Settings) -> Router:
        served = api.endpoints(model, settings)
        routes = served + api.elsewhere(served, model.task.name)
        return cls(Service(model, settings), served, routes, tuple(key.encode() for key in settings.api_keys),
                   Observers.from_settings(settings))

    @cached_property  # read on every lane request: built once
    def inference(self) -> dict[str, Endpoint]:
        return {endpoint.path: endpoint for endpoint in self.served if endpoint.inference}

    @cached_property
    def lines(self) -> dict[bytes, str]:
        """Inference routes by their request line up to the target, "POST /path "."""
        return {f"POST {path} ".encode(): path for path in self.inference}

    @cached_property
    def refusals(self) -> dict[str, bytes]:
        """Each inference route's whole 429, in its family's error shape, for refusals made on the socket."""
        retry_after = ((b"retry-after", str(self.service.settings.retry_after).encode()),)
        return {path: canned(*endpoint.family.error(ErrorType.OVERLOADED, "the server is at capacity; retry later"),
                             retry_after, close=False) for path, endpoint in self.inference.items()}

    @cached_property
    def families(self) -> dict[str, Family]:
        """Each route's API family, whose error shape its answers take."""
        return {endpoint.path: endpoint.family for endpoint in self.routes}

    def family(self, path: str) -> Family:
        return self.families.get(path, HF)

    def route_label(self, path: str) -> str:
        """A metrics label: the route's path, never a raw path a client made up."""
        return path if any(endpoint.path == path for endpoint in self.routes) else "unmatched"

    # what the transport asks (infinity.http.router.Router)

    @property
    def max_body(self) -> int:
        return self.service.settings.max_payload_bytes

    def route(self, line: bytes) -> str | None:
        return self.lines.get(line)

    def full(self) -> bool:
        return self.service.full

    def refusal(self, path: str) -> bytes:
        self.service.metrics.refused(path)
        return self.refusals[path]

    def rejected(self, reason: str) -> None:
        self.service.metrics.count_rejection(reason)

    def admit(self, path: str) -> Permit | Response:
        try:
            return self.service.admit()
        except InfinityError as exc:
            return failure(self.inference[path], self.service, exc)

    async def serve(self, path: str, body: bytes, permit: Permit, gone: Callable[[], bool]) -> Response:
        async def read() -> bytes:
            return body

        try:
            return await respond(self.inference[path], self.service, read, gone=gone, permit=permit)
        except Exception:
            log.exception("unhandled error on POST %s", path)
            self.service.metrics.failed(path, ErrorType.INTERNAL)
            return self.inference[path].family.failure(ErrorType.INTERNAL, "internal server error")

    def closed(self, path: str) -> None:
        closed(self.inference[path], self.service)

    def authorized(self, head: bytes) -> bool:
        """The head carries a valid key, or the server needs none."""
        if not self.keys:
            return True

        def value(name: str) -> str | None:
            found = header(head, name.encode())
            return found.decode("latin-1") if found is not None else None

        return matches(presented_key(value), self.keys)

    def error(self, path: bytes, kind: ErrorType, message: str, status: int | None) -> tuple[int, dict[str, Any]]:
        return self.family(path.decode("latin-1")).error(kind, message, status)
