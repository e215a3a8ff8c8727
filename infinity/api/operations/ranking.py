"""Ranking's operation: each text's score against the query, the texts best first."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from infinity.api import cohere, tei
from infinity.api.endpoint import Endpoint
from infinity.api.hf import HF
from infinity.api.operations.base import Operation, Params, Parsed, Ranked, Served, Tensors, pairs, same_length
from infinity.engine.job import Job
from infinity.engine.tokenization import Encoded, TextInput
from infinity.manifest import TaskName
from infinity.schema import Array, Boolean, Integer, Object, Schema, Text
from infinity.tasks.ranking import Ranking


@dataclass(frozen=True)
class RankingParams(Params):
    top_n: int | None
    return_text: bool
    raw_scores: bool
    instruction: str | None  # a causal reranker's task description (None: the manifest's)
    max_tokens_per_doc: int | None


class RankingOperation(Operation[Ranking, RankingParams]):
    name = TaskName.RANKING
    params_type = RankingParams
    top_level = ("raw_scores", "chunking")
    paths = ((tei.RERANK, HF), *((path, cohere.COHERE) for path in cohere.RERANK))

    def inputs(self, limit: int) -> Schema:
        return Object({"query": Text(), "texts": Array(Text(), max_items=limit)}, required=("query", "texts"))

    def parameters(self) -> dict[str, Schema]:
        return {"top_n": Integer(minimum=1, description="answer only the N best texts"),
                "return_text": Boolean(default=False), "raw_scores": Boolean(default=False),
                "max_tokens_per_doc": Integer(minimum=1, description="each text's tokens past this many are dropped "
                                                                    "(before windows are cut, with chunking)"),
                **self.instruction_field(), **self.chunking_fields()}

    def instruction_field(self) -> dict[str, Schema]:
        """A causal reranker's task description, in place of the manifest's for one request; others take none."""
        reranker = self.task.manifest.task.reranker
        if reranker is None:
            return {}
        return {"instruction": Text(description=f"what relevance means here (default: {reranker.instruction!r})")}

    def answer_doc(self) -> dict[str, Any]:
        ranked = {"type": "object", "required": ["index", "score"],
                  "properties": {"index": {"type": "integer"}, "score": {"type": "number"},
                                 "text": {"type": "string"}}}
        return {"type": "array", "items": ranked}

    def read(self, inputs: Any, params: RankingParams) -> Parsed[RankingParams]:
        return Parsed(pairs(inputs["query"], inputs["texts"]), params)

    def specific(self, job: Job, params: RankingParams) -> Job:
        job.instruction, job.document_tokens = params.instruction, params.max_tokens_per_doc
        return job

    def answer(self, rows: np.ndarray, encoded: list[Encoded], parsed: Parsed[RankingParams]) -> Ranked:
        params = parsed.params
        texts = [str(pair[1]) for pair in parsed.inputs] if params.return_text else None
        return rank(self.task.scores(rows, params.raw_scores), params.top_n, texts)

    def render(self, answer: Ranked, parsed: Parsed[RankingParams]) -> Any:
        """The ranking in the shape /predict and TEI's /rerank answer."""
        texts = answer.texts
        return [{"index": i, "score": score, **({"text": texts[i]} if texts is not None else {})}
                for i, score in answer.best()]

    def routes(self, at: Served) -> list[Endpoint]:
        return [tei.rerank(self, at.limit), *cohere.endpoints(self, at.limit)]

    def tensors(self) -> Tensors:
        def ranked(named: dict[str, list[str]]) -> list[TextInput]:
            query = named["query"]
            queries = query * len(named["text"]) if len(query) == 1 else same_length(query, named["text"], "query")
            return list(zip(queries, named["text"]))

        return Tensors(("query", "text"), ("query", "text"), "scores", [-1], ranked,
                              lambda answer: answer.scores)


def rank(scores: np.ndarray, top_n: int | None = None, texts: list[str] | None = None) -> Ranked:
    """Scores in the order sent, ranked best first (equal scores in the order sent), the top_n of them."""
    return Ranked(scores, [int(i) for i in np.argsort(-scores, kind="stable")[:top_n]], texts)
