"""Ranking: a cross-encoder's (or a causal reranker's, through its template) score of each query-document pair; a
document run in windows is scored by its best window."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from infinity.engine.job import Job
from infinity.engine.tokenization import Encoded, TextInput
from infinity.tasks.base import Task, activate


class Ranking(Task):
    name = "ranking"
    windowed = True
    window_rule = "each window of the document beside the whole query, the best window's score the document's"

    def joined_windows(self, rows: np.ndarray, windows: list[list[Encoded]]) -> np.ndarray:
        """Each document's score: the best of its windows' (before the activation, which keeps their order)."""
        return self.largest(rows, windows)

    def templated(self, request: Job, texts: Sequence[TextInput]) -> list[TextInput]:
        """A causal reranker reads each (query, document) pair through its template, with the manifest's
        instruction unless the request names its own (its tokenizer puts the prompt's prefix and suffix around
        it); a cross-encoder reads the pair itself."""
        reranker = self.manifest.task.reranker
        if reranker is None:
            return list(texts)
        instruction = reranker.instruction if request.instruction is None else request.instruction
        return [reranker.template.format(instruction=instruction, query=text[0], document=text[1])
                if isinstance(text, tuple) else text for text in texts]

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return output[:, 0]

    def scores(self, rows: np.ndarray, raw: bool = False) -> np.ndarray:
        return activate(rows, "none" if raw else (self.manifest.task.score_activation or "sigmoid"))
