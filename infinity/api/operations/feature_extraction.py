"""Dense embeddings' operation: the vectors a request asks for (normalized, cut to `dimensions`, at `precision`),
sentence-similarity's cosines, and every token's vector for TEI's /embed_all."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from infinity.api import cohere, openai, tei
from infinity.api.endpoint import Endpoint
from infinity.api.hf import HF
from infinity.api.operations.base import Operation, Params, Parsed, Served, Tensors, prompt_fields
from infinity.engine.job import Job
from infinity.engine.tokenization import Encoded
from infinity.manifest import TaskName
from infinity.schema import Array, Boolean, Choice, Integer, Object, OneOf, Schema, Text
from infinity.tasks.feature_extraction import PRECISIONS, FeatureExtraction

PRECISION_HELP = ("float; int8 or uint8 (each dimension in 256 steps over the range the optimizer calibrated on the "
                  "full vectors; with dimensions, the first N steps); binary or ubinary (one sign bit per "
                  "dimension, packed 8 to a byte): sentence-transformers' quantize_embeddings. Sentence-similarity "
                  "answers cosines of the float vectors")
EMBEDDINGS = (*((path, openai.OPENAI) for path in openai.EMBEDDINGS), (tei.EMBED, HF), (tei.EMBED_ALL, HF),
              *((path, cohere.COHERE) for path in cohere.EMBED))


@dataclass(frozen=True)
class EmbeddingParams(Params):
    normalize: bool
    dimensions: int | None
    precision: str
    prompt_name: str | None  # None: the model's default prompt, if it has one


class FeatureExtractionOperation(Operation[FeatureExtraction, EmbeddingParams]):
    name = TaskName.FEATURE_EXTRACTION
    params_type: ClassVar[type[Params]] = EmbeddingParams
    top_level: ClassVar[tuple[str, ...]] = ("normalize", "dimensions", "prompt_name", "precision", "chunking")
    paths = EMBEDDINGS

    def inputs(self, limit: int) -> Schema:
        similarity = Object({"source_sentence": Text(), "sentences": Array(Text(), max_items=limit - 1)},
                            required=("source_sentence", "sentences"),
                            description="sentence-similarity: cosine of each sentence with source_sentence")
        return OneOf((Text(), Array(Text(), max_items=limit), similarity),
                     'a string, a list of strings, or {"source_sentence": str, "sentences": [str, ...]}')

    def parameters(self) -> dict[str, Schema]:
        return {"normalize": Boolean(default=self.task.manifest.task.normalize,
                                     description="scale each vector to unit length"),
                "dimensions": self.dimensions_field(), "precision": self.precision_field(),
                **prompt_fields(self.task), **self.chunking_fields()}

    def dimensions_field(self) -> Integer:
        return Integer(minimum=1, maximum=self.task.dim,
                       description="keep the first N dimensions (Matryoshka), then normalize")

    def precision_field(self) -> Choice:
        return Choice(PRECISIONS, default="float", description=PRECISION_HELP)

    def vector_doc(self) -> dict[str, Any]:
        """One embedding: `dimensions` shortens it, so its length is a range."""
        vector: dict[str, Any] = {"type": "array", "items": {"type": "number"}, "minItems": 1}
        if self.task.dim:
            vector["maxItems"] = self.task.dim
        return vector

    def token_doc(self) -> dict[str, Any]:
        return {"type": "array", "items": {"type": "array", "items": {"type": "number"}, "minItems": 1},
                "description": "one vector per token, the special tokens included"}

    def answer_doc(self) -> dict[str, Any]:
        # A single text's vector and sentence-similarity's cosines are both lists of numbers, so they share one arm
        # (two arms that match the same answer fail oneOf).
        numbers = {"type": "array", "items": {"type": "number"}, "minItems": 1,
                   "description": "a single text's vector, or for sentence-similarity the cosine of each sentence "
                                  "with source_sentence"}
        return {"oneOf": [numbers, {"type": "array", "items": self.vector_doc(), "minItems": 1}]}

    def read(self, inputs: Any, params: EmbeddingParams) -> Parsed[EmbeddingParams]:
        if isinstance(inputs, dict):
            return Parsed([inputs["source_sentence"], *inputs["sentences"]], params, similarity=True)
        return super().read(inputs, params)

    def specific(self, job: Job, params: EmbeddingParams) -> Job:
        self.task.check_precision([params.precision])
        return self.task.prompted(job, params.prompt_name)

    def answer(self, rows: np.ndarray, encoded: list[Encoded], parsed: Parsed[EmbeddingParams]) -> Any:
        """The vectors (inputs x dimensions) the parameters ask for: cut to `dimensions`, normalized, at
        `precision`; for sentence-similarity each sentence's cosine with the source sentence; with `tokens`, each
        text's token vectors."""
        params = parsed.params
        if parsed.tokens:
            return self.task.token_answers(rows, encoded)
        if parsed.similarity:
            vectors = self.task.embed(rows, True, params.dimensions)
            return vectors[1:] @ vectors[0]
        return self.vectors(rows, params)

    def vectors(self, rows: np.ndarray, params: EmbeddingParams) -> np.ndarray:
        return self.task.answer_vectors(rows, params.precision, params.normalize, params.dimensions)

    def routes(self, at: Served) -> list[Endpoint]:
        tokens = [tei.embed_all(self, at.limit)] if self.task.answers_tokens else []
        return [*openai.embeddings(self, at.limit, at.vocabulary, at.name, at.settings.openai_token_ids),
                tei.embed(self, at.limit), *tokens, *cohere.embed_endpoints(self, at.limit)]

    def tensors(self) -> Tensors:
        return Tensors(("text",), ("text",), "embedding", [-1, self.task.dim or -1],
                              lambda named: list(named["text"]), np.asarray)

