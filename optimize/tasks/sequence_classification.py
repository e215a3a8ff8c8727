"""Sequence classification: the checkpoint's classifier head over a text or a text pair, against transformers."""
from __future__ import annotations

from typing import Any

import numpy as np

from infinity.engine.tokenization import TextInput
from infinity.manifest import TaskFacts, TaskName
from infinity.tasks.base import activate
from optimize import agreement
from optimize.agreement import Outputs
from optimize.checkpoint import Checkpoint, Module, SourceModel
from optimize.tasks.base import OptimizerTask, UnsupportedModel, classifier_reference


def labels(config: Any) -> dict[int, str]:
    return {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}


class ClassifierHead(OptimizerTask):
    """A task whose checkpoint must bring its trained head."""

    def refuse_missing(self, source: SourceModel, missing: str) -> None:
        # scores and labels from random weights, which the PyTorch reference (started from other random weights)
        # would not even match
        raise UnsupportedModel(f"{source.path.name} has no trained {self.name} head (missing {missing}): pass a "
                               f"checkpoint fine-tuned for {self.name}, or --task feature-extraction for its "
                               "embeddings")


class SequenceClassification(ClassifierHead):
    name = TaskName.SEQUENCE_CLASSIFICATION
    texts = "both"
    metrics = ("top1_agreement", "max_prob_diff")
    thresholds = {"top1_agreement": 0.99}
    auto_model = "AutoModelForSequenceClassification"

    def facts(self, checkpoint: Checkpoint, pooling: str | None,
              reranker: str | dict[str, str] | None) -> tuple[TaskFacts, list[Module]]:
        id2label = labels(checkpoint.config)
        multi = getattr(checkpoint.config, "problem_type", None) == "multi_label_classification" or len(id2label) == 1
        return TaskFacts(id2label=id2label, score_activation="sigmoid" if multi else "softmax"), []

    def reference(self, source: SourceModel, inputs: list[TextInput]) -> Outputs:
        activation = source.facts.score_activation or "softmax"
        return classifier_reference(source, self.load_model(source), inputs,
                                    lambda logits, mask: list(activate(logits, activation)))

    def reference_name(self, source: SourceModel) -> str:
        return "transformers, PyTorch FP32"

    def measure(self, reference: Outputs, candidate: Outputs, inputs: list[TextInput]) -> dict[str, float]:
        return agreement.classification(reference, candidate)


class TokenClassification(ClassifierHead):
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

    def served_values(self, model: Any, row: np.ndarray, item: Any) -> Any:
        return row[:len(item)].astype(np.float32)
