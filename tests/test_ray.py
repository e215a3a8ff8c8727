"""Ray Data on a real local cluster: two actors, each loading the artifact once with the one CPU Ray gives it,
embed a few thousand texts through map_batches; every vector equals infinity.Model's for the same text."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from infinity import Model
from infinity.raydata import Embedder

ray = pytest.importorskip("ray", reason="Ray is the test extra's (pip install 'infinity-multiverse[ray]')")
WORDS = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8").split()


def test_map_batches_in_two_actors_gives_the_models_vectors(minilm_int8_artifact: Path) -> None:
    texts = [" ".join(WORDS[(i * 7) % 3000:(i * 7) % 3000 + 4 + i % 23]) for i in range(2000)]
    # Ray's own temporary folder (its sockets' paths must stay short), a cluster of this test's alone
    with tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp") as scratch:
        embedded = embed_on_ray(texts, minilm_int8_artifact, scratch)
    assert [row["id"] for row in embedded] == list(range(2000))
    with Model(minilm_int8_artifact, threads=1) as model:
        assert np.array_equal(np.stack([row["embedding"] for row in embedded]), model.embed(texts))


def embed_on_ray(texts: list[str], artifact: Path, scratch: str) -> list[dict[str, object]]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=scratch)
    try:
        dataset = ray.data.from_items([{"id": i, "text": text} for i, text in enumerate(texts)])
        embedded = dataset.map_batches(Embedder, fn_constructor_args=(str(artifact),), concurrency=2, num_cpus=1,
                                       batch_size=500, batch_format="numpy")
        return sorted(embedded.take_all(), key=lambda row: int(row["id"]))  # type: ignore[no-any-return]
    finally:
        ray.shutdown()
