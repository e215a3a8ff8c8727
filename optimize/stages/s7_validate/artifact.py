"""Re-check an existing artifact against its original model, as the server runs it, on the held-out texts."""
from __future__ import annotations

from pathlib import Path

from infinity.engine.model import LoadedModel
from infinity.manifest import Manifest
from optimize.stages.s1_load import load_source
from optimize.stages.s4_reference import torch_reference
from optimize.stages.s5_draft.served import ServedParity, on_target, served_parity
from optimize.tasks.ranking import RERANKER_FIELDS


def _load(artifact: Path, threads: int) -> LoadedModel:
    return on_target(Manifest.load(artifact), lambda providers: LoadedModel.load(
        artifact, threads=threads or None, providers=providers, spin_wait=False))


def validate_artifact(artifact: Path | str, model: str | None = None, threads: int = 0) -> ServedParity:
    """Parity of the artifact (worst of alone and batched) against the source model, with the manifest's
    thresholds, plus how far answers move between alone and batched, on the provider that serves it here."""
    served = _load(Path(artifact), threads)
    task = served.manifest.source.task
    # the pooling the artifact was built with: a model without its own Pooling config was given one
    reranker = served.manifest.task.reranker
    source = load_source(model or served.manifest.source.model, task, served.manifest.task.pooling,
                         trust_remote_code=served.manifest.source.trust_remote_code,
                         reranker={name: getattr(reranker, name) for name in RERANKER_FIELDS} if reranker else None)
    inputs = source.task.heldout()
    return served_parity(source.task, served, inputs, torch_reference(source, inputs),
                         served.manifest.parity.thresholds)
