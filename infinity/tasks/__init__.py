"""The server's tasks, one class each, chosen by the name the artifact's manifest records: tokens in, reduced rows
out. What a route's body asks of a task is its operation's, in infinity/api/operations.py."""
from __future__ import annotations

from pathlib import Path

from infinity.manifest import Manifest
from infinity.tasks.base import Task
from infinity.tasks.feature_extraction import FeatureExtraction
from infinity.tasks.hybrid_embedding import HybridEmbedding
from infinity.tasks.multi_vector import MultiVectorEmbedding
from infinity.tasks.ranking import Ranking
from infinity.tasks.sequence_classification import SequenceClassification
from infinity.tasks.sparse_embedding import SparseEmbedding
from infinity.tasks.token_classification import TokenClassification

TASK_CLASSES: dict[str, type[Task]] = {
    cls.name: cls for cls in (FeatureExtraction, SparseEmbedding, MultiVectorEmbedding, HybridEmbedding,
                              SequenceClassification, TokenClassification, Ranking)
}


def make_task(manifest: Manifest, directory: Path | None = None) -> Task:
    return TASK_CLASSES[manifest.source.task](manifest, directory)


__all__ = ["Task", "make_task", "TASK_CLASSES"]
