"""The artifact manifest: the contract between the optimizer and the server.

The optimizer writes it, the server trusts nothing else. Plain dataclasses, JSON on disk.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"
TASKS = ("feature-extraction", "sequence-classification", "token-classification", "ranking")


class ManifestError(ValueError):
    """The artifact is missing, malformed, or does not match its manifest."""


@dataclass
class Source:
    model: str
    task: str
    revision: str | None = None
    model_type: str | None = None
    library_versions: dict[str, str] = field(default_factory=dict)


@dataclass
class Target:
    name: str
    providers: list[str]
    required_cpu_flags: list[str] = field(default_factory=list)
    provider_options: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class ModelFile:
    file: str
    sha256: str
    precision: str
    opset: int
    inputs: dict[str, list[str | int]]
    outputs: dict[str, list[str | int]]
    size_bytes: int = 0


@dataclass
class TokenizerFile:
    file: str
    sha256: str
    max_length: int
    pad_id: int
    extra_files: list[str] = field(default_factory=list)


@dataclass
class TaskFacts:
    pooling: str | None = None          # "mean" | "cls" (feature-extraction)
    normalize: bool = False             # default for feature-extraction
    id2label: dict[int, str] | None = None
    score_activation: str | None = None  # "sigmoid" | "softmax" | "none" (ranking / classification default)
    embedding_dim: int | None = None


@dataclass
class Optimization:
    fusion: dict[str, int] = field(default_factory=dict)
    fusion_gaps: list[str] = field(default_factory=list)
    quantization: dict[str, Any] | None = None
    kept_float: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    exported_bytes: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class Parity:
    reference: str
    probe_size: int
    metrics: dict[str, float]
    thresholds: dict[str, float]
    passed: bool
    failures: list[str] = field(default_factory=list)
    host_cpu_flags: list[str] = field(default_factory=list)
    overridden: bool = False


@dataclass
class Manifest:
    source: Source
    target: Target
    model: ModelFile
    tokenizer: TokenizerFile
    task: TaskFacts
    optimization: Optimization
    parity: Parity
    schema_version: int = SCHEMA_VERSION
    created_at: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Manifest":
        try:
            version = data["schema_version"]
            if version != SCHEMA_VERSION:
                raise ManifestError(f"manifest schema version {version} is not supported (expected {SCHEMA_VERSION})")
            task = dict(data["task"])
            if task.get("id2label") is not None:
                task["id2label"] = {int(k): v for k, v in task["id2label"].items()}
            manifest = cls(
                source=Source(**data["source"]),
                target=Target(**data["target"]),
                model=ModelFile(**data["model"]),
                tokenizer=TokenizerFile(**data["tokenizer"]),
                task=TaskFacts(**task),
                optimization=Optimization(**data["optimization"]),
                parity=Parity(**data["parity"]),
                schema_version=version,
                created_at=data.get("created_at", ""),
            )
        except (KeyError, TypeError) as exc:
            raise ManifestError(f"manifest is malformed: {exc}") from None
        if manifest.source.task not in TASKS:
            raise ManifestError(f"unknown task {manifest.source.task!r}")
        return manifest

    def save(self, directory: Path) -> None:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        (Path(directory) / MANIFEST_FILE).write_text(text + "\n", encoding="utf-8")

    @classmethod
    def load(cls, directory: Path | str) -> "Manifest":
        path = Path(directory) / MANIFEST_FILE
        if not path.is_file():
            raise ManifestError(f"no {MANIFEST_FILE} in {directory}: not an artifact directory")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ManifestError(f"{path} is not valid JSON: {exc}") from None
        return cls.from_dict(data)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_checksums(directory: Path | str, manifest: Manifest) -> None:
    directory = Path(directory)
    for name, expected in ((manifest.model.file, manifest.model.sha256), (manifest.tokenizer.file, manifest.tokenizer.sha256)):
        path = directory / name
        if not path.is_file():
            raise ManifestError(f"{name} is missing from {directory}")
        actual = sha256_file(path)
        if actual != expected:
            raise ManifestError(f"checksum mismatch for {name}: manifest says {expected[:12]}..., file is {actual[:12]}...")


def write_atomically(staging: Path, destination: Path) -> None:
    """Move a fully written staging directory to its destination in one rename."""
    destination = Path(destination).resolve()
    destination.parent.mkdir(parents=True, exist_ok=True)
    if destination.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{destination.name}.old-", dir=destination.parent))
        os.replace(destination, old / destination.name)
        os.replace(staging, destination)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, destination)
