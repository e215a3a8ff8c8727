"""/predict's answer in-process, through the pieces the server runs it with: /predict's reading of the task's
body, the loaded model's tokens and forward pass, and /predict's answer, one request as one batch. No HTTP, queue,
admission or limits (the number of inputs is not checked). Tests import it from here."""
from __future__ import annotations

import sys
from typing import Any

from infinity.api import operation_for
from infinity.engine.model import LoadedModel


def predict(model: LoadedModel, inputs: Any, parameters: dict[str, Any] | None = None) -> Any:
    operation = operation_for(model.task)
    parsed = operation.parse(operation.inputs(sys.maxsize).check(inputs, "inputs"), parameters)
    encoded = model.encode(operation.request(parsed))
    return operation.render(operation.answer(model.forward(encoded), encoded, parsed), parsed)
