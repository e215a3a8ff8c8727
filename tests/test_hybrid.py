"""Hybrid embeddings (bge-m3): a directory laid out as bge-m3 is published optimized into one graph for its three
heads, served on /predict (all three from one request) and on the dense, sparse and token routes, each head
against bge-m3's reference formulas in PyTorch FP32, alone and batched, fp32 and INT8."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import pytest

from infinity.manifest import Manifest
from optimize.stages.s1_load import load_source
from tests.servers import Server, running

TEXTS = ["What is BGE M3?", "Dense, sparse and multi-vector retrieval from one model: dense, sparse, dense.",
         "ok", " ".join(["lantern harbor"] * 200)]  # past the maximum length: truncated


@pytest.fixture(scope="module")
def m3_dir(artifacts: Any) -> Path:
    return Path(artifacts.source("m3-tiny"))


def m3_heads(m3_dir: Path) -> tuple[Any, Callable[[list[int]], dict[str, Any]]]:
    """(tokenizer, one pass): bge-m3's reference formulas over one sequence of token ids, written out here apart
    from the optimizer's reference: the first token's hidden state (dense, once normalized); sparse =
    relu(sparse_linear) per token, each id's largest weight, without the cls, eos, pad and unk ids; colbert =
    colbert_linear of every token but the first, normalized."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(m3_dir)
    model = AutoModel.from_pretrained(m3_dir).eval()
    linear = {}
    for name, size in (("colbert_linear", 384), ("sparse_linear", 1)):
        linear[name] = torch.nn.Linear(384, size)
        linear[name].load_state_dict(torch.load(m3_dir / f"{name}.pt", weights_only=True))
    unused = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}

    def one_pass(ids: list[int]) -> dict[str, Any]:
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            weights = torch.relu(linear["sparse_linear"](hidden))[:, 0].tolist()
            colbert = torch.nn.functional.normalize(linear["colbert_linear"](hidden[1:]), dim=-1).numpy()
        sparse: dict[int, float] = {}
        for token, weight in zip(ids, weights):
            if token not in unused and weight > 0:
                sparse[token] = max(sparse.get(token, 0.0), weight)
        return {"first": hidden[0].double().numpy(), "sparse": sparse, "colbert": colbert}

    return tokenizer, one_pass


@pytest.fixture(scope="module")
def formulas(m3_dir: Path) -> list[dict[str, Any]]:
    tokenizer, one_pass = m3_heads(m3_dir)
    answers = []
    for text in TEXTS:
        heads = one_pass(tokenizer(text, truncation=True, max_length=256)["input_ids"])
        first = heads.pop("first")
        heads["dense"] = first / np.linalg.norm(first)
        answers.append(heads)
    return answers


