"""Every route this artifact serves, by API family; routes of other tasks answer 404 saying why."""
from __future__ import annotations

import time

from infinity.api import cohere, hf, openai, ops, tei
from infinity.api.endpoint import Endpoint, not_served
from infinity.model import LoadedModel
from infinity.settings import Settings
from infinity.tasks.feature_extraction import FeatureExtraction
from infinity.tasks.ranking import Ranking


def endpoints(model: LoadedModel, settings: Settings) -> list[Endpoint]:
    """The routes this artifact serves, in the order the OpenAPI document lists them."""
    task, limit, tokenizer = model.task, settings.max_inputs_per_request, model.tokenizer
    name = ops.served_name(model.manifest, settings)
    if isinstance(task, FeatureExtraction) and settings.default_prompt_name is not None:
        task.use_default_prompt(settings.default_prompt_name)
    served = hf.endpoints(task, limit)
    if isinstance(task, FeatureExtraction):
        served += openai.embeddings(task, limit, tokenizer.vocab_size, name) + [tei.embed(task, limit)]
    if isinstance(task, Ranking):
        served += [tei.rerank(task, limit)] + cohere.endpoints(task, limit)
    served += [openai.models(name, int(time.time()), not settings.public_metadata), tei.tokenize(tokenizer, limit),
               tei.decode(tokenizer, limit)]
    return served + ops.endpoints(settings.public_metadata)


def elsewhere(served: list[Endpoint], task: str) -> list[Endpoint]:
    """Routes of the other tasks, each answering 404 in its family's error shape."""
    paths = {endpoint.path for endpoint in served}
    others = [(path, openai.OPENAI, FeatureExtraction.name) for path in openai.EMBEDDINGS]
    others += [(tei.EMBED, tei.TEI, FeatureExtraction.name), (tei.RERANK, tei.TEI, Ranking.name)]
    others += [(path, cohere.COHERE, Ranking.name) for path in cohere.RERANK]
    result = []
    for path, family, needs in others:
        if path not in paths:
            result.append(Endpoint(path, family, "", {}, view=not_served(path, family, needs, task), tasks=(needs,)))
    return result
