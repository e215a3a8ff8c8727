"""Multi-vector embeddings (ColBERT): a MultiVectorEncoder directory optimized and served on /embed_all and
/predict, each query's and document's token vectors against sentence-transformers' MultiVectorEncoder in PyTorch
FP32, alone and batched, fp32 and INT8."""
from __future__ import annotations

import json
import shutil
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import pytest

from bench.inprocess import predict
from infinity.engine.model import LoadedModel
from infinity.engine.tokenization import Encoded, pad_batch
from infinity.manifest import Manifest
from infinity.tasks.multi_vector import expanded
from optimize.stages.s1_load import load_source
from tests.servers import Server, running

QUERIES = ["what is late interaction?", "ok", "Who wrote 'Hamlet', and when?",
           " ".join(["a query far longer than the expansion length"] * 6)]  # cut to 32 tokens, as ColBERT cuts it
DOCUMENTS = ["ColBERT scores a query against a document token by token.", "Shakespeare wrote Hamlet (c. 1600)!",
             "x", " ".join(["antidisestablishmentarianism lantern harbor"] * 60)]  # past document_length: cut


def encoder(source: Path, **expansion: Any) -> Any:
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(source), device="cpu")
    if expansion:
        model[0].query_expansion = expansion
    return model


@pytest.fixture(scope="module")
def colbert_dir(artifacts: Any) -> Path:
    return Path(artifacts.source("colbert-tiny"))


@pytest.fixture(scope="module")
def reference(colbert_dir: Path) -> dict[str, list[np.ndarray]]:
    model = encoder(colbert_dir)
    return {"query": [v.numpy() for v in model.encode_query(QUERIES)],
            "document": [v.numpy() for v in model.encode_document(DOCUMENTS)]}


@pytest.fixture(scope="module")
def server(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(artifact_for("multi-vector"), tmp_path_factory.mktemp("colbert") / "server.log") as server:
        yield server


def embed_all(server: Server, inputs: Any, **fields: Any) -> Any:
    response = httpx.post(server.url + "/embed_all", json={"inputs": inputs, **fields}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_manifest_carries_the_models_rules(artifact_for: Any, colbert_dir: Path) -> None:
    manifest = Manifest.load(artifact_for("multi-vector"))
    tokenizer = load_source(str(colbert_dir), "multi-vector").tokenizer
    rules = manifest.task.multi_vector
    assert manifest.source.task == "multi-vector" and manifest.task.embedding_dim == 48 and manifest.task.normalize
    assert rules is not None and rules.document_length == 180 and rules.skiplist_roles == ["document"]
    assert rules.skiplist_ids == sorted({tokenizer.convert_tokens_to_ids(c) for c in string.punctuation})
    assert rules.expansion is not None and rules.expansion.token_id == tokenizer.mask_token_id
    assert (rules.expansion.strategy, rules.expansion.length, rules.expansion.attend) == ("fixed", 32, False)
    assert manifest.task.prompts == {"query": "query: ", "document": "document: "}
    assert manifest.parity.passed and manifest.parity.reference.startswith("sentence-transformers MultiVectorEncoder")
    assert manifest.parity.batch_invariance["max_abs_diff"] == 0.0


@pytest.mark.parametrize("role", ["query", "document"])
def test_embed_all_answers_the_encoders_vectors_alone_and_batched(server: Server, role: str,
                                                                 reference: dict[str, list[np.ndarray]]) -> None:
    texts = QUERIES if role == "query" else DOCUMENTS
    batched = embed_all(server, texts, input_type=role)
    alone = [embed_all(server, text, input_type=role)[0] for text in texts]
    assert batched == alone  # not merely close: an answer never depends on its batch
    for served, expected in zip(batched, reference[role]):
        served = np.asarray(served)
        assert served.shape == expected.shape
        assert np.abs(served - expected).max() < 1e-4
    if role == "query":  # every query is its expansion length: short ones filled, long ones cut
        assert {len(vectors) for vectors in batched} == {32}
    else:  # the skiplist drops punctuation; the long document is cut to the document length first
        assert len(batched[1]) < len(batched[0]) and len(batched[3]) < 180


def test_predict_answers_documents_by_default_and_queries_when_asked(server: Server) -> None:
    documents = embed_all(server, DOCUMENTS[:2])
    assert httpx.post(server.url + "/predict", json={"inputs": DOCUMENTS[:2]}, timeout=60).json() == documents
    assert httpx.post(server.url + "/predict", json={"inputs": DOCUMENTS[0]}, timeout=60).json() == documents[0]
    query = httpx.post(server.url + "/predict", json={"inputs": QUERIES[0], "parameters": {"input_type": "query"}},
                       timeout=60).json()
    assert query == embed_all(server, QUERIES[0], input_type="query")[0] and len(query) == 32


def test_answers_match_their_published_schema(server: Server) -> None:
    spec = httpx.get(server.url + "/openapi.json", timeout=60).json()
    for path, body in (("/embed_all", {"inputs": DOCUMENTS[:2], "input_type": "document"}),
                       ("/predict", {"inputs": QUERIES[0], "parameters": {"input_type": "query"}}),
                       ("/predict", {"inputs": DOCUMENTS[:2]})):
        schema = spec["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        jsonschema.Draft4Validator(schema).validate(httpx.post(server.url + path, json=body, timeout=60).json())


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"inputs": "x", "input_type": "passage"}, 422, "input_type must be one of query, document"),
    ({"inputs": QUERIES[3], "input_type": "query", "truncate": False}, 422, "more than the maximum of 32 for a query"),
    ({"inputs": []}, 400, "inputs"),
])
def test_bad_requests_are_refused_in_one_line(server: Server, body: dict[str, Any], status: int, words: str) -> None:
    response = httpx.post(server.url + "/embed_all", json=body, timeout=60)
    assert response.status_code == status and words in response.json()["error"], response.text


