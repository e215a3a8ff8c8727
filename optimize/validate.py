"""Re-check an existing artifact against its original model."""
from __future__ import annotations

from pathlib import Path

from infinity.manifest import Manifest, verify_checksums
from infinity.tokenization import TextTokenizer
from optimize.parity import ParityResult, compare
from optimize.reference import OnnxRunner, probe_inputs, ranking_group_sizes, torch_reference
from optimize.source import load_source


def validate_artifact(artifact: Path | str, model: str | None = None, threads: int = 0) -> ParityResult:
    """Parity of the artifact's model.onnx against the source model, with the manifest's thresholds."""
    artifact = Path(artifact)
    manifest = Manifest.load(artifact)
    verify_checksums(artifact, manifest)
    task = manifest.source.task
    source = load_source(model or manifest.source.model, task)
    inputs = probe_inputs(task)
    tokenizer = TextTokenizer(artifact / manifest.tokenizer.file, manifest.tokenizer.max_length,
                              manifest.tokenizer.pad_id)
    candidate = OnnxRunner(tokenizer, task, manifest.task, threads).run(artifact / manifest.model.file, inputs)
    groups = ranking_group_sizes(inputs) if task == "ranking" else None
    return compare(task, torch_reference(source, inputs), candidate, groups, manifest.parity.thresholds)
