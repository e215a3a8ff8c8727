"""Vertex AI's custom-container contract: {"instances": [...], "parameters": {...}} in, {"predictions": [...]}
out, on the routes Vertex names in AIP_PREDICT_ROUTE and AIP_HEALTH_ROUTE.

Each instance is what /predict takes as `inputs` and each prediction is /predict's answer to it: a text gives a
vector (feature-extraction) or its labels (sequence-classification), {"query", "texts"} gives the ranked texts.
All instances run as one core request, built as /predict builds its own."""
from __future__ import annotations

from typing import Any

from infinity.api import hf, ops
from infinity.api.endpoint import Endpoint, Render
from infinity.api.operations.base import Operation, Parsed
from infinity.engine.job import Job
from infinity.engine.service import Result
from infinity.errors import PayloadTooLarge
from infinity.schema import Array, Object


def predict(per_instance: Operation[Any, Any], limit: int, route: str) -> Endpoint:
    task = per_instance.task
    parameters = Object(per_instance.fields(), fill_defaults=False)
    schema = Object({"instances": Array(per_instance.inputs(limit), max_items=limit), "parameters": parameters},
                    required=("instances",), fill_defaults=False)

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        params = per_instance.params(body.get("parameters"))
        parsed = [per_instance.read(instance, params) for instance in body["instances"]]
        inputs = [item for each in parsed for item in each.inputs]
        if len(inputs) > limit:
            raise PayloadTooLarge(f"the instances hold {len(inputs)} inputs; the limit is {limit}")

        def render(result: Result) -> Any:
            predictions, start = [], 0
            for each in parsed:
                stop = start + len(each.inputs)
                answer = per_instance.answer(result.rows[start:stop], result.encoded[start:stop], each)
                predictions.append(per_instance.render(answer, each))
                start = stop
            return {"predictions": predictions}

        return per_instance.request(Parsed(inputs, params)), render

    answer = {"type": "object", "required": ["predictions"],
              "properties": {"predictions": {"type": "array", "items": per_instance.answer_doc()}}}
    return Endpoint(route, hf.HF, f"Run {task.name} (Vertex AI; each instance is a /predict input)", answer,
                    body=schema, prepare=prepare, errors=hf.ERRORS, truncation_switch=hf.IN_PARAMETERS)


def endpoints(operation: Operation[Any, Any], limit: int, predict_route: str, health_route: str,
              taken: set[str]) -> list[Endpoint]:
    """The predict route, and the health route unless another route already answers it the same way."""
    served = [predict(operation, limit, predict_route)]
    if health_route not in taken:
        served.append(Endpoint(health_route, hf.HF, "Vertex AI's health check: 200 once the model is warm",
                               ops.PLAIN, view=ops.ready, method="GET", protected=False, errors={503: "Not ready"}))
    return served
