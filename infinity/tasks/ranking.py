from __future__ import annotations

from typing import Any

import numpy as np

from infinity.errors import EmptyInput, ValidationError
from infinity.tasks.base import Request, Task, activate, flag, positive_int, text_list
from infinity.tokenization import Encoded


class Ranking(Task):
    name = "ranking"
    parameters = ("top_n", "return_text", "raw_scores")

    def parse(self, inputs: Any, parameters: dict[str, Any]) -> Request:
        parameters = self.check_parameters(parameters)
        if not isinstance(inputs, dict) or set(inputs) != {"query", "texts"}:
            raise ValidationError('inputs must be {"query": str, "texts": [str, ...]}')
        query = inputs["query"]
        if not isinstance(query, str):
            raise ValidationError("inputs.query must be a string")
        if not query.strip():
            raise EmptyInput("inputs.query is empty")
        texts, _ = text_list(inputs["texts"], "inputs.texts")
        params = {
            "top_n": positive_int(parameters, "top_n"),
            "return_text": flag(parameters, "return_text", False),
            "raw_scores": flag(parameters, "raw_scores", False),
            "texts": texts,
        }
        return Request([(query, text) for text in texts], params, single=False,
                       truncate=flag(parameters, "truncate", True))

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return output[:, 0]

    def respond(self, rows: np.ndarray, request: Request, encoded: list[Encoded]) -> Any:
        function = "none" if request.params["raw_scores"] else (self.manifest.task.score_activation or "sigmoid")
        scores = activate(rows, function)
        order = np.argsort(-scores, kind="stable")[: request.params["top_n"]]
        texts = request.params["texts"]
        result = []
        for i in order:
            item: dict[str, Any] = {"index": int(i), "score": float(scores[i])}
            if request.params["return_text"]:
                item["text"] = texts[i]
            result.append(item)
        return result
