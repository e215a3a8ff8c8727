"""OpenAI's embeddings API: /v1/embeddings (and /embeddings), /v1/models, errors in OpenAI's shape."""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from infinity.api.endpoint import MESSAGE, NULL, TYPE, Endpoint, ErrorBody, Family, Field, JSONResponse, Render
from infinity.engine.service import Result
from infinity.errors import ValidationError
from infinity.schema import Array, Choice, Integer, Object, OneOf, Text
from infinity.tasks import Request
from infinity.tasks.feature_extraction import FeatureExtraction

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
         413: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}


KIND = Field(lambda status, message, kind: TYPES.get(status, "server_error" if status >= 500
                                                     else "invalid_request_error"), {"type": "string"})
# OpenAI answers every invalid request with 400, where the other routes say 422
OPENAI = Family("openai", ErrorBody({"error": ErrorBody({"message": MESSAGE, "type": KIND, "param": NULL,
                                                         "code": TYPE})}),
                status=lambda status: 400 if status == 422 else status)
EMBEDDINGS = ("/v1/embeddings", "/embeddings")
ERRORS = {400: "Invalid request (empty input, bad field, dimensions above the model's)",
          413: "Body too large or too many inputs",
          429: "Queue full; see Retry-After", 500: "Inference failed", 503: "Not ready"}


@dataclass(frozen=True)
class TokenIds(Array):
    """One input's token ids. More than the model takes is a too-long input (400), as a text is, not too many inputs
    (413); refused on its length, before its ids are read."""

    def check(self, value: Any, where: str) -> list[Any]:
        if isinstance(value, list) and self.max_items is not None and len(value) > self.max_items:
            raise ValidationError(f"{where} has {len(value)} token ids, more than the model's maximum of "
                                  f"{self.max_items}")
        return super().check(value, where)


def body_schema(task: FeatureExtraction, limit: int, vocabulary: int) -> Object:
    ids = TokenIds(Integer(minimum=0, maximum=vocabulary - 1), max_items=task.manifest.tokenizer.max_length)
    inputs = OneOf((Text(), Array(Text(), max_items=limit), ids, Array(ids, max_items=limit)),
                   "a string, a list of strings, a list of token ids or a list of lists of token ids")
    return Object({
        "input": inputs,
        "model": Text(description="accepted; this server runs one model, whose name every answer carries"),
        "encoding_format": Choice(("float", "base64"), default="float",
                                  description="base64: little-endian float32 bytes (at another precision, "
                                              "each integer as a float32)"),
        "dimensions": task.dimensions_field(),
        "user": Text(allow_blank=True, description="accepted and ignored"),
        # not OpenAI's: the python client sends these with extra_body
        "precision": task.precision_field(),
        **task.prompt_fields(),
        **task.chunking_fields(),
    }, required=("input",))


def _request(value: Any) -> Request:
    if isinstance(value, str):
        return Request([value])
    if isinstance(value[0], str):
        return Request(value)
    if isinstance(value[0], int):
        return Request(token_ids=[value])
    return Request(token_ids=value)


def _encode(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector


def embeddings(task: FeatureExtraction, limit: int, vocabulary: int, name: str) -> list[Endpoint]:

    def prepare(body: dict[str, Any]) -> tuple[Request, Render]:
        normalize = task.manifest.task.normalize
        task.check_precision([body["precision"]])

        def render(result: Result) -> Any:
            vectors = task.answer_vectors(result.rows, body["precision"], normalize, body.get("dimensions"))
            data = [{"object": "embedding", "index": i, "embedding": _encode(v, body["encoding_format"])}
                    for i, v in enumerate(vectors)]
            return {"object": "list", "data": data, "model": name,
                    "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens}}

        request = _request(body["input"])
        request.chunk = body.get("chunking")
        return task.prompted(request, body.get("prompt_name")), render

    vector = {"oneOf": [task.vector_doc(), {"type": "string", "format": "byte"}]}
    answer = {"type": "object", "properties": {
        "object": {"type": "string", "enum": ["list"]}, "model": {"type": "string"},
        "data": {"type": "array", "items": {"type": "object", "properties": {
            "object": {"type": "string", "enum": ["embedding"]}, "index": {"type": "integer"}, "embedding": vector}}},
        "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"},
                                                   "total_tokens": {"type": "integer"}}}}}
    schema = body_schema(task, limit, vocabulary)
    return [Endpoint(path, OPENAI, "Create embeddings (OpenAI)", answer, body=schema, prepare=prepare,
                     errors=ERRORS) for path in EMBEDDINGS]


def models(name: str, started: int, protected: bool) -> Endpoint:
    listing = {"object": "list", "data": [{"id": name, "object": "model", "created": started,
                                           "owned_by": "infinity"}]}

    async def view(request: HTTPRequest) -> Response:
        return JSONResponse(listing)

    answer = {"type": "object", "properties": {"object": {"type": "string"}, "data": {"type": "array"}}}
    return Endpoint("/v1/models", OPENAI, "The one model this server runs (OpenAI)", answer, view=view,
                    method="GET", protected=protected)
