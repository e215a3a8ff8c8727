"""/predict's answer in-process, through the pieces the server runs it with: the task's reading of the body,
the loaded model's tokens and forward pass, and the task's answer, one request as one batch. No HTTP, queue,
admission or limits (the number of inputs is not checked)."""
from __future__ import annotations

import sys
from typing import Any

from infinity.engine.model import LoadedModel
from infinity.schema import Object


def predict(model: LoadedModel, inputs: Any, parameters: dict[str, Any] | None = None) -> Any:
    task = model.task
    inputs = task.inputs(sys.maxsize).check(inputs, "inputs")
    params = Object(task.parameters(), fill_defaults=False).check(parameters or {}, "parameters")
    parsed = task.parse(inputs, params)
    encoded = model.encode(parsed.request)
    return task.respond(model.forward(encoded), parsed, encoded)
