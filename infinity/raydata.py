"""Ray Data: `Dataset.map_batches(Embedder, ...)` runs infinity.Model in Ray actors, each loading the artifact once
with the CPUs Ray gives it, for corpora past one machine (docs/library.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from infinity.engine.hostinfo import physical_cores
from infinity.library import Model


def assigned_cpus() -> int | None:
    """The CPUs Ray reserved for this actor (num_cpus), or None outside Ray."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")  # type: ignore[no-untyped-call]
    return max(1, int(cpus)) if cpus else None


class Embedder:
    """A callable class for `map_batches`: each batch's `text_column` embedded into `output_column` (one row
    per text, as infinity.Model.embed answers it; `params` are embed's). Threads: the actor's num_cpus unless
    given; engines: one per thread unless given (a corpus job, as `infinity embed`)."""

    def __init__(self, artifact: str | Path, text_column: str = "text", output_column: str = "embedding",
                 threads: int | None = None, engines: int | None = None, **params: Any) -> None:
        threads = threads or assigned_cpus() or physical_cores()
        self.model = Model(artifact, threads=threads, engines=engines or threads)
        self.text_column, self.output_column, self.params = text_column, output_column, params

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(text) for text in batch[self.text_column]]
        return {**batch, self.output_column: self.model.embed(texts, **self.params)}
