"""Text Embeddings Inference's native routes: /embed, /embed_all, /embed_sparse, /rerank, /tokenize, /decode.
TEI's error shape is /predict's ({"error": ..., "error_type": ...}): they belong to the HF family. Each route's
body is named as /predict's parameters are, and goes through the task's operation."""
from __future__ import annotations

from typing import Any

from infinity.api.endpoint import Endpoint, Render
from infinity.api.hf import AT_TOP, ERRORS, HF
from infinity.api.operations.base import (
    Embedder,
    MultiVectors,
    Parsed,
    Ranker,
    SparseEmbedder,
    listed,
    pairs,
    prompt_fields,
    sparse_vector_doc,
    texts_schema,
    truncation,
)
from infinity.engine.job import Job
from infinity.engine.service import Result
from infinity.engine.tokenization import TextTokenizer
from infinity.schema import Array, Boolean, Integer, Object, OneOf, Text

EMBED, EMBED_ALL, EMBED_SPARSE, RERANK = "/embed", "/embed_all", "/embed_sparse", "/rerank"


def _params(body: dict[str, Any], *body_only: str) -> dict[str, Any]:
    """The body's fields but its inputs (and `body_only`, which are TEI's own): /predict's parameters."""
    return {name: value for name, value in body.items() if name not in ("inputs", *body_only)}


def embed(operation: Embedder, limit: int) -> Endpoint:
    schema = Object({"inputs": texts_schema(limit),
                     "normalize": Boolean(default=True, description="scale each vector to unit length"),
                     "dimensions": operation.dimensions_field(), "precision": operation.precision_field(),
                     **prompt_fields(operation.task), **operation.chunking_fields(), **truncation()},
                    required=("inputs",))

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        parsed = Parsed(listed(body["inputs"]), operation.params(_params(body)))

        def render(result: Result) -> Any:
            return operation.answer(result.rows, result.encoded, parsed)

        return operation.request(parsed), render

    return Endpoint(EMBED, HF, "Embed texts (TEI)", {"type": "array", "items": operation.vector_doc()}, body=schema,
                    prepare=prepare, errors=ERRORS, truncation_switch=AT_TOP)


def embed_all(operation: Embedder, limit: int) -> Endpoint:
    """Every token's vector, as the model's last layer answers it (special tokens included, padding not)."""
    schema = Object({"inputs": texts_schema(limit), **prompt_fields(operation.task), **operation.chunking_fields(),
                     **truncation()}, required=("inputs",))

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        parsed = Parsed(listed(body["inputs"]), operation.params(_params(body)), tokens=True)

        def render(result: Result) -> Any:
            return operation.answer(result.rows, result.encoded, parsed)

        return operation.request(parsed), render

    return Endpoint(EMBED_ALL, HF, "Every token's vector of each text (TEI)",
                    {"type": "array", "items": operation.token_doc()}, body=schema, prepare=prepare, errors=ERRORS,
                    truncation_switch=AT_TOP)


def multi_vectors(operation: MultiVectors, limit: int) -> Endpoint:
    """A multi-vector model's /embed_all: the tokens it scores, for the role the body names."""
    schema = Object({"inputs": texts_schema(limit), "input_type": operation.role_field(),
                     **operation.chunking_fields(), **truncation()}, required=("inputs",))

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        parsed = Parsed(listed(body["inputs"]), operation.params(_params(body)))

        def render(result: Result) -> Any:
            return operation.answer(result.rows, result.encoded, parsed)

        return operation.request(parsed), render

    return Endpoint(EMBED_ALL, HF, "The token vectors a multi-vector model scores, of each text (TEI's route)",
                    {"type": "array", "items": operation.matrix_doc()}, body=schema, prepare=prepare, errors=ERRORS,
                    truncation_switch=AT_TOP)


