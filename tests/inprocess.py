"""/predict's answer in-process, through the pieces the server runs it with: /predict's reading of the task's
body, the loaded model's tokens and forward pass, and /predict's answer, one request as one batch. No HTTP, queue,
admission or limits (the number of inputs is not checked)."""
from __future__ import annotations

import sys
from typing import Any

from infinity.api.predict import predict_for
from infinity.engine.model import LoadedModel
from infinity.schema import Object


def predict(model: LoadedModel, inputs: Any, parameters: dict[str, Any] | None = None) -> Any:
    hf = predict_for(model.task)
    inputs = hf.inputs(sys.maxsize).check(inputs, "inputs")
    params = Object(hf.parameters(), fill_defaults=False).check(parameters or {}, "parameters")
    parsed = hf.parse(inputs, params)
    encoded = model.encode(parsed.request)
    return hf.respond(model.forward(encoded), parsed, encoded)
