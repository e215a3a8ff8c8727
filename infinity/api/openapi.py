"""The OpenAPI 3 document, generated from the same Endpoint definitions and schemas the routes check with."""
from __future__ import annotations

from typing import Any

from infinity.api.endpoint import Endpoint

TIMING = {"schema": {"type": "number"}, "description": "milliseconds"}
HEADERS = {**{name: TIMING for name in ("x-compute-time", "x-tokenization-time", "x-queue-time",
                                        "x-inference-time", "x-total-time")},
           "x-compute-tokens": {"schema": {"type": "integer"}, "description": "tokens run, padding excluded"},
           "x-compute-windows": {"schema": {"type": "integer"},
                                 "description": "windows the texts ran in, where they ran whole in windows "
                                                "(--chunk-long-inputs or the request's chunking)"}}


def _operation(endpoint: Endpoint, secured: bool) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK", "content": {endpoint.media_type: {"schema": endpoint.answer_doc}}}
    if endpoint.inference:
        ok["headers"] = HEADERS
    responses: dict[str, Any] = {"200": ok}
    errors = dict(endpoint.errors)
    if secured and endpoint.protected:  # the one place 401 is documented: only where a key is asked for
        errors[401] = "Missing or wrong API key"
    for status, description in sorted(errors.items()):
        responses[str(status)] = {"description": description, "content": {"application/json": {
            "schema": endpoint.family.body.doc}}}
    operation: dict[str, Any] = {"summary": endpoint.summary, "tags": [endpoint.family.name],
                                 "responses": responses}
    if endpoint.body is not None:
        operation["requestBody"] = {"required": True,
                                    "content": {"application/json": {"schema": endpoint.body.doc()}}}
    if secured and endpoint.protected:
        operation["security"] = [{"bearer": []}, {"apiKey": []}]
    return operation


def document(endpoints: list[Endpoint], title: str, version: str, secured: bool) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint, secured)
    spec: dict[str, Any] = {"openapi": "3.0.3", "info": {"title": title, "version": version}, "paths": paths}
    if secured:
        spec["components"] = {"securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "api-key"}}}
    return spec
