"""Every route this artifact serves, by API family; routes of other tasks answer 404 saying why."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infinity.api import cohere, hf, kserve, openai, ops, sagemaker, tei, vertex
from infinity.api.endpoint import Endpoint, Family, not_served
from infinity.engine.model import LoadedModel
from infinity.errors import StartupError
from infinity.manifest import TaskName
from infinity.settings import Settings
from infinity.tasks import Task
from infinity.tasks.feature_extraction import FeatureExtraction
from infinity.tasks.hybrid_embedding import HybridEmbedding
from infinity.tasks.multi_vector import MultiVectorEmbedding
from infinity.tasks.prompts import PromptedTask
from infinity.tasks.ranking import Ranking
from infinity.tasks.sparse_embedding import SparseEmbedding


@dataclass(frozen=True)
class Served:
    """What a task's own routes are built with."""
    limit: int
    vocabulary: int
    name: str
    settings: Settings


def dense(task: FeatureExtraction, at: Served) -> list[Endpoint]:
    tokens = [tei.embed_all(task, at.limit)] if task.answers_tokens else []
    return [*openai.embeddings(task, at.limit, at.vocabulary, at.name, at.settings.openai_token_ids),
            tei.embed(task, at.limit), *tokens, *cohere.embed_endpoints(task, at.limit)]


def hybrid(task: HybridEmbedding, at: Served) -> list[Endpoint]:
    return [*dense(task, at), tei.embed_sparse(task, at.limit)]


def sparse(task: SparseEmbedding, at: Served) -> list[Endpoint]:
    return [tei.embed_sparse(task, at.limit)]


def multi_vector(task: MultiVectorEmbedding, at: Served) -> list[Endpoint]:
    return [tei.embed_all(task, at.limit)]


def ranking(task: Ranking, at: Served) -> list[Endpoint]:
    return [tei.rerank(task, at.limit), *cohere.endpoints(task, at.limit)]


def classification(task: Task, at: Served) -> list[Endpoint]:
    return []


@dataclass(frozen=True)
class TaskRoutes:
    """A task's routes beyond /predict's family and those every task has: how they are built, and each one's path
    in its family, which a server of another task answers 404 naming the task that serves it."""
    build: Callable[[Any, Served], list[Endpoint]]
    paths: tuple[tuple[str, Family], ...] = ()


EMBEDDINGS = (*((path, openai.OPENAI) for path in openai.EMBEDDINGS), (tei.EMBED, hf.HF), (tei.EMBED_ALL, hf.HF),
              *((path, cohere.COHERE) for path in cohere.EMBED))

# By the task's name; where two tasks serve a path, a server of neither names the first.
TASK_ROUTES: dict[TaskName, TaskRoutes] = {
    TaskName.FEATURE_EXTRACTION: TaskRoutes(dense, EMBEDDINGS),
    TaskName.SPARSE_EMBEDDING: TaskRoutes(sparse, ((tei.EMBED_SPARSE, hf.HF),)),
    TaskName.RANKING: TaskRoutes(ranking, ((tei.RERANK, hf.HF), *((path, cohere.COHERE) for path in cohere.RERANK))),
    TaskName.HYBRID_EMBEDDING: TaskRoutes(hybrid, (*EMBEDDINGS, (tei.EMBED_SPARSE, hf.HF))),
    TaskName.MULTI_VECTOR: TaskRoutes(multi_vector, ((tei.EMBED_ALL, hf.HF),)),
    TaskName.SEQUENCE_CLASSIFICATION: TaskRoutes(classification),
    TaskName.TOKEN_CLASSIFICATION: TaskRoutes(classification)}


def endpoints(model: LoadedModel, settings: Settings) -> list[Endpoint]:
    """The routes this artifact serves, in the order the OpenAPI document lists them."""
    task, limit, tokenizer = model.task, settings.max_inputs_per_request, model.tokenizer
    name = ops.served_name(model.manifest, settings)
    if isinstance(task, PromptedTask) and settings.default_prompt_name is not None:
        task.use_default_prompt(settings.default_prompt_name)
    served = hf.endpoints(task, limit)
    served += TASK_ROUTES[TaskName(task.name)].build(task, Served(limit, tokenizer.vocab_size, name, settings))
    served += [openai.models(name, int(time.time()), not settings.public_metadata), tei.tokenize(tokenizer, limit),
               tei.decode(tokenizer, limit)]
    served += ops.endpoints(settings.public_metadata) + sagemaker.endpoints(task, limit)
    served += kserve.endpoints(task, ops.served_name(model.manifest, settings), limit, settings.public_metadata)
    return served + platform_routes(served, task, limit, settings)


def platform_routes(served: list[Endpoint], task: Task, limit: int, settings: Settings) -> list[Endpoint]:
    """Vertex AI's routes, named by the deployment: a health route may be one we serve already, nothing else."""
    paths = {endpoint.path: endpoint for endpoint in served}
    predict, health = settings.vertex_predict_route, settings.vertex_health_route
    if predict in paths or predict == health:
        raise StartupError(f"the Vertex AI predict route {predict} is taken by another route; choose another")
    if health in paths and paths[health].view is not ops.ready:
        raise StartupError(f"the Vertex AI health route {health} is taken by another route; choose another")
    return vertex.endpoints(task, limit, predict, health, set(paths))


def elsewhere(served: list[Endpoint], task: str) -> list[Endpoint]:
    """Routes of the other tasks, each answering 404 in its family's error shape."""
    paths = {endpoint.path for endpoint in served}
    result = []
    for name, routes in TASK_ROUTES.items():
        for path, family in routes.paths:
            if path not in paths:
                paths.add(path)
                result.append(Endpoint(path, family, "", {}, view=not_served(path, family, name.value, task)))
    return result
