from __future__ import annotations

from typing import Any

import numpy as np

from infinity.engine.tokenization import Encoded, TextInput
from infinity.schema import Array, Boolean, Choice, Integer, Object, OneOf, Schema, Text
from infinity.tasks.base import Parsed, Request, Task, activate

FUNCTIONS = ("softmax", "sigmoid", "none")
PAIR = Object({"text": Text(), "text_pair": Text()}, required=("text",), description="a text, or a text pair")
TEI_PAIR = Array(Text(), length=2, description="[text, text_pair], as TEI's /predict takes a pair in a batch")


def _text(item: Any) -> TextInput:
    if isinstance(item, dict):
        return (item["text"], item["text_pair"]) if "text_pair" in item else item["text"]
    if isinstance(item, list):
        return (item[0], item[1])
    return str(item)


class SequenceClassification(Task):
    name = "sequence-classification"
    top_level = ("raw_scores",)
    nests_single_answer = True

    @property
    def default_function(self) -> str:
        return self.manifest.task.score_activation or "softmax"

    def inputs(self, limit: int) -> Schema:
        batch = Array(OneOf((Text(), PAIR, TEI_PAIR), 'a string, {"text", "text_pair"} or [text, text_pair]'),
                      max_items=limit)
        return OneOf((Text(), PAIR, batch), 'a string, {"text": str, "text_pair": str}, or a list of those')

    def parameters(self) -> dict[str, Schema]:
        return {"top_k": Integer(minimum=1, description="answer only the K most likely labels per input"),
                "function_to_apply": Choice(FUNCTIONS, default=self.default_function),
                "raw_scores": Boolean(default=False, description="same as function_to_apply=none (TEI)")}

    def answer_doc(self) -> dict[str, Any]:
        labels = {"type": "array", "items": {"type": "object", "required": ["label", "score"],
                                             "properties": {"label": {"type": "string"},
                                                            "score": {"type": "number"}}}}
        return {"oneOf": [labels, {"type": "array", "items": labels}]}

    def parse(self, inputs: Any, params: dict[str, Any]) -> Parsed:
        function = "none" if params.get("raw_scores") else params.get("function_to_apply", self.default_function)
        options = {"top_k": params.get("top_k"), "function_to_apply": function}
        if isinstance(inputs, list):
            return Parsed(Request([_text(item) for item in inputs]), options, single=False)
        return Parsed(Request([_text(inputs)]), options, single=True)

    def labelled(self, rows: np.ndarray, function: str, top_k: int | None) -> list[list[dict[str, Any]]]:
        labels = self.manifest.task.id2label or {}
        scores = activate(rows, function)
        results = []
        for row in scores:
            order = np.argsort(-row, kind="stable")[:top_k]
            results.append([{"label": labels.get(int(i), f"LABEL_{int(i)}"), "score": float(row[i])} for i in order])
        return results

    def respond(self, rows: np.ndarray, parsed: Parsed, encoded: list[Encoded]) -> Any:
        results = self.labelled(rows, parsed.params["function_to_apply"], parsed.params["top_k"])
        return results[0] if parsed.single else results
