"""A hand-written OpenAPI 3 document for the one task this server runs."""
from __future__ import annotations

from typing import Any

from infinity.manifest import Manifest
from infinity.tasks.token_classification import STRATEGIES

TEXTS = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
TRUNCATE = {"type": "boolean", "default": True,
            "description": "cut inputs at the model's maximum length; false answers 422 for longer inputs"}
SCORE = {"type": "number"}
ERROR = {"type": "object", "required": ["error", "error_type"],
         "properties": {"error": {"type": "string"}, "error_type": {"type": "string"}}}


def _pair() -> dict[str, Any]:
    return {"type": "object", "required": ["text"],
            "properties": {"text": {"type": "string"}, "text_pair": {"type": "string"}}}


def _labelled() -> dict[str, Any]:
    return {"type": "object", "properties": {"label": {"type": "string"}, "score": SCORE}}


def _entity(grouped: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {"score": SCORE, "word": {"type": "string"},
                                  "start": {"type": "integer"}, "end": {"type": "integer"}}
    if grouped:
        properties["entity_group"] = {"type": "string"}
    else:
        properties.update(entity={"type": "string"}, index={"type": "integer"})
    return {"type": "object", "properties": properties}


def _one_or_many(item: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [item, {"type": "array", "items": item}]}


def task_schemas(manifest: Manifest) -> tuple[Any, dict[str, Any], Any]:
    """(inputs schema, parameters schema, response schema) for the manifest's task."""
    task = manifest.source.task
    if task == "feature-extraction":
        vector = {"type": "array", "items": {"type": "number"}}
        if manifest.task.embedding_dim:
            vector.update(minItems=manifest.task.embedding_dim, maxItems=manifest.task.embedding_dim)
        return TEXTS, {"normalize": {"type": "boolean", "default": manifest.task.normalize}}, _one_or_many(vector)
    if task == "sequence-classification":
        one = {"oneOf": [{"type": "string"}, _pair()]}
        params = {"top_k": {"type": "integer", "minimum": 1},
                  "function_to_apply": {"type": "string", "enum": ["softmax", "sigmoid", "none"]}}
        labels = {"type": "array", "items": _labelled()}
        return {"oneOf": [one, {"type": "array", "items": one, "minItems": 1}]}, params, _one_or_many(labels)
    if task == "token-classification":
        params = {"aggregation_strategy": {"type": "string", "enum": list(STRATEGIES), "default": "simple"},
                  "ignore_labels": {"type": "array", "items": {"type": "string"}, "default": ["O"]}}
        entities = {"type": "array", "items": {"oneOf": [_entity(True), _entity(False)]}}
        return TEXTS, params, _one_or_many(entities)
    inputs = {"type": "object", "required": ["query", "texts"], "additionalProperties": False,
              "properties": {"query": {"type": "string"},
                             "texts": {"type": "array", "items": {"type": "string"}, "minItems": 1}}}
    params = {"top_n": {"type": "integer", "minimum": 1}, "return_text": {"type": "boolean", "default": False},
              "raw_scores": {"type": "boolean", "default": False}}
    ranked = {"type": "object", "properties": {"index": {"type": "integer"}, "score": SCORE,
                                                "text": {"type": "string"}}}
    return inputs, params, {"type": "array", "items": ranked}


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def document(manifest: Manifest, version: str) -> dict[str, Any]:
    inputs, parameters, response = task_schemas(manifest)
    parameters = dict(parameters, truncate=TRUNCATE)
    request = {"type": "object", "required": ["inputs"], "additionalProperties": False,
               "properties": {"inputs": inputs,
                              "parameters": {"type": "object", "properties": parameters,
                                             "additionalProperties": False}}}
    timing = {"schema": {"type": "number"}, "description": "milliseconds"}
    headers = {name: timing for name in ("x-compute-time", "x-tokenization-time", "x-queue-time",
                                         "x-inference-time", "x-total-time")}
    headers["x-compute-tokens"] = {"schema": {"type": "integer"}}
    plain = {"200": {"description": "OK"}}
    return {
        "openapi": "3.0.3",
        "info": {"title": f"infinity: {manifest.source.task} with {manifest.source.model}", "version": version},
        "paths": {
            "/predict": {"post": {
                "summary": f"Run {manifest.source.task}",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/PredictRequest"}}}},
                "responses": {
                    "200": {"description": "Prediction", "headers": headers, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/PredictResponse"}}}},
                    "400": _error("Empty input"),
                    "413": _error("Body too large or too many inputs"),
                    "422": _error("Malformed body, unknown parameter, or input too long with truncate=false"),
                    "429": _error("Queue full; see Retry-After"),
                    "500": _error("Inference failed"),
                    "503": _error("Not ready"),
                },
            }},
            "/health/live": {"get": {"summary": "Process is up", "responses": plain}},
            "/health/ready": {"get": {"summary": "Model warmed up and healthy",
                                      "responses": {**plain, "503": _error("Not ready")}}},
            "/info": {"get": {"summary": "Model, target, parity and batching facts", "responses": plain}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": plain}},
        },
        "components": {"schemas": {"PredictRequest": request, "PredictResponse": response, "Error": ERROR}},
    }
