"""The HTTP API over real ONNX Runtime sessions: every task against its reference, and batch equality."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from bench.inprocess import predict
from infinity.api.app import create_app
from infinity.api.router import Router
from infinity.engine.model import LoadedModel
from infinity.settings import Settings

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Berlin is the capital of Germany.",
         "I loved this film, the acting was superb!", "Terrible service; I will never come back."]
LONG = " ".join(["a considerably longer sentence that pads the batch"] * 8)


def serve(artifact: Path, **settings: Any) -> TestClient:
    return TestClient(create_app(Router.build(LoadedModel.load(artifact, threads=1), Settings(**settings))))


@pytest.fixture(scope="module")
def embeddings(minilm_fp32_artifact: Path) -> Iterator[TestClient]:
    with serve(minilm_fp32_artifact) as client:
        yield client


def test_feature_extraction_matches_sentence_transformers(embeddings: TestClient,
                                                          minilm_fp32_artifact: Path) -> None:
    from sentence_transformers import SentenceTransformer

    model = LoadedModel.load(minilm_fp32_artifact)
    reference = SentenceTransformer(model.manifest.source.model, device="cpu")
    expected = reference.encode(TEXTS, normalize_embeddings=model.manifest.task.normalize)
    response = embeddings.post("/predict", json={"inputs": TEXTS})
    assert response.status_code == 200
    np.testing.assert_allclose(np.array(response.json()), expected, atol=1e-4)
    single = embeddings.post("/predict", json={"inputs": TEXTS[0]}).json()
    np.testing.assert_allclose(np.array(single), expected[0], atol=1e-4)


def test_timing_headers_on_every_prediction(embeddings: TestClient, minilm_fp32_artifact: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_fp32_artifact / "tokenizer.json"))
    tokenizer.no_padding()
    tokens = len(tokenizer.encode(TEXTS[1]).ids)
    response = embeddings.post("/predict", json={"inputs": TEXTS[1]})
    ms = {name: float(response.headers[f"x-{name}-time"])
          for name in ("compute", "tokenization", "queue", "inference", "total")}
    rounding = 0.002  # each header is rounded to a microsecond
    assert ms["inference"] > 0 and ms["tokenization"] > 0
    assert ms["compute"] >= ms["tokenization"] + ms["inference"] - rounding  # ... plus post-processing
    assert ms["total"] >= ms["compute"] + ms["queue"] - rounding
    assert int(response.headers["x-compute-tokens"]) == tokens


def test_a_text_alone_and_inside_a_padded_batch_gives_the_same_vector(embeddings: TestClient) -> None:
    alone = np.array(embeddings.post("/predict", json={"inputs": TEXTS[1]}).json())
    batch = embeddings.post("/predict", json={"inputs": [LONG, TEXTS[1], LONG + " and more"]})
    assert int(batch.headers["x-compute-tokens"]) > 3 * int(
        embeddings.post("/predict", json={"inputs": TEXTS[1]}).headers["x-compute-tokens"])
    np.testing.assert_allclose(np.array(batch.json())[1], alone, atol=1e-5)


def test_normalize_parameter(embeddings: TestClient) -> None:
    raw = np.array(embeddings.post("/predict", json={"inputs": TEXTS[0], "parameters": {"normalize": False}}).json())
    unit = np.array(embeddings.post("/predict", json={"inputs": TEXTS[0], "parameters": {"normalize": True}}).json())
    np.testing.assert_allclose(raw / np.linalg.norm(raw), unit, atol=1e-6)


def test_sequence_classification_matches_the_transformers_pipeline(artifact_for: Any) -> None:
    from transformers import pipeline

    artifact = artifact_for("sequence-classification")
    reference = pipeline("text-classification", model=LoadedModel.load(artifact).manifest.source.model,
                         device="cpu", top_k=None)
    pair = {"text": TEXTS[0], "text_pair": TEXTS[1]}
    with serve(artifact) as client:
        got = client.post("/predict", json={"inputs": TEXTS}).json()
        got_pair = client.post("/predict", json={"inputs": pair}).json()
        top = client.post("/predict", json={"inputs": TEXTS[2], "parameters": {"top_k": 1}}).json()
    for want, have in zip(reference(TEXTS) + [reference(pair)], got + [got_pair]):
        assert [item["label"] for item in have] == [item["label"] for item in want]
        # fused float kernels: probabilities agree to the order of the artifact's own parity check
        np.testing.assert_allclose([item["score"] for item in have], [item["score"] for item in want], atol=1e-3)
    assert top == got[2][:1]


def test_ranking_matches_the_cross_encoder_scores(artifact_for: Any) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    artifact = artifact_for("ranking")
    source = LoadedModel.load(artifact).manifest.source.model
    tokenizer = AutoTokenizer.from_pretrained(source)
    reference = AutoModelForSequenceClassification.from_pretrained(source).eval()
    query = "Where is Berlin?"
    with torch.no_grad():
        logits = reference(**tokenizer([query] * len(TEXTS), TEXTS, padding=True, return_tensors="pt")).logits
    expected = torch.sigmoid(logits[:, 0]).numpy()
    with serve(artifact) as client:
        ranked = client.post("/predict", json={"inputs": {"query": query, "texts": TEXTS},
                                               "parameters": {"return_text": True}}).json()
        top = client.post("/predict", json={"inputs": {"query": query, "texts": TEXTS},
                                            "parameters": {"top_n": 2}}).json()
    assert [r["index"] for r in ranked] == list(np.argsort(-expected, kind="stable"))
    for item in ranked:
        assert item["score"] == pytest.approx(float(expected[item["index"]]), abs=1e-3)
        assert item["text"] == TEXTS[item["index"]]
    assert [r["index"] for r in top] == [r["index"] for r in ranked[:2]]


def test_token_classification_over_http_matches_the_pipeline(artifact_for: Any) -> None:
    from transformers import pipeline

    artifact = artifact_for("token-classification")
    reference = pipeline("token-classification", model=LoadedModel.load(artifact).manifest.source.model,
                         device="cpu")
    text = "Hugging Face Inc. is a company based in New York City, close to the Manhattan Bridge."
    with serve(artifact) as client:
        for strategy in ("none", "first"):
            got = client.post("/predict", json={"inputs": text, "parameters": {
                "aggregation_strategy": strategy, "ignore_labels": []}}).json()
            want = reference(text, aggregation_strategy=strategy, ignore_labels=[])
            assert [{k: v for k, v in e.items() if k != "score"} for e in got] == \
                [{k: (v.item() if hasattr(v, "item") else v) for k, v in e.items() if k != "score"} for e in want]
            np.testing.assert_allclose([e["score"] for e in got], [e["score"] for e in want], atol=1e-4)


def test_info_metrics_and_openapi_describe_the_served_model(artifact_for: Any) -> None:
    artifact = artifact_for("token-classification")
    with serve(artifact, max_batch_size=16, max_inputs_per_request=8) as client:
        client.post("/predict", json={"inputs": ["Anna lives in Paris", "Bob works at Acme"]})
        info = client.get("/info").json()
        metrics = client.get("/metrics")
        spec = client.get("/openapi.json").json()
        assert client.get("/health/live").json() == {"status": "live"}
        assert client.get("/health/ready").status_code == 200
    assert info["task"] == "token-classification"
    assert info["labels"]["1"] == "B-PER"
    assert info["precision"] == "fp32" and info["parity"]["passed"] is True
    assert info["batching"]["max_batch_size"] == 16 and info["max_length"] > 0
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in ('infinity_request_duration_seconds_count{route="/predict"} 1',
                 "infinity_queue_duration_seconds_bucket", "infinity_tokenization_duration_seconds_sum",
                 "infinity_inference_duration_seconds_count", "infinity_batch_size_bucket",
                 "infinity_batch_tokens_bucket", "infinity_queue_depth 0",
                 'infinity_requests_total{route="/predict",status="200"} 1',
                 "process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total"):
        assert name in metrics.text
    operation = spec["paths"]["/predict"]["post"]
    request = operation["requestBody"]["content"]["application/json"]["schema"]
    assert set(request["properties"]["parameters"]["properties"]) == {
        "aggregation_strategy", "ignore_labels", "truncate", "truncation_direction"}
    assert request["properties"]["inputs"]["oneOf"][1]["maxItems"] == 8  # the server's own cap
    assert "x-compute-time" in operation["responses"]["200"]["headers"]
    # routes of other tasks are not described: they answer 404
    assert "/v1/embeddings" not in spec["paths"] and "/v1/rerank" not in spec["paths"]


def test_small_and_large_requests_take_their_own_paths_to_the_same_answer(embeddings: TestClient,
                                                                          minilm_fp32_artifact: Path) -> None:
    from infinity.engine.service import INLINE_CHARS

    model = LoadedModel.load(minilm_fp32_artifact, threads=1)
    small, large = TEXTS[:2], [LONG] * 4  # tokenized on the event loop / in the worker pool
    assert sum(map(len, small)) <= INLINE_CHARS < sum(map(len, large))
    for texts in (small, large):
        response = embeddings.post("/predict", json={"inputs": texts})
        np.testing.assert_allclose(np.array(response.json()), predict(model, texts), atol=1e-5)
