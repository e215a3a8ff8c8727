"""What the manifest records of the build: the libraries' versions, the graph file's description, the time. The
manifest is assembled in pipeline.Build and published with one rename by infinity.artifact.write_atomically."""
from __future__ import annotations

import datetime as dt
import importlib.metadata
from pathlib import Path
from typing import Any

import onnx

from infinity.artifact import sha256_file
from infinity.manifest import ModelFile, Precision
from optimize.graph.onnxio import external_files, model_bytes

LIBRARIES = ("torch", "transformers", "sentence-transformers", "onnx", "onnxruntime", "tokenizers")


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def describe_model(path: Path, precision: Precision) -> ModelFile:
    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)

    def shape(value: Any) -> list[str | int]:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    return ModelFile(
        file=path.name, sha256=sha256_file(path), precision=precision, opset=int(opset),
        inputs={v.name: shape(v) for v in model.graph.input},
        outputs={v.name: shape(v) for v in model.graph.output},
        size_bytes=model_bytes(path),
        external_data={name: sha256_file(path.parent / name) for name in external_files(path)},
    )


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
