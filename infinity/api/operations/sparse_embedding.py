"""Sparse embeddings' operation: each text's weights above a threshold, at most the top_k largest."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from infinity.api import tei
from infinity.api.endpoint import Endpoint
from infinity.api.hf import HF
from infinity.api.operations.base import (
    Operation,
    Params,
    Parsed,
    Served,
    one_or_many,
    prompt_fields,
    selection,
    sparse_vector_doc,
)
from infinity.engine.job import Job
from infinity.engine.tokenization import Encoded
from infinity.manifest import TaskName
from infinity.schema import Schema
from infinity.tasks.sparse_embedding import SparseEmbedding


@dataclass(frozen=True)
class SparseParams(Params):
    top_k: int | None
    threshold: float
    prompt_name: str | None


class SparseEmbeddingOperation(Operation[SparseEmbedding, SparseParams]):
    name = TaskName.SPARSE_EMBEDDING
    params_type = SparseParams
    top_level = ("top_k", "threshold", "prompt_name")
    paths = ((tei.EMBED_SPARSE, HF),)

    def parameters(self) -> dict[str, Schema]:
        return {**self.selection(), **prompt_fields(self.task), **self.chunking_fields()}

    def selection(self) -> dict[str, Schema]:
        return selection(self.task.manifest.task.embedding_dim)

    def answer_doc(self) -> dict[str, Any]:
        return one_or_many(sparse_vector_doc())

    def specific(self, job: Job, params: SparseParams) -> Job:
        return self.task.prompted(job, params.prompt_name)

    def answer(self, rows: np.ndarray, encoded: list[Encoded], parsed: Parsed[SparseParams]) -> Any:
        return self.task.sparse_answers(rows, encoded, parsed.params.threshold, parsed.params.top_k)

    def routes(self, at: Served) -> list[Endpoint]:
        return [tei.embed_sparse(self, at.limit)]
