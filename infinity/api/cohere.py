"""Cohere's rerank API on /v1/rerank and /v2/rerank, the shape infinity-emb, vLLM and LiteLLM also speak, and its
embed API on /v1/embed and /v2/embed, with the embedding types it names (float, int8, uint8, binary, ubinary)."""
from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from infinity.api.endpoint import MESSAGE, TYPE, Endpoint, ErrorBody, Family, Render
from infinity.api.operations.base import Embedder, Parsed, Ranker, pairs
from infinity.engine.job import Job
from infinity.engine.service import Result
from infinity.schema import Array, Boolean, Choice, Integer, Object, OneOf, Text
from infinity.tasks.feature_extraction import PRECISIONS, FeatureExtraction

COHERE = Family("cohere", ErrorBody({"message": MESSAGE, "error_type": TYPE}))
ERRORS = {400: "Empty query or documents",
          413: "Body too large or too many documents", 422: "Malformed body or unknown field",
          429: "Queue full; see Retry-After", 500: "Inference failed", 503: "Not ready"}
RERANK = ("/v1/rerank", "/v2/rerank")
EMBED = ("/v1/embed", "/v2/embed")
INPUT_TYPES = ("search_document", "search_query", "classification", "clustering")
# the model's prompt each input type takes, by the names sentence-transformers models give their prompts
PROMPTS = {"search_query": ("search_query", "query"), "search_document": ("search_document", "document", "passage"),
           "classification": ("classification",), "clustering": ("clustering",)}
TRUNCATE: dict[str, dict[str, Any]] = {"NONE": {"truncate": False}, "START": {"truncation_direction": "left"},
                                       "END": {}}
# /predict's name for each of Cohere's rerank fields that are parameters
RERANK_PARAMETERS = {"top_n": "top_n", "return_documents": "return_text", "instruction": "instruction",
                     "max_tokens_per_doc": "max_tokens_per_doc", "chunking": "chunking"}
DOCUMENT = Object({"text": Text()}, required=("text",), open=True)


def body_schema(operation: Ranker, limit: int) -> Object:
    return Object({**operation.instruction_field(),
        "query": Text(),
        "documents": Array(OneOf((Text(), DOCUMENT), 'a string or {"text": str}'), max_items=limit),
        "top_n": Integer(minimum=1, description="answer only the N most relevant documents"),
        "return_documents": Boolean(default=False, description="include each document's text"),
        "model": Text(description="accepted; this server runs one model"),
        "max_chunks_per_doc": Integer(minimum=1, description="accepted and ignored"),
        "max_tokens_per_doc": Integer(minimum=1, description="each document's tokens past this many are dropped "
                                                            "(before windows are cut, with chunking)"),
        **operation.chunking_fields(),
    }, required=("query", "documents"))


def endpoints(operation: Ranker, limit: int) -> list[Endpoint]:
    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        texts = [d if isinstance(d, str) else d["text"] for d in body["documents"]]
        values = {ours: body[theirs] for theirs, ours in RERANK_PARAMETERS.items() if theirs in body}
        parsed = Parsed(pairs(body["query"], texts), operation.params(values))

        def render(result: Result) -> Any:
            ranked = operation.answer(result.rows, result.encoded, parsed)
            results = [{"index": i, "relevance_score": score,
                        **({"document": {"text": texts[i]}} if ranked.texts is not None else {})}
                       for i, score in ranked.best()]
            return {"id": str(uuid.uuid4()), "results": results,
                    "meta": {"api_version": {"version": "1"}, "billed_units": {"search_units": 1}}}

        return operation.request(parsed), render

    item = {"type": "object", "required": ["index", "relevance_score"], "properties": {
        "index": {"type": "integer"}, "relevance_score": {"type": "number"},
        "document": {"type": "object", "properties": {"text": {"type": "string"}}}}}
    answer = {"type": "object", "required": ["results"], "properties": {
        "id": {"type": "string"}, "results": {"type": "array", "items": item}, "meta": {"type": "object"}}}
    schema = body_schema(operation, limit)
    return [Endpoint(path, COHERE, "Rerank documents (Cohere)", answer, body=schema, prepare=prepare,
                     errors=ERRORS) for path in RERANK]


def prompt_for(task: FeatureExtraction, input_type: str | None) -> str | None:
    """The model's prompt for a Cohere input type: the first of PROMPTS[input_type] the model has, else its default."""
    return next((name for name in PROMPTS.get(input_type or "", ()) if name in task.manifest.task.prompts), None)


def embed_endpoints(operation: Embedder, limit: int) -> list[Endpoint]:
    task = operation.task
    types = Choice(PRECISIONS, description="float, int8 and uint8 (ranges calibrated at optimize time), "
                                           "binary and ubinary (sign bits packed 8 to a byte)")
    schema = Object({
        "texts": Array(Text(), max_items=limit),
        "model": Text(description="accepted; this server runs one model"),
        "input_type": Choice(INPUT_TYPES, description="selects the model's prompt of that name (search_query also "
                                                      "takes one named query; search_document, document or "
                                                      "passage); without one, the model's default prompt"),
        "embedding_types": Array(types, description="v2 answers float without it; v1 answers a plain float list"),
        "truncate": Choice(tuple(TRUNCATE), default="END", case_insensitive=True,
                           description="NONE answers 422 for inputs past the model's maximum length"),
        "output_dimension": operation.dimensions_field(),
        **operation.chunking_fields(),
        "max_tokens": Integer(minimum=1, description="accepted and ignored: inputs are cut at the model's maximum "
                                                     "length"),
    }, required=("texts",))

    def endpoint(path: str) -> Endpoint:
        version = path[2]

        def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
            texts = body["texts"]
            kinds = body.get("embedding_types")
            by_type = kinds is not None or version == "2"
            kinds = list(dict.fromkeys(kinds or ["float"]))
            task.check_precision(kinds)
            values = {"chunking": body.get("chunking"), "prompt_name": prompt_for(task, body.get("input_type")),
                      "dimensions": body.get("output_dimension"), **TRUNCATE[body["truncate"]]}
            parsed = Parsed(texts, operation.params(values))

            def render(result: Result) -> Any:
                vectors = {kind: operation.answer(result.rows, result.encoded, dataclasses.replace(
                    parsed, params=dataclasses.replace(parsed.params, precision=kind))) for kind in kinds}
                answer: dict[str, Any] = {"id": str(uuid.uuid4()), "texts": texts, "meta": {
                    "api_version": {"version": version}, "billed_units": {"input_tokens": result.tokens}}}
                if by_type:
                    answer.update(embeddings=vectors, response_type="embeddings_by_type")
                else:
                    answer.update(embeddings=vectors["float"], response_type="embeddings_floats")
                return answer

            return operation.request(parsed), render

        return Endpoint(path, COHERE, f"Embed texts (Cohere v{version})", answer_doc, body=schema, prepare=prepare,
                        errors=ERRORS, truncation_switch='"truncate": "END"')

    vectors = {"type": "array", "items": operation.vector_doc()}
    answer_doc = {"type": "object", "required": ["id", "embeddings"], "properties": {
        "id": {"type": "string"}, "texts": {"type": "array", "items": {"type": "string"}},
        "embeddings": {"oneOf": [vectors, {"type": "object", "properties": {kind: vectors for kind in PRECISIONS}}]},
        "response_type": {"type": "string", "enum": ["embeddings_floats", "embeddings_by_type"]},
        "meta": {"type": "object"}}}
    return [endpoint(path) for path in EMBED]
