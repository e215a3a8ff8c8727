"""Sequence classification's operation: each text's (or pair's) score for every label, after the function the
request names."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from infinity.api.operations.base import Operation, Params, Parsed, Tensors, same_length
from infinity.engine.tokenization import Encoded, TextInput
from infinity.manifest import TaskName
from infinity.schema import Array, Boolean, Choice, Integer, Object, OneOf, Schema, Text
from infinity.tasks.base import activate
from infinity.tasks.sequence_classification import SequenceClassification

FUNCTIONS = ("softmax", "sigmoid", "none")
PAIR = Object({"text": Text(), "text_pair": Text()}, required=("text",), description="a text, or a text pair")
TEI_PAIR = Array(Text(), length=2, description="[text, text_pair], as TEI's /predict takes a pair in a batch")


@dataclass(frozen=True)
class ClassificationParams(Params):
    top_k: int | None
    function_to_apply: str
    raw_scores: bool

    @property
    def function(self) -> str:
        """The function applied to the logits: raw_scores is TEI's name for none."""
        return "none" if self.raw_scores else self.function_to_apply


@dataclass(frozen=True)
class Classified:
    """Each input's score for every label (inputs x labels, in label id order), and the labels' names."""
    scores: np.ndarray
    labels: tuple[str, ...]
    top_k: int | None = None  # how many labels each input's answer lists, best first

    def best(self) -> list[list[dict[str, Any]]]:
        results = []
        for row in self.scores:
            order = np.argsort(-row, kind="stable")[:self.top_k]
            results.append([{"label": self.labels[i], "score": float(row[i])} for i in order])
        return results


def _text(item: Any) -> TextInput:
    if isinstance(item, dict):
        return (item["text"], item["text_pair"]) if "text_pair" in item else item["text"]
    if isinstance(item, list):
        return (item[0], item[1])
    return str(item)


class SequenceClassificationOperation(Operation[SequenceClassification, ClassificationParams]):
    name = TaskName.SEQUENCE_CLASSIFICATION
    params_type = ClassificationParams
    top_level = ("raw_scores",)
    nests_single_answer = True

    def inputs(self, limit: int) -> Schema:
        batch = Array(OneOf((Text(), PAIR, TEI_PAIR), 'a string, {"text", "text_pair"} or [text, text_pair]'),
                      max_items=limit)
        return OneOf((Text(), PAIR, batch), 'a string, {"text": str, "text_pair": str}, or a list of those')

    def parameters(self) -> dict[str, Schema]:
        return {"top_k": Integer(minimum=1, description="answer only the K most likely labels per input"),
                "function_to_apply": Choice(FUNCTIONS, default=self.task.default_function),
                "raw_scores": Boolean(default=False, description="same as function_to_apply=none (TEI)")}

    def answer_doc(self) -> dict[str, Any]:
        labels = {"type": "array", "items": {"type": "object", "required": ["label", "score"],
                                             "properties": {"label": {"type": "string"},
                                                            "score": {"type": "number"}}}}
        return {"oneOf": [labels, {"type": "array", "items": labels}]}

    def read(self, inputs: Any, params: ClassificationParams) -> Parsed[ClassificationParams]:
        if isinstance(inputs, list):
            return Parsed([_text(item) for item in inputs], params)
        return Parsed([_text(inputs)], params, single=True)

    def answer(self, rows: np.ndarray, encoded: list[Encoded], parsed: Parsed[ClassificationParams]) -> Classified:
        params = parsed.params
        return Classified(activate(rows, params.function), self.task.label_names(rows.shape[-1]), params.top_k)

    def render(self, answer: Classified, parsed: Parsed[ClassificationParams]) -> Any:
        return super().render(answer.best(), parsed)

    def tensors(self) -> Tensors:
        def read(named: dict[str, list[str]]) -> list[TextInput]:
            if "text_pair" not in named:
                return list(named["text"])
            return list(zip(named["text"], same_length(named["text_pair"], named["text"], "text_pair")))

        labels = len(self.task.manifest.task.id2label or {}) or -1
        return Tensors(("text", "text_pair"), ("text",), "scores", [-1, labels], read,
                              lambda answer: answer.scores)
