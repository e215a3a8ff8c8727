"""/predict's answer in-process, through the pieces the server runs it with: /predict's reading of the task's
body, the loaded model's tokens and forward pass, and /predict's answer, one request as one batch. No HTTP, queue,
admission or limits (the number of inputs is not checked). Tests import it from here."""
from __future__ import annotations

import sys
from typing import Any

from infinity.api.operations import operation_for
from infinity.engine.model import LoadedModel
from infinity.schema import Object


def predict(model: LoadedModel, inputs: Any, parameters: dict[str, Any] | None = None) -> Any:
    operation = operation_for(model.task)
    inputs = operation.inputs(sys.maxsize).check(inputs, "inputs")
    params = Object(operation.parameters(), fill_defaults=False).check(parameters or {}, "parameters")
    parsed = operation.parse(inputs, params)
    encoded = model.encode(operation.request(parsed.inputs, params))
    return operation.respond(model.forward(encoded), parsed, encoded)