def embed_sparse(operation: SparseEmbedder, limit: int) -> Endpoint:
    """Each text's sparse vector; a hybrid model's sparse head."""
    schema = Object({"inputs": texts_schema(limit), **operation.selection(), **prompt_fields(operation.task),
                     **operation.chunking_fields(), **truncation()}, required=("inputs",))
    heads = {"outputs": ["sparse"]} if "outputs" in operation.fields() else {}

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        parsed = Parsed(listed(body["inputs"]), operation.params({**_params(body), **heads}))

        def render(result: Result) -> Any:
            answer = operation.answer(result.rows, result.encoded, parsed)
            return [each["sparse"] for each in answer] if heads else answer

        return operation.request(parsed), render

    return Endpoint(EMBED_SPARSE, HF, "Sparse embeddings of texts (TEI)",
                    {"type": "array", "items": sparse_vector_doc()}, body=schema, prepare=prepare,
                    errors=ERRORS, truncation_switch=AT_TOP)


def rerank(operation: Ranker, limit: int) -> Endpoint:
    schema = Object({"query": Text(), "texts": Array(Text(), max_items=limit),
                     "raw_scores": Boolean(default=False), "return_text": Boolean(default=False),
                     **operation.instruction_field(), **operation.chunking_fields(), **truncation()},
                    required=("query", "texts"))

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        parsed = Parsed(pairs(body["query"], body["texts"]), operation.params(_params(body, "query", "texts")))

        def render(result: Result) -> Any:
            return operation.render(operation.answer(result.rows, result.encoded, parsed), parsed)

        return operation.request(parsed), render

    return Endpoint(RERANK, HF, "Rank texts against a query (TEI)", operation.answer_doc(), body=schema,
                    prepare=prepare, errors=ERRORS, truncation_switch=AT_TOP)


def tokenize(tokenizer: TextTokenizer, limit: int) -> Endpoint:
    schema = Object({"inputs": texts_schema(limit), "add_special_tokens": Boolean(default=True)},
                    required=("inputs",))

    def prepare(body: dict[str, Any]) -> tuple[None, Render]:
        texts = [body["inputs"]] if isinstance(body["inputs"], str) else body["inputs"]

        def render(_: None) -> Any:
            answer = []
            for text, encoding in zip(texts, tokenizer.tokens(texts, body["add_special_tokens"])):
                tokens = []
                for token_id, token, special, (start, stop) in zip(encoding.ids, encoding.tokens,
                                                                   encoding.special_tokens_mask, encoding.offsets):
                    if special:
                        tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
                    else:
                        tokens.append({"id": token_id, "text": text[start:stop], "special": False,
                                       "start": start, "stop": stop})
                answer.append(tokens)
            return answer

        return None, render

    token = {"type": "object", "properties": {"id": {"type": "integer"}, "text": {"type": "string"},
                                              "special": {"type": "boolean"},
                                              "start": {"type": "integer", "nullable": True},
                                              "stop": {"type": "integer", "nullable": True}}}
    answer = {"type": "array", "items": {"type": "array", "items": token}}
    return Endpoint("/tokenize", HF, "Tokenize texts (TEI)", answer, body=schema, prepare=prepare, errors=ERRORS)


def decode(tokenizer: TextTokenizer, limit: int) -> Endpoint:
    token = Integer(minimum=0, maximum=tokenizer.vocab_size - 1)
    schema = Object({"ids": OneOf((Array(token), Array(Array(token), max_items=limit)),
                                  "a list of token ids or a list of lists of token ids"),
                     "skip_special_tokens": Boolean(default=True)}, required=("ids",))

    def prepare(body: dict[str, Any]) -> tuple[None, Render]:
        ids = body["ids"] if isinstance(body["ids"][0], list) else [body["ids"]]
        return None, lambda _: tokenizer.decode(ids, body["skip_special_tokens"])

    answer = {"type": "array", "items": {"type": "string"}}
    return Endpoint("/decode", HF, "Token ids back to text (TEI)", answer, body=schema, prepare=prepare, errors=ERRORS)
