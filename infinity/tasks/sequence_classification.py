"""Sequence classification: each text's (or pair's) logits, one per label; its operation applies the function and
names the labels."""
from __future__ import annotations

from infinity.tasks.base import Task


class SequenceClassification(Task):
    name = "sequence-classification"

    @property
    def default_function(self) -> str:
        """The function applied to the logits unless a request names another."""
        return self.manifest.task.score_activation or "softmax"
