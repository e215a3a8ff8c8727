"""infinity.Model, the engine in-process: for every task the suite builds, its answers equal what a real server's
/predict answers over HTTP for the same texts and options, bit for bit; a list longer than one request is cut,
sorted and answered in the order sent; the async calls answer alike; a closed model answers nothing."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from infinity import Model
from infinity.errors import EmptyInput, ValidationError
from infinity.manifest import Manifest
from tests.servers import Server, running

SHORT = ["What is the capital of France?", "Paris is the capital and largest city of France.", "rivet",
         "Der Zug nach Hamburg hat heute vierzig Minuten Verspätung."]
LONG = " ".join(f"Sentence {i} says something about topic {i % 7} and its neighbour {i % 5}." for i in range(160))
TEXTS = [*SHORT, LONG]
QUERY = "Where is Paris?"


def predict(server: Server, inputs: Any, params: dict[str, Any]) -> Any:
    response = httpx.post(server.url + "/predict", json={"inputs": inputs, "parameters": params}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def same(a: Any, b: Any) -> bool:
    return np.array_equal(np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32))


@pytest.fixture(scope="module")
def pair(request: pytest.FixtureRequest, artifact_for: Any, minilm_fp32_artifact: Path, minilm_int8_artifact: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Model]]:
    """A server and a Model of one artifact, by (task, precision, source model)."""
    task, precision, model = request.param
    artifact = {("minilm", "fp32"): minilm_fp32_artifact, ("minilm", "int8"): minilm_int8_artifact}.get(
        (model, precision)) or artifact_for(task, precision, model=model)
    args = () if Manifest.load(artifact).parity.passed else ("--allow-failed-parity",)
    log = tmp_path_factory.mktemp("server") / "server.log"
    with running(artifact, log, *args) as server, Model(artifact, threads=1, allow_failed_parity=bool(args)) as local:
        yield server, local


def cases(*specs: tuple[str, str, str]) -> Any:
    return pytest.mark.parametrize("pair", specs, indirect=True, ids=lambda spec: "/".join(spec))


EMBEDDING_CASES = [{}, {"dimensions": 8}, {"normalize": False}, {"precision": "ubinary"}, {"precision": "int8"},
                   {"truncation_direction": "left"}]


@cases(("feature-extraction", "fp32", "minilm"), ("feature-extraction", "int8", "minilm"),
       ("feature-extraction", "fp32", "gemma3-tiny"))
def test_dense_vectors_equal_predicts(pair: tuple[Server, Model]) -> None:
    server, model = pair
    prompts = [{"prompt_name": name} for name in model.manifest.task.prompts]
    chunking = [{"chunking": True}] if model.operation.task.windowed else []
    for params in [*EMBEDDING_CASES, *prompts, *chunking]:
        if params.get("precision") == "int8" and not model.manifest.task.embedding_ranges:
            continue
        vectors = model.embed(TEXTS, **params)
        assert isinstance(vectors, np.ndarray) and vectors.shape[0] == len(TEXTS)
        assert same(vectors, predict(server, TEXTS, params)), params
    assert same(model.embed(SHORT[0]), predict(server, SHORT[0], {}))  # a single text: its vector


@cases(("sparse-embedding", "fp32", "splade-tiny"), ("sparse-embedding", "int8", "splade-tiny"))
def test_sparse_vectors_equal_predicts(pair: tuple[Server, Model]) -> None:
    server, model = pair
    for params in [{}, {"top_k": 5}, {"threshold": 0.5}, {"chunking": True}]:
        got, expected = model.embed_sparse(TEXTS, **params), predict(server, TEXTS, params)
        for vector, entries in zip(got, expected, strict=True):
            assert vector.indices.tolist() == [e["index"] for e in entries]
            assert same(vector.values, [e["value"] for e in entries]), params


@cases(("multi-vector", "fp32", "colbert-tiny"))
def test_token_vectors_equal_predicts(pair: tuple[Server, Model]) -> None:
    server, model = pair
    for params in [{}, {"input_type": "query"}, {"input_type": "document", "chunking": True}]:
        got, expected = model.embed_tokens(TEXTS, **params), predict(server, TEXTS, params)
        assert len(got) == len(expected) and all(same(g, e) for g, e in zip(got, expected)), params


@cases(("hybrid-embedding", "fp32", "m3-tiny"))
def test_bge_m3_heads_equal_predicts(pair: tuple[Server, Model]) -> None:
    server, model = pair
    whole = predict(server, TEXTS, {})
    for heads, expected in zip(model.embed_hybrid(TEXTS), whole, strict=True):
        assert same(heads.dense, expected["dense"]) and same(heads.colbert, expected["colbert"])
        assert heads.sparse is not None and heads.sparse.indices.tolist() == [e["index"] for e in expected["sparse"]]
    assert same(model.embed(TEXTS, dimensions=8), [a["dense"] for a in predict(server, TEXTS, {"dimensions": 8})])
    sparse = model.embed_sparse(TEXTS, top_k=3)
    assert [v.indices.tolist() for v in sparse] == [[e["index"] for e in a["sparse"]]
                                                   for a in predict(server, TEXTS, {"top_k": 3, "outputs": ["sparse"]})]


@cases(("ranking", "fp32", "ranking"), ("ranking", "fp32", "qwen3-reranker-tiny"))
def test_rankings_equal_predicts(pair: tuple[Server, Model]) -> None:
    server, model = pair
    instruction = [{"instruction": "Find the city's country"}] if model.manifest.task.reranker else []
    for params in [{}, {"top_n": 2, "return_text": True}, {"raw_scores": True}, {"max_tokens_per_doc": 8},
                   {"chunking": True}, *instruction]:
        ranked = model.rerank(QUERY, TEXTS, **params)
        expected = predict(server, {"query": QUERY, "texts": TEXTS}, params)
        assert [i for i, _ in ranked.best()] == [item["index"] for item in expected], params
        assert same([s for _, s in ranked.best()], [item["score"] for item in expected]), params
        assert ranked.texts is None or [ranked.texts[i] for i in ranked.order] == [item["text"] for item in expected]


@cases(("sequence-classification", "fp32", "sequence-classification"))
def test_labels_equal_predicts(pair: tuple[Server, Model]) -> None:
    server, model = pair
    inputs: list[Any] = [*TEXTS, (SHORT[0], SHORT[1])]
    body = [*TEXTS, {"text": SHORT[0], "text_pair": SHORT[1]}]
    for params in [{}, {"top_k": 1}, {"function_to_apply": "none"}]:
        assert model.classify(inputs, **params).best() == predict(server, body, params), params
    assert model.classify(SHORT[0]).best() == [predict(server, SHORT[0], {})]


@cases(("token-classification", "fp32", "token-classification"))
def test_entities_equal_predicts(pair: tuple[Server, Model]) -> None:
    server, model = pair
    for params in [{}, {"aggregation_strategy": "none", "ignore_labels": []}]:
        assert model.tag(TEXTS, **params) == predict(server, TEXTS, params), params


def test_a_long_list_is_cut_sorted_and_answered_in_order(minilm_int8_artifact: Path) -> None:
    """1,500 texts of mixed lengths as requests of 64: every vector is the text's own, as it is embedded alone."""
    words = LONG.split()
    texts = [" ".join(words[i % 97:(i % 97) + 1 + (i * 7) % 60]) for i in range(1500)]
    with Model(minilm_int8_artifact, threads=1, max_inputs_per_request=64) as model:
        vectors = model.embed(texts)
        assert vectors.shape == (1500, model.manifest.task.embedding_dim)
        for i in (0, 1, 63, 64, 700, 1499):
            assert np.array_equal(vectors[i], model.embed(texts[i])), i
        assert model.usage.inputs == 1500 + 6 and model.usage.tokens > 1500
    # two engines side by side, one thread each: the same vectors, bit for bit (an INT8 graph's rows do not change
    # with their batch, and each batch runs whole on one engine)
    with Model(minilm_int8_artifact, threads=2, engines=2, max_inputs_per_request=64) as model:
        assert repr(model).endswith("2 threads, 2 engines)")
        assert np.array_equal(model.embed(texts), vectors)


