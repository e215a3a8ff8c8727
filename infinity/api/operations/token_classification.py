"""Token classification's operation: each text's entities, grouped as transformers' pipeline groups them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from infinity.api.operations.base import Operation, Params, Parsed
from infinity.engine.tokenization import Encoded
from infinity.manifest import TaskName
from infinity.schema import Array, Choice, Schema, Text
from infinity.tasks.token_classification import STRATEGIES, TokenClassification, entities_for


@dataclass(frozen=True)
class TokenClassificationParams(Params):
    aggregation_strategy: str
    ignore_labels: tuple[str, ...]


class TokenClassificationOperation(Operation[TokenClassification, TokenClassificationParams]):
    name = TaskName.TOKEN_CLASSIFICATION
    params_type = TokenClassificationParams

    def parameters(self) -> dict[str, Schema]:
        return {"aggregation_strategy": Choice(STRATEGIES, default="simple", case_insensitive=True),
                "ignore_labels": Array(Text(allow_blank=True), min_items=0, default=["O"])}

    def answer_doc(self) -> dict[str, Any]:
        def entity(grouped: bool) -> dict[str, Any]:
            properties: dict[str, Any] = {"score": {"type": "number"}, "word": {"type": "string"},
                                          "start": {"type": "integer"}, "end": {"type": "integer"}}
            if grouped:
                properties["entity_group"] = {"type": "string"}
            else:
                properties.update(entity={"type": "string"}, index={"type": "integer"})
            return {"type": "object", "properties": properties, "required": list(properties),
                    "additionalProperties": False}

        entities = {"type": "array", "items": {"oneOf": [entity(True), entity(False)]}}
        # anyOf: a single text with no entities answers [], which is also an empty list of lists
        return {"anyOf": [entities, {"type": "array", "items": entities}]}

    def answer(self, rows: np.ndarray, encoded: list[Encoded],
               parsed: Parsed[TokenClassificationParams]) -> list[list[dict[str, Any]]]:
        task, params = self.task, parsed.params
        labels = dict(enumerate(task.label_names(rows.shape[-1])))
        return [entities_for(str(text), probs, item, labels, params.aggregation_strategy, list(params.ignore_labels),
                             task.vocabulary) for probs, item, text in zip(rows, encoded, parsed.inputs)]
