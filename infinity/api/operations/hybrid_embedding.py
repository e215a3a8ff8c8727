"""bge-m3's operation: the dense answer as feature-extraction gives it, beside the sparse and ColBERT ones `outputs`
names."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from infinity.api import tei
from infinity.api.endpoint import Endpoint
from infinity.api.hf import HF
from infinity.api.operations.base import (
    Parsed,
    Served,
    Tensors,
    one_or_many,
    selection,
    sparse_vector_doc,
    texts_schema,
)
from infinity.api.operations.feature_extraction import EMBEDDINGS, EmbeddingParams, FeatureExtractionOperation
from infinity.engine.tokenization import Encoded
from infinity.manifest import TaskName
from infinity.schema import Array, Choice, Schema
from infinity.tasks.hybrid_embedding import HEADS, HybridEmbedding


@dataclass(frozen=True)
class HybridParams(EmbeddingParams):
    outputs: tuple[str, ...]
    top_k: int | None
    threshold: float


class HybridEmbeddingOperation(FeatureExtractionOperation):
    task: HybridEmbedding
    name = TaskName.HYBRID_EMBEDDING
    params_type = HybridParams
    top_level = (*FeatureExtractionOperation.top_level, "outputs", "top_k", "threshold")
    paths = (*EMBEDDINGS, (tei.EMBED_SPARSE, HF))

    def inputs(self, limit: int) -> Schema:
        return texts_schema(limit)  # no sentence-similarity

    def parameters(self) -> dict[str, Schema]:
        return {"outputs": Array(Choice(HEADS), max_items=len(HEADS), default=list(HEADS),
                                 description="which embeddings each answer holds"),
                **super().parameters(), **self.selection()}

    def selection(self) -> dict[str, Schema]:
        return selection(None)

    def token_doc(self) -> dict[str, Any]:
        width = self.task.layout.colbert_dim
        vector = {"type": "array", "items": {"type": "number"}, "minItems": width, "maxItems": width}
        return {"type": "array", "items": vector, "description": "one ColBERT vector per token but the first"}

    def answer_doc(self) -> dict[str, Any]:
        one = {"type": "object", "properties": {"dense": self.vector_doc(), "sparse": sparse_vector_doc(),
                                                "colbert": self.token_doc()},
               "description": "the embeddings `outputs` names"}
        return one_or_many(one)

    def answer(self, rows: np.ndarray, encoded: list[Encoded], parsed: Parsed[HybridParams]) -> Any:  # type: ignore[override]
        """Each text's embeddings by head, those `outputs` names."""
        task, params = self.task, parsed.params
        by_head: dict[str, Any] = {}
        if "dense" in params.outputs:
            by_head["dense"] = self.vectors(rows, params)
        if "sparse" in params.outputs:
            by_head["sparse"] = task.sparse_answers(rows, encoded, params.threshold, params.top_k)
        if "colbert" in params.outputs:
            by_head["colbert"] = task.token_answers(rows, encoded)
        return [dict(zip(by_head, values)) for values in zip(*by_head.values())]

    def routes(self, at: Served) -> list[Endpoint]:
        """Feature-extraction's routes with the dense vectors, beside TEI's sparse route."""
        return [*FeatureExtractionOperation(self.task).routes(at), tei.embed_sparse(self, at.limit)]

    def tensors(self) -> Tensors:
        """The dense vectors."""
        return Tensors(("text",), ("text",), "embedding", [-1, self.task.dim or -1],
                              lambda named: list(named["text"]),
                              lambda answers: np.stack([each["dense"] for each in answers]),
                              fixed={"outputs": ["dense"]})