def test_dense_routes_say_what_a_multi_vector_server_runs(server: Server) -> None:
    refused = httpx.post(server.url + "/embed", json={"inputs": "x"}, timeout=60)
    assert refused.status_code == 404 and "needs a feature-extraction model" in refused.json()["error"]
    assert httpx.post(server.url + "/embed_sparse", json={"inputs": "x"}, timeout=60).status_code == 404


@pytest.mark.parametrize(("strategy", "attend"), [("fixed", True), ("min", False), ("min", True)])
def test_each_query_expansion_runs_as_the_encoder_runs_it(artifact_for: Any, colbert_dir: Path, tmp_path: Path,
                                                         strategy: str, attend: bool) -> None:
    """The same graph with the manifest's expansion changed: queries are built as sentence-transformers builds
    them for each strategy, the filler read by the model or not."""
    artifact = tmp_path / "artifact"
    shutil.copytree(artifact_for("multi-vector"), artifact)
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["task"]["multi_vector"]["expansion"].update(strategy=strategy, attend=attend)
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    model = LoadedModel.load(artifact)
    expected = encoder(colbert_dir, strategy=strategy, attend=attend, length=32).encode_query(QUERIES)
    served = predict(model, QUERIES, {"input_type": "query"})
    for vectors, reference in zip(served, expected):
        assert vectors.shape == reference.shape and np.abs(vectors - reference.numpy()).max() < 1e-4
    assert len(served[3]) > 32 if strategy == "min" else len(served[3]) == 32


def test_the_filler_is_attended_only_where_the_expansion_says() -> None:
    from infinity.manifest import QueryExpansion

    item = Encoded(ids=[101, 7, 102], type_ids=[0] * 3, offsets=[(0, 0)] * 3, special=[1, 0, 1])
    for attend, attended in ((False, 3), (True, 5)):
        filled = expanded(item, QueryExpansion("fixed", attend, token_id=103, length=5))
        batch = pad_batch([filled, item], pad_id=0)
        assert batch.input_ids[0].tolist() == [101, 7, 102, 103, 103]
        assert batch.attention_mask.tolist() == [[1] * attended + [0] * (5 - attended), [1, 1, 1, 0, 0]]


def test_the_int8_artifact_passes_multi_vector_parity_batch_invariant(artifact_for: Any,
                                                                      reference: dict[str, list[np.ndarray]]) -> None:
    artifact = artifact_for("multi-vector", "int8")
    manifest = Manifest.load(artifact)
    assert manifest.model.precision == "int8" and manifest.parity.passed
    metrics = manifest.parity.metrics
    assert metrics["token_cosine_mean"] >= 0.99 and metrics["maxsim_spearman_mean"] >= 0.95
    assert manifest.parity.batch_invariance["max_abs_diff"] == 0.0
    served = predict(LoadedModel.load(artifact), QUERIES, {"input_type": "query"})  # queries: not in the parity run
    for vectors, expected in zip(served, reference["query"]):
        assert vectors.shape == expected.shape and float((vectors * expected).sum(axis=1).min()) > 0.98


@pytest.mark.parametrize(("task", "words"), [
    ("feature-extraction", "pass --task multi-vector"),
    ("sparse-embedding", "sparse-embedding reads a SparseEncoder"),
])
def test_a_colbert_model_asked_for_the_wrong_thing_is_refused_in_one_line(colbert_dir: Path, task: str,
                                                                         words: str) -> None:
    with pytest.raises(ValueError, match=words):
        load_source(str(colbert_dir), task)


def test_a_model_without_multi_vector_modules_is_refused(tmp_path: Path, colbert_dir: Path) -> None:
    from tests.models import minilm_dir

    with pytest.raises(ValueError, match="not a multi-vector model"):
        load_source(str(minilm_dir()), "multi-vector")
    pylate = tmp_path / "pylate"
    shutil.copytree(colbert_dir, pylate)
    (pylate / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "ColBERT"}))
    with pytest.raises(ValueError, match="PyLate ColBERT save; load it with sentence-transformers"):
        load_source(str(pylate), "multi-vector")
