"""KServe's Open Inference Protocol (v2) over HTTP/JSON: health, server and model metadata, and /infer taking
BYTES text tensors and answering FP32 tensors (INT8 or UINT8 for embeddings at those precisions, binary and ubinary
included). The model routes carry the served model's name literally, so
every other name is a 404 like any unknown route.

Tensors, by task: feature-extraction `text` [N] -> `embedding` [N, D]; sequence-classification `text` [N]
(and `text_pair` [N]) -> `scores` [N, labels], in label id order; ranking `query` [1] (or [N]) and `text` [N]
-> `scores` [N], in input order. Request parameters are /predict's (normalize, dimensions, precision, raw_scores,
function_to_apply, truncate, ...). The binary tensor extension is not served: send JSON data."""
from __future__ import annotations

from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from infinity.api import hf
from infinity.api.endpoint import MESSAGE, Endpoint, ErrorBody, Family, JSONResponse, Render
from infinity.api.operations.base import Operation, Parsed, Tensors
from infinity.api.ops import version
from infinity.engine.job import Job
from infinity.engine.service import Result
from infinity.errors import ErrorType, ValidationError
from infinity.schema import Array, Choice, Integer, Object, Schema, Text

# the protocol answers a bad request 400 and names no error types
KSERVE = Family("kserve", ErrorBody({"error": MESSAGE}), status=lambda status: 400 if status == 422 else status)
ERRORS = {400: "Malformed request, unknown tensor or parameter", 413: "Body too large or too many inputs",
          429: "Queue full; see Retry-After", 500: "Inference failed", 503: "Not ready"}
TENSOR_DOC = {"type": "object", "required": ["name", "datatype", "shape", "data"],
              "properties": {"name": {"type": "string"}, "datatype": {"type": "string"},
                             "shape": {"type": "array", "items": {"type": "integer"}}, "data": {"type": "array"}}}
PLAIN = {"type": "object"}


# the tensor datatype of each answer's numbers: a dense answer at precision int8 or (u)binary is integers
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int8): "INT8", np.dtype(np.uint8): "UINT8"}


def _input(names: tuple[str, ...], limit: int) -> Schema:
    return Object({"name": Choice(names), "datatype": Choice(("BYTES",)),
                   "shape": Array(Integer(minimum=1), max_items=2),
                   "data": Array(Text(), max_items=limit), "parameters": Object({}, open=True)},
                  required=("name", "datatype", "shape", "data"))


def infer(operation: Operation[Any, Any], spec: Tensors, name: str, limit: int) -> Endpoint:
    task = operation.task
    parameters = Object(operation.fields(), open=True, fill_defaults=False,
                        description="/predict's parameters; others are accepted and ignored")
    requested = Object({"name": Choice((spec.output,)), "parameters": Object({}, open=True)}, required=("name",))
    schema = Object({"id": Text(allow_blank=True), "inputs": Array(_input(spec.inputs, limit), min_items=1),
                     "outputs": Array(requested, max_items=1), "parameters": parameters},
                    required=("inputs",), fill_defaults=False)

    def prepare(body: dict[str, Any]) -> tuple[Job, Render]:
        named: dict[str, list[str]] = {}
        for tensor in body["inputs"]:
            if tensor["name"] not in spec.inputs or tensor["name"] in named:
                raise ValidationError(f"unknown or repeated input {tensor['name']!r}; this model takes "
                                      f"{', '.join(spec.inputs)}, each once")
            if int(np.prod(tensor["shape"])) != len(tensor["data"]):
                raise ValidationError(f"input {tensor['name']!r} has shape {tensor['shape']} but "
                                      f"{len(tensor['data'])} elements")
            named[tensor["name"]] = tensor["data"]
        missing = [wanted for wanted in spec.required if wanted not in named]
        if missing:
            raise ValidationError(f"missing input(s): {', '.join(missing)}")
        parsed = Parsed(spec.read(named), operation.params({**body.get("parameters", {}), **spec.fixed}))

        def render(result: Result) -> Any:
            data = np.asarray(spec.answer(operation.answer(result.rows, result.encoded, parsed)))
            if data.dtype not in DATATYPES:
                data = data.astype(np.float32)
            answer: dict[str, Any] = {"model_name": name, "outputs": [
                {"name": spec.output, "datatype": DATATYPES[data.dtype], "shape": list(data.shape),
                 "data": data.ravel()}]}
            if "id" in body:
                answer["id"] = body["id"]
            return answer

        return operation.request(parsed), render

    answer_doc = {"type": "object", "required": ["model_name", "outputs"],
                  "properties": {"model_name": {"type": "string"}, "id": {"type": "string"},
                                 "outputs": {"type": "array", "items": TENSOR_DOC}}}
    return Endpoint(f"/v2/models/{name}/infer", KSERVE, f"Run {task.name} (KServe Open Inference Protocol)",
                    answer_doc, body=schema, prepare=prepare, errors=ERRORS, truncation_switch=hf.IN_PARAMETERS)


async def _ready(request: Request) -> bool:
    return bool(await request.state.service.ready())


def endpoints(operation: Operation[Any, Any], name: str, limit: int, public_metadata: bool) -> list[Endpoint]:
    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        if await _ready(request):
            return JSONResponse({"ready": True})
        return KSERVE.failure(ErrorType.UNHEALTHY, "the model is not ready")

    async def model_ready(request: Request) -> Response:
        if await _ready(request):
            return JSONResponse({"name": name, "ready": True})
        return KSERVE.failure(ErrorType.UNHEALTHY, f"the model {name} is not ready")

    async def server(request: Request) -> Response:
        return JSONResponse({"name": "infinity-multiverse", "version": version(), "extensions": []})

    unready = {503: "Not ready"}
    served = [Endpoint("/v2/health/live", KSERVE, "Process is up (KServe)", PLAIN, view=live, method="GET",
                       protected=False),
              Endpoint("/v2/health/ready", KSERVE, "Model warmed up and healthy (KServe)", PLAIN, view=ready,
                       method="GET", protected=False, errors=unready),
              Endpoint("/v2", KSERVE, "Server metadata (KServe)", PLAIN, view=server, method="GET",
                       protected=not public_metadata)]
    spec = operation.tensors()
    if spec is None:
        return served

    async def metadata(request: Request) -> Response:
        inputs = [{"name": input_name, "datatype": "BYTES", "shape": [-1]} for input_name in spec.inputs]
        return JSONResponse({"name": name, "versions": [], "platform": "onnxruntime_onnx", "inputs": inputs,
                             "outputs": [{"name": spec.output, "datatype": "FP32", "shape": spec.output_shape}]})

    return served + [
        Endpoint(f"/v2/models/{name}", KSERVE, "Model metadata: its input and output tensors (KServe)", PLAIN,
                 view=metadata, method="GET", protected=not public_metadata),
        Endpoint(f"/v2/models/{name}/ready", KSERVE, "Model ready (KServe)", PLAIN, view=model_ready, method="GET",
                 protected=False, errors=unready),
        infer(operation, spec, name, limit)]
