"""Every route this artifact serves, by API family, from the one registry of the tasks' operations; routes of other
tasks answer 404 saying why."""
from __future__ import annotations

import time
from typing import Any

from infinity.api import hf, kserve, openai, ops, sagemaker, tei, vertex
from infinity.api.endpoint import Endpoint, not_served
from infinity.api.operations.base import Operation, Served
from infinity.api.operations.feature_extraction import FeatureExtractionOperation
from infinity.api.operations.hybrid_embedding import HybridEmbeddingOperation
from infinity.api.operations.multi_vector import MultiVectorOperation
from infinity.api.operations.ranking import RankingOperation
from infinity.api.operations.sequence_classification import SequenceClassificationOperation
from infinity.api.operations.sparse_embedding import SparseEmbeddingOperation
from infinity.api.operations.token_classification import TokenClassificationOperation
from infinity.engine.model import LoadedModel
from infinity.errors import StartupError
from infinity.manifest import TaskName
from infinity.settings import Settings
from infinity.tasks import Task
from infinity.tasks.prompts import PromptedTask

# By the task's name, in the order a path two tasks serve names the first of them in another task's 404.
OPERATIONS: dict[TaskName, type[Operation[Any, Any]]] = {operation.name: operation for operation in (
    FeatureExtractionOperation, SparseEmbeddingOperation, RankingOperation, HybridEmbeddingOperation,
    MultiVectorOperation, SequenceClassificationOperation, TokenClassificationOperation)}


def operation_for(task: Task) -> Operation[Any, Any]:
    return OPERATIONS[TaskName(task.name)](task)


def endpoints(model: LoadedModel, settings: Settings) -> list[Endpoint]:
    """The routes this artifact serves, in the order the OpenAPI document lists them."""
    task, limit, tokenizer = model.task, settings.max_inputs_per_request, model.tokenizer
    name = ops.served_name(model.manifest, settings)
    if isinstance(task, PromptedTask) and settings.default_prompt_name is not None:
        task.use_default_prompt(settings.default_prompt_name)
    operation = operation_for(task)
    served = hf.endpoints(operation, limit)
    served += operation.routes(Served(limit, tokenizer.vocab_size, name, settings))
    served += [openai.models(name, int(time.time()), not settings.public_metadata),
               tei.tokenize(tokenizer, limit), tei.decode(tokenizer, limit)]
    served += ops.endpoints(settings.public_metadata) + sagemaker.endpoints(operation, limit)
    served += kserve.endpoints(operation, name, limit, settings.public_metadata)
    return served + platform_routes(served, operation, limit, settings)


def platform_routes(served: list[Endpoint], operation: Operation[Any, Any], limit: int,
                    settings: Settings) -> list[Endpoint]:
    """Vertex AI's routes, named by the deployment: a health route may be one we serve already, nothing else."""
    paths = {endpoint.path: endpoint for endpoint in served}
    predict, health = settings.vertex_predict_route, settings.vertex_health_route
    if predict in paths or predict == health:
        raise StartupError(f"the Vertex AI predict route {predict} is taken by another route; choose another")
    if health in paths and paths[health].view is not ops.ready:
        raise StartupError(f"the Vertex AI health route {health} is taken by another route; choose another")
    return vertex.endpoints(operation, limit, predict, health, set(paths))


def elsewhere(served: list[Endpoint], task: str) -> list[Endpoint]:
    """Routes of the other tasks, each answering 404 in its family's error shape."""
    paths = {endpoint.path for endpoint in served}
    result = []
    for name, operation in OPERATIONS.items():
        for path, family in operation.paths:
            if path not in paths:
                paths.add(path)
                result.append(Endpoint(path, family, "", {}, view=not_served(path, family, name.value, task)))
    return result
