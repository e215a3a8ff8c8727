"""Multi-vector embeddings (ColBERT): the graph answers every token's vector, projected and normalized; the server
keeps the tokens the model's rules keep for the input's role, a query or a document."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from infinity.engine.job import Job
from infinity.engine.tokenization import Encoded
from infinity.manifest import Manifest, MultiVector, QueryExpansion
from infinity.tasks.base import Task


def expanded(item: Encoded, expansion: QueryExpansion) -> Encoded:
    """A query filled up to the expansion length with the expansion token; the model reads the filler only where
    the expansion attends to it."""
    missing = expansion.length - len(item)
    if missing <= 0:
        return item
    return Encoded(ids=[*item.ids, *[expansion.token_id] * missing], type_ids=[*item.type_ids, *[0] * missing],
                   offsets=[*item.offsets, *[(0, 0)] * missing], special=[*item.special, *[1] * missing],
                   attended=None if expansion.attend else len(item))


DOCUMENT = "document"  # the role of an input whose request names none


class MultiVectorEmbedding(Task):
    name = "multi-vector"
    windowed = True
    rows_per_token = True
    window_rule = ("a document's windows of its own length, each beginning with its prompt, their token vectors one "
                   "after another (a query is cut to its length, as the model cuts it)")

    def __init__(self, manifest: Manifest, directory: Path | None = None) -> None:
        super().__init__(manifest, directory)
        assert manifest.task.multi_vector is not None  # check_facts requires it
        self.rules: MultiVector = manifest.task.multi_vector
        self.skiplist = np.asarray(self.rules.skiplist_ids, dtype=np.int64)

    def in_role(self, request: Job, role: str) -> Job:
        """The request's texts in one role, with its prompt before each and its maximum length."""
        prompt = self.manifest.task.prompts.get(role, "")
        if prompt:
            request.texts = [prompt + text for text in request.texts]  # type: ignore[operator]  # texts, not pairs
        request.max_length, request.role, request.prompt = self.rules.max_length(role), role, prompt
        return request

    def in_windows(self, request: Job) -> bool:
        return request.role == DOCUMENT

    def joined(self, rows: np.ndarray, windows: list[list[Encoded]],
               tokens: bool = False) -> tuple[np.ndarray, list[Encoded]]:
        """A document's token vectors and tokens, its windows' one after another: each window's skiplist applies
        as in a short document."""
        return super().joined(rows, windows, tokens=True)

    def encoded(self, request: Job, items: list[Encoded]) -> list[Encoded]:
        expansion = self.rules.expansion
        if request.role != "query" or expansion is None:
            return items
        return [expanded(item, expansion) for item in items]

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return output.astype(np.float32)

    def vectors(self, rows: np.ndarray, encoded: list[Encoded], role: str) -> list[np.ndarray]:
        """Each input's vectors: its tokens (padding never), less the skiplist's in the roles it applies to."""
        skips = role in self.rules.skiplist_roles and len(self.skiplist) > 0
        answers = []
        for row, item in zip(rows, encoded):
            vectors = row[:len(item)]
            if skips:
                vectors = vectors[~np.isin(np.asarray(item.ids), self.skiplist)]
            answers.append(np.ascontiguousarray(vectors))
        return answers
