"""Hybrid embeddings (bge-m3): a dense, a sparse and a multi-vector embedding of each text from one pass. Each
token's row of the graph's output holds the last hidden state, the token's sparse weight and its ColBERT vector;
the server reads each head's answer from them as bge-m3's reference code does."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from infinity.engine.tokenization import Encoded, concatenated
from infinity.manifest import Hybrid, Manifest
from infinity.tasks.base import token_rows
from infinity.tasks.feature_extraction import FeatureExtraction
from infinity.tasks.sparse_embedding import SparseVector, sparse_vector

HEADS = ("dense", "sparse", "colbert")


class HybridEmbedding(FeatureExtraction):
    """The dense vector is a feature-extraction answer (every dense route serves it); the sparse vector lists
    each token id's largest weight; the ColBERT vectors are every token's but the first's."""
    name = "hybrid-embedding"

    def __init__(self, manifest: Manifest, directory: Path | None = None) -> None:
        super().__init__(manifest, directory)
        assert manifest.task.hybrid is not None  # check_facts requires it
        self.layout: Hybrid = manifest.task.hybrid
        self.unused = np.asarray(self.layout.unused_ids, dtype=np.int64)

    rows_per_token = True
    window_rule = ("each head by its own rule: the dense vector its windows' averaged by token count, the sparse "
                   "weights each token id's largest over the windows, the ColBERT vectors the windows' in order")

    def joined(self, rows: np.ndarray, windows: list[list[Encoded]],
               tokens: bool = False) -> tuple[np.ndarray, list[Encoded]]:
        """Each text as one sequence of its windows' tokens, every window's first token left out but the first
        window's, whose hidden state becomes the windows' first-token states averaged by token count: every head
        then reads it as one pass (the dense vector from the first token, each id's largest sparse weight, the
        ColBERT vectors of every token but the first)."""
        joined = token_rows(rows, windows, first=1)
        hidden = self.layout.hidden_size
        for row, dense in zip(joined, self.joined_windows(rows[:, 0, :hidden], windows)):
            row[0, :hidden] = dense
        return joined, [concatenated([text[0], *(strip_first(window) for window in text[1:])]) for text in windows]

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return output.astype(np.float32)

    def embed(self, rows: np.ndarray, normalize: bool, dimensions: int | None = None) -> np.ndarray:
        """The dense vectors: each text's first token's hidden state (the server pads on the right)."""
        return super().embed(np.stack([row[0, :self.layout.hidden_size] for row in rows]), normalize, dimensions)

    def sparse_answers(self, rows: np.ndarray, encoded: list[Encoded], threshold: float = 0.0,
                       top_k: int | None = None) -> list[SparseVector]:
        """Each text's token ids with their largest weight, the unused ids (and weights of 0) left out, in id
        order: `threshold` and `top_k` select as on a sparse-embedding server."""
        answers = []
        for row, item in zip(rows, encoded):
            ids = np.asarray(item.ids, dtype=np.int64)
            weights = row[:len(item), self.layout.hidden_size]
            kept = (weights > threshold) & ~np.isin(ids, self.unused)
            unique, slots = np.unique(ids[kept], return_inverse=True)
            best = np.zeros(len(unique), dtype=np.float32)
            np.maximum.at(best, slots, weights[kept])
            answers.append(sparse_vector(unique, best, top_k))
        return answers

    def token_answers(self, rows: np.ndarray, encoded: list[Encoded]) -> list[np.ndarray]:
        """The ColBERT vectors: every token's but the first's (bge-m3 scores no [CLS]), normalized in the graph."""
        start = self.layout.hidden_size + 1
        return [np.ascontiguousarray(row[1:len(item), start:]) for row, item in zip(rows, encoded)]


def strip_first(window: Encoded) -> Encoded:
    return Encoded(ids=window.ids[1:], type_ids=window.type_ids[1:], offsets=window.offsets[1:],
                   special=window.special[1:])
