"""Sparse embeddings (SPLADE): the graph pools a masked-LM's logits into one weight per vocabulary entry, so the
server never holds more than a batch x vocabulary matrix; an answer lists the weights above a threshold."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from infinity.engine.tokenization import Encoded
from infinity.manifest import SPLADE_MAX_LOGITS, Manifest
from infinity.tasks.prompts import PromptedTask

SparseVector = list[dict[str, Any]]  # [{"index": vocabulary id, "value": weight}, ...] in index order


def sparse_rows(rows: np.ndarray, threshold: float = 0.0, top_k: int | None = None) -> list[SparseVector]:
    """Each row's weights above `threshold` (at most the `top_k` largest), in vocabulary order."""
    answers = []
    for row in rows:
        kept = np.flatnonzero(row > threshold)
        answers.append(sparse_vector(kept, row[kept], top_k))
    return answers


def sparse_vector(indices: np.ndarray, values: np.ndarray, top_k: int | None = None) -> SparseVector:
    """One sparse answer from weights in index order: at most the `top_k` largest, still in index order."""
    if top_k is not None and len(indices) > top_k:
        chosen = np.sort(np.argpartition(values, len(indices) - top_k)[len(indices) - top_k:])
        indices, values = indices[chosen], values[chosen]
    return [{"index": index, "value": value} for index, value in zip(indices.tolist(), values.tolist())]


class SparseEmbedding(PromptedTask):
    name = "sparse-embedding"

    def __init__(self, manifest: Manifest, directory: Path | None = None) -> None:
        super().__init__(manifest, directory)
        # the graph answers max-pooled logits through relu; SPLADE's log1p (twice for log1p_relu) is left to us
        self.activations = 0
        if SPLADE_MAX_LOGITS in manifest.model.outputs:
            self.activations = 2 if (manifest.task.splade or {}).get("activation_function") == "log1p_relu" else 1

    window_rule = "each vocabulary entry's largest weight over its windows"

    @property
    def windowed(self) -> bool:  # type: ignore[override]
        """Max pooling over a text's tokens is max pooling over its windows' maxima; a sum would count each window's
        special tokens again, so sum-pooled models are not run in windows."""
        return (self.manifest.task.splade or {}).get("pooling_strategy") == "max"

    def joined_windows(self, rows: np.ndarray, windows: list[list[Encoded]]) -> np.ndarray:
        """Each text's weights: the largest of its windows' for every vocabulary entry (the activations are
        monotonic, so taking them before or after the maximum gives the same weights)."""
        return self.largest(rows, windows)

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Batch x vocabulary weights. The activation runs on each row's non-zero values apart, so a row's
        weights never depend on the rows beside it."""
        rows = output.astype(np.float32)
        for _ in range(self.activations):
            for row in rows:
                kept = row > 0
                row[kept] = np.log1p(row[kept])
        return rows

    def sparse_answers(self, rows: np.ndarray, encoded: list[Encoded], threshold: float = 0.0,
                       top_k: int | None = None) -> list[SparseVector]:
        return sparse_rows(rows, threshold, top_k)
