from __future__ import annotations

from typing import Any

import numpy as np

from infinity.tasks.base import Request, Task, flag, text_list
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
    return vectors / np.clip(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12, None)


class FeatureExtraction(Task):
    name = "feature-extraction"
    parameters = ("normalize",)

    def parse(self, inputs: Any, parameters: dict[str, Any]) -> Request:
        parameters = self.check_parameters(parameters)
        texts, single = text_list(inputs)
        params = {"normalize": flag(parameters, "normalize", self.manifest.task.normalize)}
        return Request(texts, params, single, flag(parameters, "truncate", True))

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return pool(output, attention_mask, self.manifest.task.pooling or "mean")

    def respond(self, rows: np.ndarray, request: Request, encoded: list[Encoded]) -> Any:
        vectors = l2_normalize(rows) if request.params["normalize"] else rows
        return vectors[0] if request.single else vectors
