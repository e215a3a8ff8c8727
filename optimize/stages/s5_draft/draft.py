"""The manifest before parity, and the tokenizer files beside it: what every candidate graph is loaded with, as the
server loads it."""
from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

from infinity.artifact import sha256_file
from infinity.engine.model import artifact_tokenizer
from infinity.engine.tokenization import TextTokenizer
from infinity.manifest import Manifest, Optimization, Parity, Precision, Source, Target, TokenizerFile
from optimize.graph.onnxio import describe_model
from optimize.options import Plan
from optimize.tasks.base import SourceModel


def draft(plan: Plan, source: SourceModel, tokenizer: Path, extra: list[str], input_names: list[str], graph: Path,
          staging: Path) -> tuple[Manifest, TextTokenizer]:
    """The tokenizer files copied from `tokenizer` into `staging`, and the draft manifest with the tokenizer it
    serves (as served: calibration and every graph tried go through it)."""
    options, preset, task = plan.options, plan.preset, plan.task
    for name in ("tokenizer.json", *extra):
        shutil.copy(tokenizer / name, staging / name)
    manifest = Manifest(
        source=Source(model=str(options.model), task=task.name, revision=_revision(source.path),
                      model_type=source.model_type, library_versions=library_versions(),
                      model_id=source.model_id, trust_remote_code=source.trust_remote_code),
        target=Target(name=preset.name, providers=list(preset.providers_for(plan.precision)),
                      # Only INT8 and BF16 depend on the instruction set; an fp32 or fp16 graph runs on any CPU.
                      required_cpu_flags=list(preset.required_cpu_flags)
                      if plan.precision in (Precision.INT8, Precision.BF16) else [],
                      provider_options=preset.options_for(plan.precision, input_names, source.max_length)),
        # candidates load by file name and package describes the final graph: the graph here is not hashed (2 s of
        # mpnet's fused graph per target)
        model=describe_model(graph, plan.precision, checksums=False),
        tokenizer=TokenizerFile(file="tokenizer.json", sha256=sha256_file(staging / "tokenizer.json"),
                                max_length=source.max_length, pad_id=source.tokenizer.pad_token_id or 0,
                                extra_files=extra),
        task=source.facts, optimization=Optimization(),
        parity=Parity(reference=task.reference_name(source), probe_size=len(task.heldout()), metrics={},
                      thresholds={**task.thresholds, **(options.thresholds or {})}, passed=False))
    return manifest, artifact_tokenizer(staging, manifest)


LIBRARIES = ("torch", "transformers", "sentence-transformers", "onnx", "onnxruntime", "tokenizers")


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def _revision(path: Path) -> str | None:
    # A hub snapshot directory is named after its commit.
    return path.name if path.parent.name == "snapshots" else None
