"""Dense embeddings: the graph's token vectors pooled as the manifest says (unless the graph pools), optionally
normalized, truncated to fewer dimensions, or answered in a narrower precision."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from infinity.engine.tokenization import Encoded
from infinity.errors import ValidationError
from infinity.manifest import RANGES, Manifest
from infinity.tasks.prompts import PromptedTask


def pool(hidden: np.ndarray, attention_mask: np.ndarray, pooling: str) -> np.ndarray:
    """sentence-transformers' pooling over a padded batch, padded on either side; "a+b" concatenates modes."""
    hidden = hidden.astype(np.float32)
    return np.concatenate([_pool_one(hidden, attention_mask, mode) for mode in pooling.split("+")], axis=-1)


def _pool_one(hidden: np.ndarray, attention_mask: np.ndarray, mode: str) -> np.ndarray:
    rows = np.arange(len(hidden))
    real = attention_mask > 0
    if mode == "cls":
        return hidden[rows, real.argmax(axis=1)]  # the first real token
    if mode == "lasttoken":
        return hidden[rows, real.shape[1] - 1 - real[:, ::-1].argmax(axis=1)]  # the last real token
    mask = real[..., None].astype(np.float32)
    if mode == "max":
        return np.where(mask > 0, hidden, -np.inf).max(axis=1)
    if mode == "weightedmean":
        # weights 1, 2, 3 ... from each row's first real token
        mask = mask * (np.arange(1, real.shape[1] + 1) - real.argmax(axis=1)[:, None])[..., None]
    total = np.maximum(mask.sum(axis=1), 1e-9)
    if mode == "mean_sqrt_len_tokens":
        total = np.sqrt(total)
    elif mode not in ("mean", "weightedmean"):
        raise ValueError(f"unknown pooling mode {mode!r}")
    return (hidden * mask).sum(axis=1) / total


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)  # np.clip costs 2.4 us more


PRECISIONS = ("float", "int8", "uint8", "binary", "ubinary")


def quantized(vectors: np.ndarray, precision: str, ranges: np.ndarray | None) -> np.ndarray:
    """Vectors as sentence-transformers' quantize_embeddings computes them, with the int8/uint8 `ranges`
    (2 x dim) fixed at optimize time: a value past its dimension's range lands on the end step."""
    if precision == "float":
        return vectors
    if precision in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=-1)
        return packed if precision == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
    assert ranges is not None
    starts = ranges[0, :]
    steps = (ranges[1, :] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    steps_taken = np.clip(np.floor((vectors - starts) / steps), 0, 255)
    return steps_taken.astype(np.uint8) if precision == "uint8" else (steps_taken - 128).astype(np.int8)


class FeatureExtraction(PromptedTask):
    name = "feature-extraction"
    window_rule = "its windows' pooled vectors averaged by token count"

    def __init__(self, manifest: Manifest, directory: Path | None = None) -> None:
        super().__init__(manifest, directory)
        ranges = manifest.task.embedding_ranges or {}
        self.ranges = {name: np.asarray(value, dtype=np.float32) for name, value in ranges.items()}

    @property
    def dim(self) -> int | None:
        return self.manifest.task.embedding_dim

    def check_precision(self, precisions: list[str]) -> None:
        """int8 and uint8 need the ranges the optimizer writes into the manifest."""
        ranged = [p for p in precisions if p in ("int8", "uint8")]
        if ranged and not self.ranges:
            raise ValidationError(f"{ranged[0]} needs the per-dimension ranges the optimizer writes into the manifest, "
                                  "and this artifact has none: optimize the model again, or ask for binary or ubinary")

    def answer_vectors(self, rows: np.ndarray, precision: str, normalize: bool,
                       dimensions: int | None = None) -> np.ndarray:
        """Pooled rows -> the vectors a client asked for: cut to `dimensions`, normalized, at `precision`. int8 and
        uint8 are the full vector's steps over its calibrated ranges, then cut: not renormalized after the cut, as
        the ranges hold for the full vector."""
        if precision not in ("int8", "uint8"):
            return quantized(self.embed(rows, normalize, dimensions), precision, None)
        self.check_precision([precision])
        steps = quantized(self.embed(rows, normalize), precision, self.ranges[RANGES[0 if normalize else 1]])
        return np.ascontiguousarray(steps[:, :dimensions])

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        if self.manifest.task.pooled_in_graph:
            return output.astype(np.float32)
        return pool(output, attention_mask, self.manifest.task.pooling or "mean")

    @property
    def answers_tokens(self) -> bool:
        """The graph answers token vectors (pooling runs here); a graph with modules after pooling does not."""
        return not self.manifest.task.pooled_in_graph

    def token_vectors(self, output: np.ndarray) -> np.ndarray:
        if not self.answers_tokens:
            raise ValidationError("this artifact's graph answers pooled vectors only")
        return output.astype(np.float32)

    def token_answers(self, rows: np.ndarray, encoded: list[Encoded]) -> list[np.ndarray]:
        """Each text's token vectors, from token_vectors' padded rows: every token's, padding cut."""
        return [row[:len(item)] for row, item in zip(rows, encoded)]

    @property
    def windowed(self) -> bool:  # type: ignore[override]
        """Windows are pooled here, before normalizing; a graph that pools (and may normalize) itself is not."""
        return self.answers_tokens

    def joined_windows(self, rows: np.ndarray, windows: list[list[Encoded]]) -> np.ndarray:
        """Each text's pooled window rows (in order, before normalizing) as one: their mean weighted by each window's
        tokens, which for mean pooling is the mean over every token of the text, read window by window. A text of
        one window keeps its row as it is."""
        spans = self.spans(windows)
        joined = rows[[start for start, _ in spans]]  # a copy: each text's first window's row
        for index, (text, (start, end)) in enumerate(zip(windows, spans)):
            if end - start > 1:
                weights = np.array([len(window) for window in text], np.float64)
                joined[index] = weights @ rows[start:end].astype(np.float64) / weights.sum()
        return joined

    def embed(self, rows: np.ndarray, normalize: bool, dimensions: int | None = None) -> np.ndarray:
        """Pooled rows -> the vectors a client gets: cut to `dimensions` first, then normalized. The answer is
        C-contiguous, as orjson requires: a cut (or CLS pooling) is a strided view until normalizing copies it."""
        if dimensions is not None:
            if dimensions > rows.shape[-1]:
                raise ValidationError(f"dimensions is {dimensions}, but the model has {rows.shape[-1]}")
            rows = rows[:, :dimensions]
        return l2_normalize(rows) if normalize else np.ascontiguousarray(rows)
