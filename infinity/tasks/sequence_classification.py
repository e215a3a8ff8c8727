from __future__ import annotations

from typing import Any

import numpy as np

from infinity.errors import EmptyInput, ValidationError
from infinity.tasks.base import Request, Task, activate, choice, flag, positive_int
from infinity.tokenization import Encoded, TextInput

FUNCTIONS = ("softmax", "sigmoid", "none")


def _one(item: Any) -> TextInput:
    if isinstance(item, str):
        if not item.strip():
            raise EmptyInput("inputs contains an empty string")
        return item
    if isinstance(item, dict):
        extra = set(item) - {"text", "text_pair"}
        if extra or not isinstance(item.get("text"), str):
            raise ValidationError('a pair must be {"text": str, "text_pair": str}')
        pair = item.get("text_pair")
        if not item["text"].strip():
            raise EmptyInput("inputs contains an empty text")
        if pair is None:
            return item["text"]
        if not isinstance(pair, str) or not pair.strip():
            raise ValidationError("text_pair must be a non-empty string")
        return (item["text"], pair)
    raise ValidationError('inputs must be a string, {"text", "text_pair"}, or a list of those')


class SequenceClassification(Task):
    name = "sequence-classification"
    parameters = ("top_k", "function_to_apply")

    def parse(self, inputs: Any, parameters: dict[str, Any]) -> Request:
        parameters = self.check_parameters(parameters)
        if isinstance(inputs, list):
            if not inputs:
                raise EmptyInput("inputs is empty")
            texts, single = [_one(item) for item in inputs], False
        else:
            texts, single = [_one(inputs)], True
        default = self.manifest.task.score_activation or "softmax"
        params = {
            "top_k": positive_int(parameters, "top_k"),
            "function_to_apply": choice(parameters, "function_to_apply", FUNCTIONS, default),
        }
        return Request(texts, params, single, flag(parameters, "truncate", True))

    def respond(self, rows: np.ndarray, request: Request, encoded: list[Encoded]) -> Any:
        labels = self.manifest.task.id2label or {}
        scores = activate(rows, request.params["function_to_apply"])
        top_k = request.params["top_k"]
        results = []
        for row in scores:
            order = np.argsort(-row, kind="stable")[:top_k]
            results.append([{"label": labels.get(int(i), f"LABEL_{int(i)}"), "score": float(row[i])} for i in order])
        return results[0] if request.single else results
