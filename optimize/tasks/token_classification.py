"""Token classification: the checkpoint's head labels every token, against transformers."""
from __future__ import annotations

from typing import Any

import numpy as np

from infinity.engine.tokenization import TextInput
from infinity.manifest import TaskFacts, TaskName
from infinity.tasks.base import activate
from optimize.checkpoint import Checkpoint, Module
from optimize.measure import agreement
from optimize.measure.agreement import Outputs
from optimize.tasks.base import ClassifierHead, SourceModel, classifier_reference, labels


class TokenClassificationTask(ClassifierHead):
    name = TaskName.TOKEN_CLASSIFICATION
    metrics = ("label_agreement", "max_prob_diff")
    thresholds = {"label_agreement": 0.99}
    auto_model = "AutoModelForTokenClassification"

    def facts(self, checkpoint: Checkpoint, pooling: str | None,
              reranker: str | dict[str, str] | None) -> tuple[TaskFacts, list[Module]]:
        return TaskFacts(id2label=labels(checkpoint.config), score_activation="softmax"), []

    def reference(self, source: SourceModel, inputs: list[TextInput]) -> Outputs:
        def rows(logits: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
            probs = activate(logits, "softmax")  # what the server answers from
            return [probs[row, : int(mask[row].sum())] for row in range(len(probs))]

        return classifier_reference(source, self.load_model(source), inputs, rows)

    def reference_name(self, source: SourceModel) -> str:
        return "transformers, PyTorch FP32"

    def measure(self, reference: Outputs, candidate: Outputs, inputs: list[TextInput]) -> dict[str, float]:
        return agreement.token_labels(reference, candidate)

    def served_values(self, answer: Any, row: np.ndarray, item: Any) -> Any:
        """Each token's label probabilities, before the pipeline groups them."""
        return row[:len(item)].astype(np.float32)
