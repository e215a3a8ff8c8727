"""Cohere's rerank API on /v1/rerank and /v2/rerank, the shape infinity-emb, vLLM and LiteLLM also speak."""
from __future__ import annotations

import uuid
from typing import Any

from infinity.api.endpoint import MESSAGE, TYPE, Endpoint, ErrorBody, Family, Render
from infinity.schema import Array, Boolean, Integer, Object, OneOf, Text
from infinity.service import Result
from infinity.tasks import Request
from infinity.tasks.ranking import Ranking

COHERE = Family("cohere", ErrorBody({"message": MESSAGE, "error_type": TYPE}))
ERRORS = {400: "Empty query or documents", 401: "Missing or wrong API key",
          413: "Body too large or too many documents", 422: "Malformed body or unknown field",
          429: "Queue full; see Retry-After", 500: "Inference failed", 503: "Not ready"}
RERANK = ("/v1/rerank", "/v2/rerank")
DOCUMENT = Object({"text": Text()}, required=("text",), open=True)


def body_schema(limit: int) -> Object:
    return Object({
        "query": Text(),
        "documents": Array(OneOf((Text(), DOCUMENT), 'a string or {"text": str}'), max_items=limit),
        "top_n": Integer(minimum=1, description="answer only the N most relevant documents"),
        "return_documents": Boolean(default=False, description="include each document's text"),
        "model": Text(description="accepted; this server runs one model"),
        "max_chunks_per_doc": Integer(minimum=1, description="accepted and ignored"),
        "max_tokens_per_doc": Integer(minimum=1, description="accepted and ignored: documents are cut at the "
                                                            "model's maximum length"),
    }, required=("query", "documents"))


def endpoints(task: Ranking, limit: int) -> list[Endpoint]:
    def prepare(body: dict[str, Any]) -> tuple[Request, Render]:
        texts = [d if isinstance(d, str) else d["text"] for d in body["documents"]]

        def render(result: Result) -> Any:
            results = [{"index": i, "relevance_score": score,
                        **({"document": {"text": texts[i]}} if body["return_documents"] else {})}
                       for i, score in task.ranked(result.rows, top_n=body.get("top_n"))]
            return {"id": str(uuid.uuid4()), "results": results,
                    "meta": {"api_version": {"version": "1"}, "billed_units": {"search_units": 1}}}

        return task.pairs(body["query"], texts), render

    item = {"type": "object", "required": ["index", "relevance_score"], "properties": {
        "index": {"type": "integer"}, "relevance_score": {"type": "number"},
        "document": {"type": "object", "properties": {"text": {"type": "string"}}}}}
    answer = {"type": "object", "required": ["results"], "properties": {
        "id": {"type": "string"}, "results": {"type": "array", "items": item}, "meta": {"type": "object"}}}
    schema = body_schema(limit)
    return [Endpoint(path, COHERE, "Rerank documents (Cohere)", answer, body=schema, prepare=prepare,
                     tasks=(Ranking.name,), errors=ERRORS) for path in RERANK]
