"""Routes for operators: health probes, facts about the model, metrics and the OpenAPI document."""
from __future__ import annotations

import platform
from importlib import metadata

import onnxruntime
import tokenizers
from starlette.requests import Request
from starlette.responses import Response

from infinity.api.endpoint import Endpoint, JSONResponse
from infinity.api.hf import HF
from infinity.engine.service import Service
from infinity.errors import ErrorType
from infinity.manifest import Manifest
from infinity.metrics import CONTENT_TYPE
from infinity.settings import Settings

PLAIN = {"type": "object"}


def version() -> str:
    try:
        return metadata.version("infinity-multiverse")
    except metadata.PackageNotFoundError:
        return "unknown"


async def live(request: Request) -> Response:
    return JSONResponse({"status": "live"})


async def ready(request: Request) -> Response:
    if await request.state.service.ready():
        return JSONResponse({"status": "ready"})
    return HF.failure(ErrorType.UNHEALTHY, "the model is not ready")


def served_name(manifest: Manifest, settings: Settings) -> str:
    """The model's name as every route shows it: --served-model-name, else the manifest's."""
    return settings.served_model_name or manifest.public_model_id


async def info(request: Request) -> Response:
    service: Service = request.state.service
    manifest, settings = service.model.manifest, service.settings
    facts = manifest.task
    return JSONResponse({
        "model": {"id": served_name(manifest, settings), "revision": manifest.source.revision,
                  "type": manifest.source.model_type},
        # TEI's /info fields, for clients written against it
        "model_id": served_name(manifest, settings), "model_sha": manifest.source.revision,
        "model_dtype": manifest.model.precision, "max_input_length": manifest.tokenizer.max_length,
        "max_client_batch_size": settings.max_inputs_per_request, "version": version(),
        "task": manifest.source.task,
        "target": {"name": manifest.target.name, "providers": manifest.target.providers,
                   "required_cpu_flags": manifest.target.required_cpu_flags},
        # served from a bundle: its targets, best first, the one chosen for this CPU, and why (else null)
        "bundle": service.model.bundle.info() if service.model.bundle else None,
        "precision": manifest.model.precision,
        "max_length": manifest.tokenizer.max_length,
        "labels": facts.id2label,
        "pooling": facts.pooling,
        "prompts": {"names": sorted(facts.prompts),
                    "default": settings.default_prompt_name or facts.default_prompt_name},
        "parity": {"passed": manifest.parity.passed, "overridden": manifest.parity.overridden,
                   "reference": manifest.parity.reference, "metrics": manifest.parity.metrics,
                   "thresholds": manifest.parity.thresholds, "failures": manifest.parity.failures},
        "versions": {"infinity": version(), "onnxruntime": onnxruntime.__version__,
                     "tokenizers": tokenizers.__version__, "python": platform.python_version(),
                     "built_with": manifest.source.library_versions},
        "batching": {"max_batch_tokens": settings.max_batch_tokens, "max_batch_size": settings.max_batch_size,
                     "max_queue": settings.max_queue, "max_inputs_per_request": settings.max_inputs_per_request,
                     "max_payload_bytes": settings.max_payload_bytes, "threads": settings.threads,
                     "engines": settings.engines},
        "chunking": {"long_inputs": settings.chunk_long_inputs, "overlap": settings.chunk_overlap,
                     "max_chunks_per_input": settings.max_chunks_per_input} if service.model.task.windowed else None,
        "auth": {"api_keys": bool(settings.api_keys), "public_metadata": settings.public_metadata},
    })


PROMETHEUS = CONTENT_TYPE  # what prometheus_client writes: its text exposition format


async def metrics(request: Request) -> Response:
    return Response(request.state.service.metrics.render(), headers={"content-type": PROMETHEUS})


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)


def endpoints(public_metadata: bool) -> list[Endpoint]:
    unready = {503: "Not ready"}
    guarded = not public_metadata
    return [
        Endpoint("/health/live", HF, "Process is up", PLAIN, view=live, method="GET", protected=False),
        Endpoint("/health/ready", HF, "Model warmed up and healthy", PLAIN, view=ready, method="GET",
                 protected=False, errors=unready),
        Endpoint("/health", HF, "Same as /health/ready (TEI's probe)", PLAIN, view=ready, method="GET",
                 protected=False, errors=unready),
        Endpoint("/info", HF, "Model, target, parity and batching facts", PLAIN, view=info, method="GET",
                 protected=guarded),
        Endpoint("/metrics", HF, "Prometheus metrics", {"type": "string"}, view=metrics, method="GET",
                 protected=guarded, media_type=PROMETHEUS),
        Endpoint("/openapi.json", HF, "This document", PLAIN, view=openapi, method="GET", protected=guarded),
    ]
