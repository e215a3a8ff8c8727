"""Sequence classification: each text's (or pair's) scores, labelled with the manifest's labels, best first."""
from __future__ import annotations

from typing import Any

import numpy as np

from infinity.tasks.base import Task, activate


class SequenceClassification(Task):
    name = "sequence-classification"

    @property
    def default_function(self) -> str:
        """The function applied to the logits unless a request names another."""
        return self.manifest.task.score_activation or "softmax"

    def labelled(self, rows: np.ndarray, function: str, top_k: int | None) -> list[list[dict[str, Any]]]:
        labels = self.manifest.task.id2label or {}
        scores = activate(rows, function)
        results = []
        for row in scores:
            order = np.argsort(-row, kind="stable")[:top_k]
            results.append([{"label": labels.get(int(i), f"LABEL_{int(i)}"), "score": float(row[i])} for i in order])
        return results
