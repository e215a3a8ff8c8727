"""The clients people already use, unchanged, against real servers on 127.0.0.1: openai, huggingface_hub, cohere,
and TEI's documented routes. Every answer is compared with what /predict returns for the same inputs."""
from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.servers import Server, running

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Berlin is the capital of Germany.",
         "I loved this film, the acting was superb!", "Terrible service; I will never come back."]
KEY, SECOND_KEY = "test-key-1", "second-key-from-file"


def post(server: Server, path: str, body: Any, key: str | None = KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def embedder(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("embedder")
    (folder / "keys").write_text(f"{SECOND_KEY}\n")
    with running(minilm_fp32_artifact, folder / "server.log", "--api-key", KEY,
                 env={"INFINITY_API_KEY_FILE": str(folder / "keys")}) as server:
        yield server


@pytest.fixture(scope="module")
def ranker(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(artifact_for("ranking"), tmp_path_factory.mktemp("ranker") / "server.log",
                 env={"INFINITY_API_KEY": KEY}) as server:
        yield server


@pytest.fixture()
def hub_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub refuses every URL, loopback included, under HF_HUB_OFFLINE=1 (read at import)."""
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def predicted(server: Server, inputs: Any, **parameters: Any) -> Any:
    response = post(server, "/predict", {"inputs": inputs, "parameters": parameters})
    assert response.status_code == 200, response.text
    return response.json()


def test_openai_client_base64_default_float_and_dimensions(embedder: Server) -> None:
    import openai

    client = openai.OpenAI(base_url=embedder.url + "/v1", api_key=KEY, max_retries=0)
    expected = np.array(predicted(embedder, TEXTS))
    default = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)  # asks for base64
    np.testing.assert_allclose(np.array([d.embedding for d in default.data]), expected, atol=1e-6)
    assert [d.index for d in default.data] == [0, 1, 2, 3] and default.model == "sentence-transformers/all-MiniLM-L6-v2"
    assert default.usage.prompt_tokens == default.usage.total_tokens > len(TEXTS)
    floats = client.embeddings.create(model="m", input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, expected[0], atol=1e-6)
    short = np.array(client.embeddings.create(model="m", input=TEXTS, dimensions=64).data[1].embedding)
    assert short.shape == (64,)
    np.testing.assert_allclose(short, expected[1, :64] / np.linalg.norm(expected[1, :64]), atol=1e-6)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.embeddings.create(model="m", input=TEXTS[0], dimensions=385)
    assert "384" in too_many.value.body["message"]  # the error is in OpenAI's shape
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="m", input=[])


def test_openai_token_ids_are_openai_tokens_read_as_their_text(embedder: Server) -> None:
    """OpenAI's API defines token ids as the OpenAI model's tokens (cl100k_base): they answer their text's vector."""
    from infinity.api.openai import cl100k_base

    ids = [cl100k_base().encode(text) for text in TEXTS[:2]]
    answer = post(embedder, "/v1/embeddings", {"input": ids, "model": "m", "encoding_format": "float"}).json()
    np.testing.assert_array_equal([d["embedding"] for d in answer["data"]], predicted(embedder, TEXTS[:2]))
    assert answer["usage"]["prompt_tokens"] == sum(len(t) for t in post(embedder, "/tokenize",
                                                                        {"inputs": TEXTS[:2]}).json())
    one = post(embedder, "/v1/embeddings", {"input": ids[0], "model": "m", "encoding_format": "base64"}).json()
    vector = np.frombuffer(base64.b64decode(one["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(vector, np.asarray(predicted(embedder, TEXTS[0]), dtype=np.float32))
    for body, says in (({"input": [[101, 100257]]}, "token id 100257"),  # <|endoftext|>: a special token
                       ({"input": [101, 10 ** 9]}, "token id 1000000000"),
                       ({"input": [101] * 10_000}, "more than the maximum of 8192")):
        refused = post(embedder, "/v1/embeddings", {**body, "model": "m"})
        assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
        assert says in refused.json()["error"]["message"] and "cl100k_base" in refused.text, refused.text


def test_with_openai_token_ids_model_token_ids_are_the_models_own_run_as_given(minilm_fp32_artifact: Path,
                                                                               tmp_path: Path) -> None:
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--openai-token-ids", "model") as server:
        tokens = post(server, "/tokenize", {"inputs": TEXTS[:2]}, key=None).json()
        ids = [[token["id"] for token in text] for text in tokens]
        answer = post(server, "/v1/embeddings", {"input": ids, "model": "m", "encoding_format": "float"}, None).json()
        expected = post(server, "/predict", {"inputs": TEXTS[:2]}, None).json()
        np.testing.assert_allclose([d["embedding"] for d in answer["data"]], expected, atol=1e-5)
        outside = post(server, "/v1/embeddings", {"input": [[101, 10 ** 9]], "model": "m"}, None)
        assert outside.status_code == 400 and "check_embedding_ctx_length=False" in outside.text
        longest = httpx.get(server.url + "/info").json()["max_length"]
        for body in ({"input": [101] * 100_000}, {"input": [ids[0], [101] * (longest + 1)]}):
            too_long = post(server, "/v1/embeddings", {**body, "model": "m"}, None)
            assert too_long.status_code == 400, too_long.text  # a too-long input, as a text is, not too many inputs
            assert f"more than the maximum of {longest}" in too_long.json()["error"]["message"]


def test_openai_models_lists_the_one_model(embedder: Server) -> None:
    import openai

    client = openai.OpenAI(base_url=embedder.url + "/v1", api_key=KEY, max_retries=0)
    [model] = client.models.list().data
    assert model.id == post(embedder, "/v1/embeddings", {"input": "x"}).json()["model"]


def test_huggingface_hub_inference_client(embedder: Server, hub_online: None) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=embedder.url, token=KEY)
    np.testing.assert_allclose(client.feature_extraction(TEXTS[0]), predicted(embedder, TEXTS[0]), atol=1e-6)
    raw = client.feature_extraction(TEXTS[1], normalize=False, truncate=True)  # TEI-style top-level fields
    np.testing.assert_allclose(raw, predicted(embedder, TEXTS[1], normalize=False), atol=1e-5)
    similarity = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    vectors = np.array(predicted(embedder, TEXTS, normalize=True))
    np.testing.assert_allclose(similarity, vectors[1:] @ vectors[0], atol=1e-5)


def test_huggingface_hub_classification_clients(artifact_for: Any, tmp_path: Path, hub_online: None) -> None:
    from huggingface_hub import InferenceClient

    with running(artifact_for("sequence-classification"), tmp_path / "classifier.log") as server:
        client = InferenceClient(model=server.url)
        got = client.text_classification(TEXTS[2], top_k=2)
        want = predicted(server, TEXTS[2], top_k=2)
        assert [(g.label, round(g.score, 5)) for g in got] == [(w["label"], round(w["score"], 5)) for w in want]
        # TEI's /predict body: pairs as [text, text_pair] lists, raw_scores at the top level
        tei = post(server, "/predict", {"inputs": [[TEXTS[0], TEXTS[1]]], "raw_scores": True}).json()
        hf = predicted(server, [{"text": TEXTS[0], "text_pair": TEXTS[1]}], function_to_apply="none")
        assert tei == hf
    with running(artifact_for("token-classification"), tmp_path / "tagger.log") as server:
        text = "Angela Merkel visited the Acme factory in Berlin."
        entities = InferenceClient(model=server.url).token_classification(text)
        want = predicted(server, text)
        assert [(e.entity_group, e.word, e.start, e.end) for e in entities] == \
            [(w["entity_group"], w["word"], w["start"], w["end"]) for w in want]


def test_cohere_sdk_rerank_v1_and_v2(ranker: Server) -> None:
    import cohere

    query = "Where is Berlin?"
    want = predicted(ranker, {"query": query, "texts": TEXTS})
    v2 = cohere.ClientV2(base_url=ranker.url, api_key=KEY).rerank(model="m", query=query, documents=TEXTS, top_n=2)
    assert [(r.index, round(r.relevance_score, 5)) for r in v2.results] == \
        [(w["index"], round(w["score"], 5)) for w in want[:2]]
    v1 = cohere.Client(base_url=ranker.url, api_key=KEY).rerank(
        model="m", query=query, documents=[{"text": t} for t in TEXTS], return_documents=True)
    assert [r.index for r in v1.results] == [w["index"] for w in want]
    assert [r.document.text for r in v1.results] == [TEXTS[w["index"]] for w in want]


def test_tei_routes_in_tei_shapes(embedder: Server, ranker: Server) -> None:
    vectors = post(embedder, "/embed", {"inputs": TEXTS[0]}).json()
    np.testing.assert_allclose(vectors, [predicted(embedder, TEXTS[0])], atol=1e-6)  # always a list of vectors
    cut = post(embedder, "/embed", {"inputs": [TEXTS[0]], "dimensions": 8, "normalize": False}).json()
    np.testing.assert_allclose(cut[0], predicted(embedder, TEXTS[0], normalize=False)[:8], atol=1e-5)
    tokens = post(embedder, "/tokenize", {"inputs": "Hello world"}).json()
    assert [(t["text"], t["special"], t["start"]) for t in tokens[0]] == \
        [("[CLS]", True, None), ("Hello", False, 0), ("world", False, 6), ("[SEP]", True, None)]
    ids = [t["id"] for t in tokens[0]]
    assert post(embedder, "/decode", {"ids": ids}).json() == ["hello world"]
    assert post(embedder, "/decode", {"ids": [ids], "skip_special_tokens": False}).json() == ["[CLS] hello world [SEP]"]
    empty = post(embedder, "/embed", {"inputs": ["fine", " "]})
    assert empty.status_code == 400 and empty.json() == {"error": "inputs[1] is empty", "error_type": "empty"}

    query = "Where is Berlin?"
    ranked = post(ranker, "/rerank", {"query": query, "texts": TEXTS, "return_text": True}).json()
    want = predicted(ranker, {"query": query, "texts": TEXTS}, return_text=True)
    assert ranked == want and [r["text"] for r in ranked] == [TEXTS[r["index"]] for r in want]


def merged(body: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    return {**body, **{key: merged(body[key], value) if isinstance(value, dict) and key in body else value
                       for key, value in change.items()}}


LONG = "alpha " * 400


@pytest.mark.parametrize(("route", "body", "words"), [
    ("/predict", {"inputs": LONG, "parameters": {"truncate": False}}, "input 0 has 402 tokens"),
    ("/predict", {"inputs": ["short", LONG], "truncate": False}, "input 1 has 402 tokens"),
    ("/", {"inputs": LONG, "parameters": {"truncate": False}}, "input 0 has 402 tokens"),
    ("/embed", {"inputs": LONG, "truncate": False}, "input 0 has 402 tokens"),
    ("/v1/embed", {"texts": [LONG], "truncate": "NONE"}, "input 0 has 402 tokens"),
    ("/v2/embed", {"texts": [LONG], "truncate": "NONE", "model": "m", "input_type": "search_query",
                   "embedding_types": ["float"]}, "input 0 has 402 tokens"),
    ("/rerank", {"query": "Where?", "texts": ["short", LONG * 3], "truncate": False}, "input 1, a text pair, has"),
])
def test_a_too_long_input_is_told_the_field_its_own_api_cuts_it_with(embedder: Server, ranker: Server, route: str,
                                                                      body: dict[str, Any], words: str) -> None:
    server = ranker if route == "/rerank" else embedder
    refused = post(server, route, body)
    assert refused.status_code == 422, refused.text
    message = refused.json().get("error") or refused.json()["message"]
    assert words in message and "more than the model's maximum of" in message, message
    advice = message.split("or set ", 1)[1]  # a JSON member, to be pasted into the body as it stands
    answered = post(server, route, merged(body, orjson.loads("{" + advice + "}")))
    assert answered.status_code == 200, (advice, answered.text)


def test_truncation_direction_keeps_the_chosen_end(embedder: Server) -> None:
    long = "alpha " * 400 + "the end is here"
    right = predicted(embedder, long, truncation_direction="right")
    left = post(embedder, "/embed", {"inputs": long, "truncation_direction": "Left"}).json()[0]
    tail = post(embedder, "/embed", {"inputs": "alpha " * 250 + "the end is here"}).json()[0]
    assert np.dot(left, tail) > np.dot(right, tail)


def test_routes_of_another_task_are_404_in_their_own_shape(embedder: Server, ranker: Server) -> None:
    rerank = post(embedder, "/v1/rerank", {"query": "q", "documents": ["d"]})
    assert rerank.status_code == 404
    assert rerank.json()["message"] == "/v1/rerank needs a ranking model; this server runs feature-extraction"
    embeddings = post(ranker, "/v1/embeddings", {"input": "x"})
    assert embeddings.status_code == 404 and "this server runs ranking" in embeddings.json()["error"]["message"]
    assert post(ranker, "/embed", {"inputs": "x"}).json()["error_type"] == "not_found"


def test_api_keys(embedder: Server) -> None:
    for key in (None, "wrong-key", KEY[:-1]):
        refused = post(embedder, "/v1/embeddings", {"input": "x"}, key=key)
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
        assert refused.json()["error"]["type"] == "authentication_error"  # OpenAI's shape on OpenAI's route
        assert post(embedder, "/predict", {"inputs": "x"}, key=key).json()["error_type"] == "unauthorized"
    for key in (KEY, SECOND_KEY):
        assert post(embedder, "/predict", {"inputs": "x"}, key=key).status_code == 200
    azure = httpx.post(embedder.url + "/v1/embeddings", json={"input": "x"}, headers={"api-key": KEY}, timeout=60)
    assert azure.status_code == 200
    for path in ("/health/live", "/health/ready", "/health"):
        assert httpx.get(embedder.url + path, timeout=60).status_code == 200
    for path in ("/metrics", "/info", "/openapi.json", "/v1/models"):
        assert httpx.get(embedder.url + path, timeout=60).status_code == 401
        assert httpx.get(embedder.url + path, headers={"authorization": f"Bearer {KEY}"}, timeout=60).status_code == 200
    log = embedder.log.read_text()
    assert KEY not in log and SECOND_KEY not in log and "wrong-key" not in log


def test_metrics_are_labelled_by_route(embedder: Server) -> None:
    post(embedder, "/embed", {"inputs": "counted"})
    text = httpx.get(embedder.url + "/metrics", headers={"authorization": f"Bearer {KEY}"}, timeout=60).text
    assert 'infinity_requests_total{route="/embed",status="200"}' in text
    assert 'infinity_request_duration_seconds_count{route="/embed"}' in text


def test_the_openapi_document_agrees_with_the_server(embedder: Server) -> None:
    """Each body is judged by the published schema and by the server; the two verdicts must match."""
    import jsonschema

    spec = httpx.get(embedder.url + "/openapi.json", headers={"authorization": f"Bearer {KEY}"}, timeout=60).json()
    bodies = {
        "/predict": [{"inputs": "ok"}, {"inputs": ""}, {"inputs": " "}, {"inputs": ["a"] * 513},
                     {"inputs": ["a"] * 512},
                     {"inputs": "x", "options": {"wait_for_model": True}}, {"inputs": "x", "extra": 1},
                     {"inputs": "x", "parameters": {"normalize": "yes"}}, {"inputs": "x", "normalize": False},
                     {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
                     {"inputs": "x", "parameters": {"prompt_name": "query"}}],  # MiniLM has no prompts
        "/v1/embeddings": [{"input": "x"}, {"input": [1, 2]}, {"input": [[-1]]}, {"input": "x", "dimensions": 0},
                           {"input": "x", "encoding_format": "hex"}, {"input": ["x"], "user": "u", "model": "m"},
                           {"input": "x", "prompt_name": "query"}],
        "/embed": [{"inputs": ["a", "b"]}, {"inputs": 3}, {"inputs": "a", "truncation_direction": "Left"}],
        "/tokenize": [{"inputs": "a"}, {"inputs": "a", "add_special_tokens": "no"}],
        "/decode": [{"ids": [101, 102]}, {"ids": [[101], [102]]}, {"ids": "101"}],
    }
    for path, cases in bodies.items():
        schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        for body in cases:
            documented = jsonschema.Draft4Validator(schema).is_valid(body)
            status = post(embedder, path, body).status_code
            assert documented == (status == 200), (path, body, status)
    assert {"/predict", "/", "/v1/embeddings", "/embeddings", "/embed", "/tokenize", "/decode", "/v1/models",
            "/health/ready", "/metrics", "/openapi.json"} <= set(spec["paths"])
    assert "/rerank" not in spec["paths"] and "bearer" in spec["components"]["securitySchemes"]
    guarded = [op for ops in spec["paths"].values() for op in ops.values() if "security" in op]
    assert guarded and all("401" in op["responses"] for op in guarded)
    assert "401" in spec["paths"]["/predict"]["post"]["responses"]
