"""Every token's vector on TEI's /embed_all: the last layer as sentence-transformers answers it, alone, batched,
split past the batch limit, and never batched with requests that want pooled vectors."""
from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.models import minilm_dir
from tests.servers import Server, running

TEXTS = ["What is the capital of France?", "ok", "Paris is the capital and most populous city of France.",
         "def square(x):\n    return x ** 2", " ".join(["lantern harbor"] * 200)]  # the last one is truncated


@pytest.fixture(scope="module")
def server(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # batches of at most 2 rows: a request of 5 texts runs as 3 parts, joined into one answer
    with running(minilm_fp32_artifact, tmp_path_factory.mktemp("tokens") / "server.log",
                 "--max-batch-size", "2") as started:
        yield started


@pytest.fixture(scope="module")
def reference() -> list[np.ndarray]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir()), device="cpu")
    return [vectors.numpy() for vectors in model.encode(TEXTS, output_value="token_embeddings")]


def embed_all(server: Server, inputs: Any) -> Any:
    response = httpx.post(server.url + "/embed_all", json={"inputs": inputs}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_token_vectors_match_sentence_transformers_whole_and_split(server: Server,
                                                                   reference: list[np.ndarray]) -> None:
    whole = embed_all(server, TEXTS)  # more texts than a batch holds
    tokens = httpx.post(server.url + "/tokenize", json={"inputs": TEXTS}, timeout=60).json()
    assert [len(vectors) for vectors in whole] == [min(len(t), 256) for t in tokens] == [len(r) for r in reference]
    for vectors, expected in zip(whole, reference):
        np.testing.assert_allclose(np.array(vectors), expected, atol=1e-4)
    assert [embed_all(server, text)[0] for text in TEXTS] == whole  # alone, each answer is the same


def test_pooled_and_token_requests_at_once_each_get_their_own_answer(server: Server) -> None:
    pooled_alone = httpx.post(server.url + "/embed", json={"inputs": TEXTS}, timeout=60).json()
    tokens_alone = embed_all(server, TEXTS)

    def pooled(_: int) -> Any:
        return httpx.post(server.url + "/embed", json={"inputs": TEXTS}, timeout=60).json()

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(pooled if i % 2 else lambda _: embed_all(server, TEXTS), i) for i in range(16)]
        answers = [future.result() for future in futures]
    for i, answer in enumerate(answers):
        assert answer == (pooled_alone if i % 2 else tokens_alone)


def test_the_route_is_published_and_refuses_what_it_should(server: Server) -> None:
    spec = httpx.get(server.url + "/openapi.json", timeout=60).json()
    fields = spec["paths"]["/embed_all"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    # prompt_name is refused: MiniLM has none
    assert set(fields) == {"inputs", "truncate", "truncation_direction", "prompt_name", "chunking"}
    too_long = httpx.post(server.url + "/embed_all", json={"inputs": TEXTS[-1], "truncate": False}, timeout=60)
    assert too_long.status_code == 422 and "error" in too_long.json()
    assert httpx.post(server.url + "/embed_all", json={"inputs": []}, timeout=60).status_code == 400
