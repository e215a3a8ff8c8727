"""Text Embeddings Inference's native routes: /embed, /embed_all, /embed_sparse, /rerank, /tokenize, /decode.
TEI's error shape is /predict's ({"error": ..., "error_type": ...}): they belong to the HF family."""
from __future__ import annotations

from typing import Any, cast

from infinity.api.endpoint import Endpoint, Render
from infinity.api.hf import AT_TOP, ERRORS, HF, truncation
from infinity.api.operations import (
    FeatureExtractionOperation,
    HybridEmbeddingOperation,
    MultiVectorOperation,
    RankingOperation,
    SparseEmbeddingOperation,
    listed,
    operation_for,
    pairs,
    prompt_fields,
    sparse_vector_doc,
    texts_schema,
)
from infinity.engine.service import Result
from infinity.engine.tokenization import TextTokenizer
from infinity.schema import Array, Boolean, Integer, Object, OneOf, Text
from infinity.tasks import Job
from infinity.tasks.feature_extraction import FeatureExtraction
from infinity.tasks.hybrid_embedding import HybridEmbedding
from infinity.tasks.multi_vector import MultiVectorEmbedding
from infinity.tasks.ranking import Ranking
from infinity.tasks.sparse_embedding import SparseEmbedding

EMBED, EMBED_ALL, EMBED_SPARSE, RERANK = "/embed", "/embed_all", "/embed_sparse", "/rerank"


def embed(task: FeatureExtraction, limit: int) -> Endpoint:
    operation = FeatureExtractionOperation(task)
    schema = Object({"inputs": texts_schema(limit),
                     "normalize": Boolean(default=True, description="scale each vector to unit length"),
                     "dimensions": operation.dimensions_field(), "precision": operation.precision_field(),
                     **prompt_fields(task), **operation.chunking_fields(), **truncation()}, required=("inputs",))

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        def render(result: Result) -> Any:
            return operation.vectors(result.rows, body)

        return operation.request(listed(body["inputs"]), body), render

    return Endpoint(EMBED, HF, "Embed texts (TEI)", {"type": "array", "items": operation.vector_doc()}, body=schema,
                    prepare=prepare, errors=ERRORS, truncation_switch=AT_TOP)


def embed_all(task: FeatureExtraction | MultiVectorEmbedding, limit: int) -> Endpoint:
    """Every token's vector, as the model's last layer answers it (special tokens included, padding not); a
    multi-vector model's: the tokens it scores, for the role the body names."""
    if isinstance(task, MultiVectorEmbedding):
        return multi_vectors(task, limit)
    operation = cast(FeatureExtractionOperation, operation_for(task))
    schema = Object({"inputs": texts_schema(limit), **prompt_fields(task), **operation.chunking_fields(),
                     **truncation()}, required=("inputs",))

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        def render(result: Result) -> Any:
            return task.token_answers(result.rows, result.encoded)

        return operation.request(listed(body["inputs"]), body, tokens=True), render

    return Endpoint(EMBED_ALL, HF, "Every token's vector of each text (TEI)",
                    {"type": "array", "items": operation.token_doc()}, body=schema, prepare=prepare, errors=ERRORS,
                    truncation_switch=AT_TOP)


def multi_vectors(task: MultiVectorEmbedding, limit: int) -> Endpoint:
    operation = MultiVectorOperation(task)
    schema = Object({"inputs": texts_schema(limit), "input_type": operation.role_field(),
                     **operation.chunking_fields(), **truncation()}, required=("inputs",))

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        def render(result: Result) -> Any:
            return task.vectors(result.rows, result.encoded, body["input_type"])

        return operation.request(listed(body["inputs"]), body), render

    return Endpoint(EMBED_ALL, HF, "The token vectors a multi-vector model scores, of each text (TEI's route)",
                    {"type": "array", "items": operation.matrix_doc()}, body=schema, prepare=prepare, errors=ERRORS,
                    truncation_switch=AT_TOP)


def embed_sparse(task: SparseEmbedding | HybridEmbedding, limit: int) -> Endpoint:
    operation = cast(SparseEmbeddingOperation | HybridEmbeddingOperation, operation_for(task))
    schema = Object({"inputs": texts_schema(limit), **operation.selection(), **prompt_fields(task),
                     **operation.chunking_fields(), **truncation()}, required=("inputs",))

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        def render(result: Result) -> Any:
            return task.sparse_answers(result.rows, result.encoded, body["threshold"], body.get("top_k"))

        return operation.request(listed(body["inputs"]), body), render

    return Endpoint(EMBED_SPARSE, HF, "Sparse embeddings of texts (TEI)",
                    {"type": "array", "items": sparse_vector_doc()}, body=schema, prepare=prepare,
                    errors=ERRORS, truncation_switch=AT_TOP)


def rerank(task: Ranking, limit: int) -> Endpoint:
    operation = RankingOperation(task)
    schema = Object({"query": Text(), "texts": Array(Text(), max_items=limit),
                     "raw_scores": Boolean(default=False), "return_text": Boolean(default=False),
                     **operation.instruction_field(), **operation.chunking_fields(), **truncation()},
                    required=("query", "texts"))

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        def render(result: Result) -> Any:
            return operation.ranking(result.rows, body["texts"], body["raw_scores"], None, body["return_text"])

        return operation.request(pairs(body["query"], body["texts"]), body), render

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
