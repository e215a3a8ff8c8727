"""Sparse embeddings (SPLADE): a SparseEncoder directory optimized and served on /embed_sparse and /predict, its
answers against sentence-transformers' SparseEncoder in PyTorch FP32, alone and batched, fp32 and INT8."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import pytest

from infinity.manifest import Manifest
from optimize.stages.s1_load import load_source
from optimize.stages.s4_reference import torch_reference
from optimize.tasks import task_for
from optimize.tasks.sparse_embedding import sparse_encoder
from tests.models import build_tiny_splade, minilm_dir, transformers_files
from tests.servers import Server, running

TEXTS = ["What is the capital of France?", "Paris is the capital and most populous city of France.", "ok",
         "SPLADE weighs every word of the vocabulary, most of them zero.",
         " ".join(["antidisestablishmentarianism lantern harbor"] * 120)]  # past the maximum length: truncated


def dense(vector: list[dict[str, Any]], size: int) -> np.ndarray:
    out = np.zeros(size, dtype=np.float64)
    for entry in vector:
        out[entry["index"]] = entry["value"]
    return out


@pytest.fixture(scope="module")
def splade_dir(artifacts: Any) -> Path:
    return Path(artifacts.source("splade-tiny"))


@pytest.fixture(scope="module")
def fp32_server(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(artifact_for("sparse-embedding"), tmp_path_factory.mktemp("sparse") / "server.log") as server:
        yield server


@pytest.fixture(scope="module")
def reference(splade_dir: Path) -> np.ndarray:
    return np.stack(torch_reference(load_source(str(splade_dir), "sparse-embedding"), TEXTS)).astype(np.float64)


def test_the_manifest_says_what_the_graph_does(artifact_for: Any) -> None:
    manifest = Manifest.load(artifact_for("sparse-embedding"))
    assert manifest.source.task == "sparse-embedding" and manifest.task.pooling == "splade"
    assert manifest.task.splade == {"pooling_strategy": "max", "activation_function": "relu"}
    assert manifest.task.embedding_dim == 30522 and manifest.parity.passed
    assert manifest.parity.reference == "sentence-transformers SparseEncoder, PyTorch FP32"
    assert manifest.parity.batch_invariance["max_abs_diff"] == 0.0


def test_embed_sparse_matches_the_sparse_encoder_alone_and_batched(fp32_server: Server,
                                                                   reference: np.ndarray) -> None:
    batched = httpx.post(fp32_server.url + "/embed_sparse", json={"inputs": TEXTS}, timeout=60).json()
    alone = [httpx.post(fp32_server.url + "/embed_sparse", json={"inputs": text}, timeout=60).json()[0]
             for text in TEXTS]
    assert batched == alone  # not merely close: an answer never depends on its batch
    for vector, expected in zip(batched, reference):
        indices = [entry["index"] for entry in vector]
        assert indices == sorted(indices) and all(entry["value"] > 0 for entry in vector)
        served = dense(vector, len(expected))
        assert np.abs(served - expected).max() < 1e-4
        # the same non-zero weights, but for those within float rounding of zero on either side
        assert set(np.flatnonzero(served > 1e-5)) <= set(np.flatnonzero(expected))
        assert set(np.flatnonzero(expected > 1e-5)) <= set(np.flatnonzero(served))
        assert 10 < len(vector) < 3000  # sparse, as a trained SPLADE head is


def test_predict_answers_the_same_vectors_and_selects_by_top_k_and_threshold(fp32_server: Server) -> None:
    whole = httpx.post(fp32_server.url + "/embed_sparse", json={"inputs": TEXTS[:2]}, timeout=60).json()
    assert httpx.post(fp32_server.url + "/predict", json={"inputs": TEXTS[:2]}, timeout=60).json() == whole
    assert httpx.post(fp32_server.url + "/predict", json={"inputs": TEXTS[0]}, timeout=60).json() == whole[0]
    top = httpx.post(fp32_server.url + "/predict", json={"inputs": TEXTS[:2], "parameters": {"top_k": 5}},
                     timeout=60).json()
    for selected, full in zip(top, whole):
        largest = sorted(full, key=lambda entry: -entry["value"])[:5]
        assert selected == sorted(largest, key=lambda entry: entry["index"])
    threshold = whole[0][len(whole[0]) // 2]["value"]
    above = httpx.post(fp32_server.url + "/embed_sparse", json={"inputs": TEXTS[0], "threshold": threshold},
                       timeout=60).json()[0]
    assert above == [entry for entry in whole[0] if entry["value"] > threshold]


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"inputs": "x", "top_k": 0}, 422, "top_k must be at least 1"),
    ({"inputs": "x", "top_k": 30523}, 422, "top_k must be at most 30522"),
    ({"inputs": "x", "threshold": -1}, 422, "threshold must be at least 0"),
    ({"inputs": "x", "threshold": "high"}, 422, "threshold must be a number"),
    ({"inputs": []}, 400, "inputs"),
])
def test_bad_selections_are_refused_in_one_line(fp32_server: Server, body: dict[str, Any], status: int,
                                               words: str) -> None:
    response = httpx.post(fp32_server.url + "/embed_sparse", json=body, timeout=60)
    assert response.status_code == status and words in response.json()["error"], response.text


def test_dense_routes_say_what_a_sparse_server_runs(fp32_server: Server, minilm_fp32_artifact: Path,
                                                    tmp_path: Path) -> None:
    refused = httpx.post(fp32_server.url + "/embed", json={"inputs": "x"}, timeout=60)
    assert refused.status_code == 404 and "needs a feature-extraction model" in refused.json()["error"]
    assert httpx.post(fp32_server.url + "/v1/embeddings", json={"input": "x"}, timeout=60).status_code == 404
    with running(minilm_fp32_artifact, tmp_path / "server.log") as dense_server:
        refused = httpx.post(dense_server.url + "/embed_sparse", json={"inputs": "x"}, timeout=60)
    assert refused.status_code == 404 and "needs a sparse-embedding model" in refused.json()["error"]


def test_answers_match_their_published_schema(fp32_server: Server) -> None:
    spec = httpx.get(fp32_server.url + "/openapi.json", timeout=60).json()
    for path, body in (("/embed_sparse", {"inputs": TEXTS[:2]}), ("/predict", {"inputs": TEXTS[0]}),
                       ("/predict", {"inputs": TEXTS[:2]})):
        schema = spec["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        answer = httpx.post(fp32_server.url + path, json=body, timeout=60).json()
        jsonschema.Draft4Validator(schema).validate(answer)


def test_the_int8_artifact_passes_sparse_parity_batch_invariant(artifact_for: Any, tmp_path: Path) -> None:
    artifact = artifact_for("sparse-embedding", "int8")
    manifest = Manifest.load(artifact)
    assert manifest.model.precision == "int8" and manifest.parity.passed
    metrics = manifest.parity.metrics
    assert metrics["cosine_min"] >= 0.99 and metrics["dot_spearman_mean"] >= 0.95
    assert metrics["top_k_overlap_mean"] >= 0.9
    assert manifest.parity.batch_invariance["max_abs_diff"] == 0.0
    texts = task_for("sparse-embedding").heldout()[:24]
    with running(artifact, tmp_path / "server.log") as server:
        batched = httpx.post(server.url + "/embed_sparse", json={"inputs": texts}, timeout=120).json()
        alone = [httpx.post(server.url + "/embed_sparse", json={"inputs": text}, timeout=60).json()[0]
                 for text in texts[:6]]
    assert alone == batched[:6]


def test_a_bare_masked_lm_needs_pooling_splade_and_runs_as_the_sparse_encoder(splade_dir: Path,
                                                                             tmp_path: Path) -> None:
    bare = transformers_files(splade_dir, tmp_path / "bare")
    with pytest.raises(ValueError, match="declares no SPLADE pooling .* pass --pooling splade"):
        load_source(str(bare), "sparse-embedding")
    source = load_source(str(bare), "sparse-embedding", pooling="splade")
    assert source.facts.splade == {"pooling_strategy": "max", "activation_function": "relu"}
    own = load_source(str(splade_dir), "sparse-embedding")
    expected = sparse_encoder(own).encode(TEXTS[:3], convert_to_tensor=True, convert_to_sparse_tensor=False)
    got = sparse_encoder(source).encode(TEXTS[:3], convert_to_tensor=True, convert_to_sparse_tensor=False)
    assert np.array_equal(got.numpy(), expected.numpy())


@pytest.mark.parametrize(("task", "pooling", "words"), [
    ("feature-extraction", None, "masked-LM with SPLADE pooling.*pass --task sparse-embedding"),
    ("sparse-embedding", "mean", "sparse-embedding pools with splade only"),
    ("ranking", "splade", "--pooling is for feature-extraction and sparse-embedding, not ranking"),
])
def test_a_splade_model_asked_for_the_wrong_thing_is_refused_in_one_line(splade_dir: Path, task: str,
                                                                         pooling: str | None, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        load_source(str(splade_dir), task, pooling=pooling)


def test_a_model_without_a_masked_lm_head_is_refused_not_run_on_random_weights(tmp_path: Path) -> None:
    from optimize.stages.s2_export import export_onnx
    from optimize.tasks.base import UnsupportedModel

    bare = transformers_files(minilm_dir(), tmp_path / "bert")  # a BertModel: no masked-LM head
    source = load_source(str(bare), "sparse-embedding", pooling="splade")
    with pytest.raises(UnsupportedModel, match="has no trained masked-LM head"):
        export_onnx(source, tmp_path / "model.onnx")


@pytest.mark.parametrize("pooling", ["sum", "max"])
def test_a_splade_model_pooled_per_token_exports_faithfully(tmp_path: Path, pooling: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Sum pooling cannot take its maximum first, nor can max pooling without a linear decoder to pool inside:
    the graph runs the activation per token and pools as the model says."""
    import onnxruntime as ort
    from transformers import BertForMaskedLM

    from optimize.stages.s2_export import export_onnx

    path = build_tiny_splade(tmp_path / pooling, layers=1, pooling=pooling)
    assert json.loads((path / "1_SpladePooling" / "config.json").read_text())["pooling_strategy"] == pooling
    source = load_source(str(path), "sparse-embedding")
    expected = np.stack(torch_reference(source, TEXTS[:3]))
    if pooling == "max":
        monkeypatch.setattr(BertForMaskedLM, "get_output_embeddings", lambda self: None)
    names, output = export_onnx(source, tmp_path / "model.onnx")
    assert output == "sparse_embedding"
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = source.tokenizer(TEXTS[:3], padding=True, return_tensors="np")
    got = session.run(None, {name: feeds[name] for name in names})[0]
    assert np.abs(got - expected).max() < 1e-3 * max(1.0, float(np.abs(expected).max()))
