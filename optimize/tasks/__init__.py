"""The optimizer's tasks, one module each, by name. A new task is one module with an OptimizerTask and its entry
below (docs/optimizer.md: adding a task)."""
from __future__ import annotations

from infinity.manifest import TaskName
from optimize.tasks.base import OptimizerTask
from optimize.tasks.feature_extraction import FeatureExtractionTask
from optimize.tasks.hybrid_embedding import HybridEmbeddingTask
from optimize.tasks.multi_vector import MultiVectorTask
from optimize.tasks.ranking import RankingTask
from optimize.tasks.sequence_classification import SequenceClassificationTask
from optimize.tasks.sparse_embedding import SparseEmbeddingTask
from optimize.tasks.token_classification import TokenClassificationTask

REGISTRY: dict[TaskName, OptimizerTask] = {task.name: task for task in (
    FeatureExtractionTask(), SparseEmbeddingTask(), MultiVectorTask(), HybridEmbeddingTask(),
    SequenceClassificationTask(), TokenClassificationTask(), RankingTask())}


def task_for(name: str) -> OptimizerTask:
    try:
        return REGISTRY[TaskName(name)]
    except ValueError:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(map(str, TaskName))}") from None
