"""Sequence classification: the checkpoint's classifier head over a text or a text pair, against transformers."""
from __future__ import annotations

from infinity.engine.tokenization import TextInput
from infinity.manifest import TaskFacts, TaskName
from infinity.tasks.base import activate
from optimize.checkpoint import Checkpoint, Module
from optimize.measure import agreement
from optimize.measure.agreement import Outputs
from optimize.tasks.base import ClassifierHead, SourceModel, classifier_reference, labels


class SequenceClassificationTask(ClassifierHead):
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
