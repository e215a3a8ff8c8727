from __future__ import annotations

from typing import Any

import numpy as np

from infinity.errors import ValidationError
from infinity.schema import Array, Boolean, Integer, Object, OneOf, Schema, Text
from infinity.tasks.base import Parsed, Request, Task
from infinity.tokenization import Encoded


def pool(hidden: np.ndarray, attention_mask: np.ndarray, pooling: str) -> np.ndarray:
    hidden = hidden.astype(np.float32)
    if pooling == "cls":
        return hidden[:, 0]
    mask = attention_mask[..., None].astype(np.float32)
    if pooling == "max":
        return np.where(mask > 0, hidden, -1e9).max(axis=1)
    return (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)  # np.clip costs 2.4 us more


class FeatureExtraction(Task):
    name = "feature-extraction"
    top_level = ("normalize", "dimensions")

    @property
    def dim(self) -> int | None:
        return self.manifest.task.embedding_dim

    def inputs(self, limit: int) -> Schema:
        similarity = Object({"source_sentence": Text(), "sentences": Array(Text(), max_items=limit - 1)},
                            required=("source_sentence", "sentences"),
                            description="sentence-similarity: cosine of each sentence with source_sentence")
        return OneOf((Text(), Array(Text(), max_items=limit), similarity),
                     'a string, a list of strings, or {"source_sentence": str, "sentences": [str, ...]}')

    def parameters(self) -> dict[str, Schema]:
        return {"normalize": Boolean(default=self.manifest.task.normalize,
                                     description="scale each vector to unit length"),
                "dimensions": Integer(minimum=1, maximum=self.dim,
                                      description="keep the first N dimensions (Matryoshka), then normalize")}

    def vector_doc(self) -> dict[str, Any]:
        """One embedding: `dimensions` shortens it, so its length is a range."""
        vector: dict[str, Any] = {"type": "array", "items": {"type": "number"}, "minItems": 1}
        if self.dim:
            vector["maxItems"] = self.dim
        return vector

    def answer_doc(self) -> dict[str, Any]:
        # A single text's vector and sentence-similarity's cosines are both lists of numbers, so they share one arm
        # (two arms that match the same answer fail oneOf).
        numbers = {"type": "array", "items": {"type": "number"}, "minItems": 1,
                   "description": "a single text's vector, or for sentence-similarity the cosine of each sentence "
                                  "with source_sentence"}
        return {"oneOf": [numbers, {"type": "array", "items": self.vector_doc(), "minItems": 1}]}

    def parse(self, inputs: Any, params: dict[str, Any]) -> Parsed:
        options = {"normalize": params.get("normalize", self.manifest.task.normalize),
                   "dimensions": params.get("dimensions"), "similarity": isinstance(inputs, dict)}
        if options["similarity"]:
            return Parsed(Request([inputs["source_sentence"], *inputs["sentences"]]), options, single=False)
        if isinstance(inputs, str):
            return Parsed(Request([inputs]), options, single=True)
        return Parsed(Request(inputs), options, single=False)

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return pool(output, attention_mask, self.manifest.task.pooling or "mean")

    def embed(self, rows: np.ndarray, normalize: bool, dimensions: int | None = None) -> np.ndarray:
        """Pooled rows -> the vectors a client gets: cut to `dimensions` first, then normalized. The answer is
        C-contiguous, as orjson requires: a cut (or CLS pooling) is a strided view until normalizing copies it."""
        if dimensions is not None:
            if dimensions > rows.shape[-1]:
                raise ValidationError(f"dimensions is {dimensions}, but the model has {rows.shape[-1]}")
            rows = rows[:, :dimensions]
        return l2_normalize(rows) if normalize else np.ascontiguousarray(rows)

    def respond(self, rows: np.ndarray, parsed: Parsed, encoded: list[Encoded]) -> Any:
        params = parsed.params
        if params["similarity"]:
            vectors = self.embed(rows, True, params["dimensions"])
            return vectors[1:] @ vectors[0]
        vectors = self.embed(rows, params["normalize"], params["dimensions"])
        return vectors[0] if parsed.single else vectors
