"""Quantized embeddings on the way out (int8, uint8, binary, ubinary), through the cohere client's v1 and v2 embed,
/embed, /predict and OpenAI's route on a real server: each equals sentence-transformers' quantize_embeddings of the
float answer, int8 and uint8 with the ranges the optimizer wrote into the manifest (a value past its range lands
on the end step, in both), for normalized and unnormalized vectors and with Matryoshka dimensions."""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from infinity.errors import ValidationError
from infinity.manifest import Manifest
from infinity.tasks.feature_extraction import FeatureExtraction
from tests.servers import Server, running

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Berlin is the capital of Germany.",
         "I loved this film, the acting was superb!", "Terrible service; I will never come back.",
         "Ein völlig anderer Satz auf Deutsch, um die Bereiche zu prüfen."]
KEY = "quantized-key"


def reference(vectors: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers.quantization import quantize_embeddings
    return np.asarray(quantize_embeddings(np.asarray(vectors, dtype=np.float32), precision, ranges=ranges))


@pytest.fixture(scope="module")
def server(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(minilm_fp32_artifact, tmp_path_factory.mktemp("quantized") / "server.log",
                 env={"INFINITY_API_KEY": KEY}) as started:
        yield started


@pytest.fixture(scope="module")
def ranges(minilm_fp32_artifact: Path) -> dict[str, np.ndarray]:
    stored = Manifest.load(minilm_fp32_artifact).task.embedding_ranges
    assert stored is not None
    return {name: np.asarray(value, dtype=np.float32) for name, value in stored.items()}


def post(server: Server, path: str, body: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=60)


def floats(server: Server, normalize: bool = True) -> np.ndarray:
    return np.asarray(post(server, "/embed", {"inputs": TEXTS, "normalize": normalize}).json(), dtype=np.float32)


def test_the_optimizer_stores_each_dimensions_range_of_the_served_vectors(ranges: dict[str, np.ndarray]) -> None:
    for kept in ranges.values():
        assert kept.shape == (2, 384) and (kept[0] < kept[1]).all()
    normalized = ranges["normalized"]
    assert -1 <= normalized.min() and normalized.max() <= 1  # ranges of unit vectors, as MiniLM answers by default
    assert np.abs(ranges["unnormalized"]).max() > 1.5 * np.abs(normalized).max()


def test_cohere_v2_embed_answers_every_type_as_quantize_embeddings_does(server: Server,
                                                                        ranges: dict[str, np.ndarray]) -> None:
    import cohere

    client = cohere.ClientV2(base_url=server.url, api_key=KEY)
    answer = client.embed(texts=TEXTS, model="m", input_type="search_document",
                          embedding_types=["float", "int8", "uint8", "binary", "ubinary"])
    assert answer.response_type == "embeddings_by_type" and answer.texts == TEXTS
    got = answer.embeddings
    expected, kept = floats(server), ranges["normalized"]
    np.testing.assert_allclose(got.float_, expected, atol=1e-6)
    within = (expected >= kept[0]) & (expected <= kept[1])
    assert 0.9 < within.mean() < 1  # texts the ranges were not calibrated on: most values inside, some past them
    for kind, values in (("int8", got.int8), ("uint8", got.uint8)):
        served = np.asarray(values)
        assert served.shape == (len(TEXTS), 384)
        np.testing.assert_array_equal(served, reference(expected, kind, kept))
    np.testing.assert_array_equal(np.asarray(got.binary), reference(expected, "binary"))
    np.testing.assert_array_equal(np.asarray(got.ubinary), reference(expected, "ubinary"))
    assert np.asarray(got.ubinary).shape == (len(TEXTS), 48)


def test_cohere_v1_embed_answers_floats_unless_types_are_asked(server: Server) -> None:
    import cohere

    client = cohere.Client(base_url=server.url, api_key=KEY)
    plain = client.embed(texts=TEXTS[:2], model="m", input_type="search_query")
    assert plain.response_type == "embeddings_floats"
    np.testing.assert_allclose(plain.embeddings, floats(server)[:2], atol=1e-6)
    typed = client.embed(texts=TEXTS[:2], model="m", input_type="search_query", embedding_types=["ubinary"])
    assert typed.response_type == "embeddings_by_type"
    np.testing.assert_array_equal(np.asarray(typed.embeddings.ubinary), reference(floats(server)[:2], "ubinary"))


def test_embed_predict_and_openai_take_a_precision(server: Server, ranges: dict[str, np.ndarray]) -> None:
    import openai

    expected = floats(server)
    binary = post(server, "/embed", {"inputs": TEXTS, "precision": "binary"}).json()
    np.testing.assert_array_equal(binary, reference(expected, "binary"))
    uint8 = np.asarray(post(server, "/predict", {"inputs": TEXTS, "parameters": {"precision": "uint8"}}).json())
    np.testing.assert_array_equal(uint8, reference(expected, "uint8", ranges["normalized"]))
    single = post(server, "/predict", {"inputs": TEXTS[0], "precision": "ubinary"}).json()
    assert single == reference(expected[:1], "ubinary")[0].tolist()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    int8 = client.embeddings.create(model="m", input=TEXTS, encoding_format="float", extra_body={"precision": "int8"})
    served = np.asarray([item.embedding for item in int8.data])
    np.testing.assert_array_equal(served, reference(expected, "int8", ranges["normalized"]))
    # the client's default asks for base64, which it reads as float32 bytes: the same integers, as float32
    default = client.embeddings.create(model="m", input=TEXTS, extra_body={"precision": "int8"})
    assert [item.embedding for item in default.data] == served.tolist()


def test_int8_holds_for_unnormalized_vectors_and_cuts_after_its_steps(server: Server,
                                                                      ranges: dict[str, np.ndarray]) -> None:
    raw = floats(server, normalize=False)
    unnormalized = post(server, "/embed", {"inputs": TEXTS, "precision": "uint8", "normalize": False}).json()
    np.testing.assert_array_equal(unnormalized, reference(raw, "uint8", ranges["unnormalized"]))
    # the ranges hold for the full vector: its steps, cut to the first 64 (not renormalized after the cut)
    cut = post(server, "/v2/embed", {"texts": TEXTS, "embedding_types": ["int8", "binary", "float"],
                                     "output_dimension": 64}).json()["embeddings"]
    np.testing.assert_array_equal(cut["int8"], reference(floats(server), "int8", ranges["normalized"])[:, :64])
    shortened = np.asarray(post(server, "/embed", {"inputs": TEXTS, "dimensions": 64}).json(), dtype=np.float32)
    np.testing.assert_allclose(cut["float"], shortened, atol=1e-6)
    np.testing.assert_array_equal(cut["binary"], reference(shortened, "binary"))
    refused = post(server, "/embed", {"inputs": TEXTS, "precision": "int4"})
    assert refused.status_code == 422 and "precision" in refused.json()["error"]


def test_an_artifact_without_ranges_names_what_to_do(minilm_fp32_artifact: Path) -> None:
    manifest = Manifest.load(minilm_fp32_artifact)
    bare = dataclasses.replace(manifest, task=dataclasses.replace(manifest.task, embedding_ranges=None))
    task = FeatureExtraction(bare)
    with pytest.raises(ValidationError, match="optimize the model again, or ask for binary or ubinary"):
        task.check_precision(["float", "int8"])
    task.check_precision(["float", "ubinary"])
