"""Re-check an existing artifact against its original model, as the server runs it, on the held-out texts."""
from __future__ import annotations

from pathlib import Path

from infinity.model import LoadedModel
from optimize.source import RERANKER_FIELDS, load_source
from optimize.validate.heldout import heldout_inputs
from optimize.validate.reference import torch_reference
from optimize.validate.served import ServedParity, served_parity


def validate_artifact(artifact: Path | str, model: str | None = None, threads: int = 0) -> ServedParity:
    """Parity of the artifact (worst of alone and batched) against the source model, with the manifest's
    thresholds, plus how far answers move between alone and batched."""
    served = LoadedModel.load(artifact, threads=threads or None, providers=["CPUExecutionProvider"], spin_wait=False)
    task = served.manifest.source.task
    # the pooling the artifact was built with: a model without its own Pooling config was given one
    reranker = served.manifest.task.reranker
    source = load_source(model or served.manifest.source.model, task, served.manifest.task.pooling,
                         trust_remote_code=served.manifest.source.trust_remote_code,
                         reranker={name: getattr(reranker, name) for name in RERANKER_FIELDS} if reranker else None)
    inputs = heldout_inputs(task)
    return served_parity(served, inputs, torch_reference(source, inputs), served.manifest.parity.thresholds)
