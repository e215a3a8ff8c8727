"""The Hugging Face Inference API on /predict and / (TEI's /predict body fields are accepted at the top level)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infinity.api.endpoint import MESSAGE, TYPE, Endpoint, ErrorBody, Family, Render
from infinity.api.operations.base import Operation
from infinity.engine.job import Job
from infinity.engine.service import Result
from infinity.schema import Object, Schema

HF = Family("hf", ErrorBody({"error": MESSAGE, "error_type": TYPE}))
ERRORS = {400: "Empty input", 413: "Body too large or too many inputs",
          422: "Malformed body, unknown field or parameter, or input too long with truncate=false",
          429: "Queue full; see Retry-After", 500: "Inference failed", 503: "Not ready"}


# the body fields that turn truncation on, as a too-long input's error names them (Endpoint.truncation_switch)
AT_TOP = '"truncate": true'
IN_PARAMETERS = '"parameters": {"truncate": true}'


def body_schema(operation: Operation[Any, Any], limit: int) -> Object:
    parameters = operation.fields()
    fields: dict[str, Schema] = {
        "inputs": operation.inputs(limit),
        "parameters": Object(parameters, fill_defaults=False),
        "options": Object({}, open=True, description="accepted and ignored, as the Inference API sends it"),
    }
    fields.update({name: parameters[name] for name in (*operation.top_level, "truncate", "truncation_direction")
                   if name in parameters})
    return Object(fields, required=("inputs",), fill_defaults=False)


def endpoints(predict: Operation[Any, Any], limit: int) -> list[Endpoint]:
    task = predict.task

    def preparer(hosted_api: bool) -> Callable[[dict[str, Any]], tuple[Job, Render]]:
        def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
            values = {key: value for key, value in body.items() if key not in ("inputs", "parameters", "options")}
            values.update(body.get("parameters", {}))
            parsed = predict.parse(body["inputs"], values)
            nest = hosted_api and parsed.single and predict.nests_single_answer

            def render(result: Result) -> Any:
                answer = predict.render(predict.answer(result.rows, result.encoded, parsed), parsed)
                return [answer] if nest else answer

            return predict.request(parsed), render

        return prepare

    schema = body_schema(predict, limit)
    # the parameters' truncate overrides a top-level one, so the advice names that one
    return [Endpoint("/predict", HF, f"Run {task.name} (transformers pipeline and TEI answer shapes)",
                     predict.answer_doc(), body=schema, prepare=preparer(False), errors=ERRORS,
                     truncation_switch=IN_PARAMETERS),
            Endpoint("/", HF, f"Run {task.name} (the hosted Inference API's answer shape, as huggingface_hub "
                              "expects it)", predict.answer_doc(), body=schema, prepare=preparer(True), errors=ERRORS,
                     truncation_switch=IN_PARAMETERS)]
