"""Multi-vector embeddings' operation: each text's token vectors in the role it is sent in, a query or a
document."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from infinity.api import tei
from infinity.api.endpoint import Endpoint
from infinity.api.hf import HF
from infinity.api.operations.base import Operation, Params, Parsed, Served, one_or_many
from infinity.engine.job import Job
from infinity.engine.tokenization import Encoded
from infinity.manifest import ROLES, TaskName
from infinity.schema import Choice, Schema
from infinity.tasks.multi_vector import DOCUMENT, MultiVectorEmbedding


@dataclass(frozen=True)
class MultiVectorParams(Params):
    input_type: str


class MultiVectorOperation(Operation[MultiVectorEmbedding, MultiVectorParams]):
    name = TaskName.MULTI_VECTOR
    params_type = MultiVectorParams
    top_level = ("input_type", "chunking")
    paths = ((tei.EMBED_ALL, HF),)

    def parameters(self) -> dict[str, Schema]:
        return {"input_type": self.role_field(), **self.chunking_fields()}

    def role_field(self) -> Schema:
        return Choice(ROLES, default=DOCUMENT,
                      description="query or document: each gets the model's own prompt and length, a query its "
                                  "expansion, a document its skiplist")

    def matrix_doc(self) -> dict[str, Any]:
        vector: dict[str, Any] = {"type": "array", "items": {"type": "number"}}
        if self.task.manifest.task.embedding_dim:
            vector["minItems"] = vector["maxItems"] = self.task.manifest.task.embedding_dim
        return {"type": "array", "items": vector, "description": "one vector per token the model scores"}

    def answer_doc(self) -> dict[str, Any]:
        return one_or_many(self.matrix_doc())

    def specific(self, job: Job, params: MultiVectorParams) -> Job:
        return self.task.in_role(job, params.input_type)

    def answer(self, rows: np.ndarray, encoded: list[Encoded], parsed: Parsed[MultiVectorParams]) -> Any:
        return self.task.vectors(rows, encoded, parsed.params.input_type)

    def routes(self, at: Served) -> list[Endpoint]:
        return [tei.multi_vectors(self, at.limit)]
