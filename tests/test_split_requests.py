"""A request with more inputs than a batch holds is run as parts and answered whole, up to
--max-inputs-per-request; past it, one 413 line. Real servers over HTTP; each answer is checked against the same
inputs sent in requests small enough never to be split."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tests.servers import WAIT, metric, running

TOPICS = ["the weather in Lyon", "a broken bicycle", "quarterly revenue", "a recipe for bread", "Anna in Berlin"]


def texts(count: int) -> list[str]:
    """Inputs of different lengths, so parts pad differently."""
    return [f"Note {i} is about {TOPICS[i % len(TOPICS)]}" + " and more" * (i % 7) for i in range(count)]


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url, json=body, timeout=WAIT)


def test_a_thousand_inputs_are_answered_whole_and_one_more_is_refused(minilm_fp32_artifact: Path,
                                                                      tmp_path: Path) -> None:
    many = texts(1000)
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--max-batch-size", "16",
                 "--max-inputs-per-request", "1000") as server:
        whole = post(server.url + "/embed", {"inputs": many})
        small = [post(server.url + "/embed", {"inputs": many[start:start + 16]}) for start in range(0, 1000, 100)]
        padded, real = metric(server, "infinity_padded_tokens_total"), metric(server, "infinity_real_tokens_total")
        refused = post(server.url + "/embed", {"inputs": [*many, "one more"]})
        openai = post(server.url + "/v1/embeddings", {"input": many[:40]})
    assert whole.status_code == 200, whole.text[:300]
    # the parts of a request are cut from its inputs sorted by length: little of each batch is padding
    assert real > 0 and padded / real <= 1.1, (padded, real)
    vectors = np.array(whole.json())
    assert vectors.shape == (1000, 384)
    for start, answer in zip(range(0, 1000, 100), small):
        np.testing.assert_allclose(vectors[start:start + 16], np.array(answer.json()), atol=1e-5)
    assert refused.status_code == 413
    message = refused.json()["error"]
    assert "1001" in message and "limit is 1000" in message and "\n" not in message
    assert [row["index"] for row in openai.json()["data"]] == list(range(40))
    np.testing.assert_allclose([row["embedding"] for row in openai.json()["data"]], vectors[:40], atol=1e-5)


def test_split_token_rows_and_rankings_match_unsplit_answers(artifact_for: Any, tmp_path: Path) -> None:
    """Parts pad their token rows to different widths, and a ranking spans parts: both come out as if unsplit."""
    sentences = ["Anna lives in Paris", "Bob works at Acme in Berlin with Carla and Dieter since 2019",
                 "Paris", "Emma met Frank in Rome and then flew to Oslo", "Acme"]
    with running(artifact_for("token-classification"), tmp_path / "tokens.log", "--max-batch-size", "2") as server:
        split = post(server.url + "/predict", {"inputs": sentences})
        alone = [post(server.url + "/predict", {"inputs": [sentence]}).json()[0] for sentence in sentences]
    assert split.status_code == 200, split.text[:300]
    for got, want in zip(split.json(), alone):
        assert [{k: v for k, v in e.items() if k != "score"} for e in got] == \
            [{k: v for k, v in e.items() if k != "score"} for e in want]
        np.testing.assert_allclose([e["score"] for e in got], [e["score"] for e in want], atol=1e-5)

    query, documents = "Where is the Eiffel tower?", texts(7)
    documents[4] = "The Eiffel tower is in Paris."
    with running(artifact_for("ranking"), tmp_path / "rank.log", "--max-batch-size", "2") as server:
        ranked = post(server.url + "/rerank", {"query": query, "texts": documents, "raw_scores": True})
        each = [post(server.url + "/rerank", {"query": query, "texts": [d], "raw_scores": True}).json()[0]["score"]
                for d in documents]
    assert ranked.status_code == 200, ranked.text[:300]
    assert [row["index"] for row in ranked.json()] == sorted(range(7), key=lambda i: -each[i])
    np.testing.assert_allclose(sorted((row["score"] for row in ranked.json()), reverse=True),
                               sorted(each, reverse=True), atol=1e-5)


def test_per_token_int8_answers_a_mixed_request_bit_identically_to_each_input_alone(minilm_int8_artifact: Path,
                                                                                  tmp_path: Path) -> None:
    """The inputs are sorted by length, cut into parts and joined with other requests' parts: with per-token
    INT8 no answer may depend on that, nor on the client's order coming back."""
    many = texts(70)[::-1]  # longest first, so the parts run in another order than the client's
    with running(minilm_int8_artifact, tmp_path / "server.log", "--max-batch-size", "8") as server:
        whole = post(server.url + "/embed", {"inputs": many})
        alone = [post(server.url + "/embed", {"inputs": text}).json()[0] for text in many[::7]]
    assert whole.status_code == 200, whole.text[:300]
    np.testing.assert_array_equal(np.array(whole.json())[::7], np.array(alone))