def test_async_calls_answer_as_the_sync_ones_do(minilm_fp32_artifact: Path) -> None:
    with Model(minilm_fp32_artifact, threads=1) as model:
        async def both() -> list[np.ndarray]:
            return list(await asyncio.gather(model.aembed(TEXTS), model.aembed(SHORT, dimensions=8)))

        whole, cut = asyncio.run(both())
        assert np.array_equal(whole, model.embed(TEXTS)) and np.array_equal(cut, model.embed(SHORT, dimensions=8))


def test_mistakes_are_refused_in_one_line_and_a_closed_model_answers_nothing(minilm_fp32_artifact: Path) -> None:
    before = set(threading.enumerate())
    model = Model(minilm_fp32_artifact, threads=1)
    with pytest.raises(ValidationError, match="rerank needs a ranking model; this artifact serves feature-extraction"):
        model.rerank(QUERY, TEXTS)
    with pytest.raises(EmptyInput, match="input 1 is empty"):
        model.embed(["text", " \u200b"])
    with pytest.raises(ValidationError, match="dimensions must be at most"):
        model.embed(TEXTS, dimensions=100_000)
    with pytest.raises(ValidationError, match="unknown prompt_name|this model has no prompts"):
        model.embed(TEXTS, prompt_name="nope")
    with pytest.raises(ValueError, match="max_bach_size"):
        Model(minilm_fp32_artifact, max_bach_size=8)
    with pytest.raises(ValueError, match=r"engines \(3\) must be at most threads \(2\)"):
        Model(minilm_fp32_artifact, threads=2, engines=3)
    model.embed(TEXTS)
    own = set(threading.enumerate()) - before  # its event loop, engine thread and tokenizer workers
    assert {t.name for t in own} >= {"infinity-model", "infinity-engine"}
    model.close()
    assert not any(t.is_alive() for t in own)
    with pytest.raises(RuntimeError, match="closed"):
        model.embed(TEXTS)
    model.close()  # twice is once