@pytest.fixture(scope="module")
def server(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(artifact_for("hybrid-embedding"), tmp_path_factory.mktemp("m3") / "server.log") as server:
        yield server


def post(server: Server, path: str, body: dict[str, Any]) -> Any:
    response = httpx.post(server.url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_manifest_says_where_each_head_is(artifact_for: Any) -> None:
    manifest = Manifest.load(artifact_for("hybrid-embedding"))
    hybrid = manifest.task.hybrid
    assert manifest.source.task == "hybrid-embedding" and hybrid is not None
    assert (hybrid.hidden_size, hybrid.colbert_dim, hybrid.unused_ids) == (384, 384, [0, 100, 101])
    assert manifest.task.pooling == "cls" and manifest.task.normalize and manifest.task.embedding_ranges
    assert manifest.parity.passed and manifest.parity.reference.startswith("bge-m3's formulas")
    assert manifest.parity.batch_invariance["max_abs_diff"] == 0.0


def test_one_request_answers_all_three_heads_as_the_formulas_alone_and_batched(
        server: Server, formulas: list[dict[str, Any]]) -> None:
    batched = post(server, "/predict", {"inputs": TEXTS})
    alone = [post(server, "/predict", {"inputs": text}) for text in TEXTS]
    assert batched == alone  # not merely close: an answer never depends on its batch
    assert sum(len(answer["sparse"]) for answer in batched) > 10  # relu leaves some weights, not all
    for served, expected in zip(batched, formulas):
        assert set(served) == {"dense", "sparse", "colbert"}
        assert np.abs(np.asarray(served["dense"]) - expected["dense"]).max() < 1e-4
        assert [entry["index"] for entry in served["sparse"]] == sorted(expected["sparse"])
        assert all(abs(entry["value"] - expected["sparse"][entry["index"]]) < 1e-4 for entry in served["sparse"])
        colbert = np.asarray(served["colbert"])
        assert colbert.shape == expected["colbert"].shape and np.abs(colbert - expected["colbert"]).max() < 1e-4


def test_each_heads_own_route_answers_what_predict_answers(server: Server) -> None:
    whole = post(server, "/predict", {"inputs": TEXTS[:2]})
    assert post(server, "/embed", {"inputs": TEXTS[:2]}) == [answer["dense"] for answer in whole]
    openai = post(server, "/v1/embeddings", {"input": TEXTS[:2]})["data"]
    assert np.abs(np.asarray([d["embedding"] for d in openai]) - [a["dense"] for a in whole]).max() < 1e-6
    assert post(server, "/embed_sparse", {"inputs": TEXTS[:2]}) == [answer["sparse"] for answer in whole]
    assert post(server, "/embed_all", {"inputs": TEXTS[:2]}) == [answer["colbert"] for answer in whole]
    only = post(server, "/predict", {"inputs": TEXTS[1], "parameters": {"outputs": ["sparse"], "top_k": 3}})
    largest = sorted(whole[1]["sparse"], key=lambda entry: -entry["value"])[:3]
    assert only == {"sparse": sorted(largest, key=lambda entry: entry["index"])}


def test_answers_match_their_published_schema(server: Server) -> None:
    spec = httpx.get(server.url + "/openapi.json", timeout=60).json()
    for path, body in (("/predict", {"inputs": TEXTS[0]}), ("/predict", {"inputs": TEXTS[:2]}),
                       ("/embed_sparse", {"inputs": TEXTS[:2]}), ("/embed_all", {"inputs": TEXTS[:2]}),
                       ("/embed", {"inputs": TEXTS[:2]})):
        schema = spec["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        jsonschema.Draft4Validator(schema).validate(post(server, path, body))


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"inputs": "x", "parameters": {"outputs": ["lexical"]}}, 422, "outputs[0] must be one of dense, sparse, colbert"),
    ({"inputs": "x", "parameters": {"outputs": []}}, 400, "outputs is empty"),
    ({"inputs": "x", "parameters": {"top_k": 0}}, 422, "top_k must be at least 1"),
])
def test_bad_parameters_are_refused_in_one_line(server: Server, body: dict[str, Any], status: int,
                                               words: str) -> None:
    response = httpx.post(server.url + "/predict", json=body, timeout=60)
    assert response.status_code == status and words in response.json()["error"], response.text


def test_the_int8_artifact_passes_each_heads_parity_batch_invariant(artifact_for: Any) -> None:
    manifest = Manifest.load(artifact_for("hybrid-embedding", "int8"))
    metrics = manifest.parity.metrics
    assert manifest.model.precision == "int8" and manifest.parity.passed
    assert metrics["dense_cosine_min"] >= 0.99 and metrics["colbert_token_cosine_mean"] >= 0.99
    assert metrics["sparse_cosine_mean"] >= 0.99 and metrics["sparse_dot_spearman_mean"] >= 0.95
    assert manifest.parity.batch_invariance["max_abs_diff"] == 0.0


def test_a_model_without_the_m3_heads_is_refused_and_an_m3_model_serves_dense_alone(m3_dir: Path) -> None:
    from tests.models import minilm_dir

    with pytest.raises(ValueError, match="has no colbert_linear.pt or sparse_linear.pt"):
        load_source(str(minilm_dir()), "hybrid-embedding")
    dense = load_source(str(m3_dir), "feature-extraction")
    assert dense.facts.hybrid is None and dense.facts.pooling == "cls"
