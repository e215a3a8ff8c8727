"""Ranking with a causal LM (Qwen3-Reranker's shape): its prompt around each pair, the log-odds of "yes" over "no"
at the last token, served on /rerank, /predict and the cohere client, against the model card's formula in
PyTorch FP32."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from infinity.manifest import Manifest
from optimize.stages.s1_load import load_source
from optimize.stages.s4_reference import torch_reference
from optimize.tasks.ranking import RERANKERS
from tests.servers import Server, running

QUERY = "What is the capital of France?"
# the last text outruns the maximum length: it is cut, the prompt around it kept
TEXTS = ["Paris is the capital and most populous city of France.", "I like turtles.",
         "Berlin is the capital of Germany.", "ok", " ".join(["lantern harbor"] * 400)]


@pytest.fixture(scope="module")
def source_dir(artifacts: Any) -> Path:
    return Path(artifacts.source("qwen3-reranker-tiny"))


@pytest.fixture(scope="module")
def artifact(artifact_for: Any) -> Path:
    return Path(artifact_for("ranking", "fp32", model="qwen3-reranker-tiny"))


@pytest.fixture(scope="module")
def server(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(artifact, tmp_path_factory.mktemp("reranker") / "server.log") as started:
        yield started


@pytest.fixture(scope="module")
def reference(source_dir: Path) -> np.ndarray:
    source = load_source(str(source_dir), "ranking", reranker="qwen3")
    return np.array(torch_reference(source, [(QUERY, text) for text in TEXTS]), dtype=np.float64)


def test_the_manifest_carries_the_prompt_and_the_answer_tokens(artifact: Path) -> None:
    manifest = Manifest.load(artifact)
    reranker = manifest.task.reranker
    assert reranker is not None and manifest.source.model_type == "qwen3"
    assert {name: getattr(reranker, name) for name in RERANKERS["qwen3"]} == RERANKERS["qwen3"]
    assert (reranker.true_token_id, reranker.false_token_id) != (None, None)
    assert manifest.parity.passed and manifest.parity.metrics["max_score_diff"] < 1e-4
    assert manifest.parity.batch_invariance["max_abs_diff"] == 0.0
    assert list(manifest.model.outputs) == ["logits"] and manifest.model.outputs["logits"][0] == "batch"


def test_scores_match_the_model_card_formula_on_every_route(server: Server, reference: np.ndarray) -> None:
    import cohere

    assert reference.std() > 0.01  # the scores spread: an order to agree on
    ranked = httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": TEXTS}, timeout=60).json()
    scores = np.zeros(len(TEXTS))
    for entry in ranked:
        scores[entry["index"]] = entry["score"]
    np.testing.assert_allclose(scores, reference, atol=1e-4)
    predicted = httpx.post(server.url + "/predict", json={"inputs": {"query": QUERY, "texts": TEXTS}},
                           timeout=60).json()
    assert predicted == ranked
    for text, score in zip(TEXTS, scores):  # alone, each the same as in the batch
        alone = httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": [text]}, timeout=60).json()
        assert alone[0]["score"] == score
    v2 = cohere.ClientV2(base_url=server.url, api_key="unused").rerank(model="m", query=QUERY, documents=TEXTS)
    assert [(r.index, r.relevance_score) for r in v2.results] == [(r["index"], r["score"]) for r in ranked]


def test_a_causal_lm_is_never_ranked_with_a_guessed_prompt(source_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a causal language model: ranking with it needs its prompt; pass "
                                         "--reranker-template"):
        load_source(str(source_dir), "ranking")
    bad = tmp_path / "template.json"
    bad.write_text(json.dumps({**RERANKERS["qwen3"], "template": "{query} {passage}"}))
    with pytest.raises(ValueError, match="may name only {instruction}, {query} and {document}"):
        load_source(str(source_dir), "ranking", reranker=str(bad))
    bad.write_text(json.dumps({**RERANKERS["qwen3"], "true_token": "absolutely"}))
    with pytest.raises(ValueError, match="true_token 'absolutely' is not one token"):
        load_source(str(source_dir), "ranking", reranker=str(bad))
    with pytest.raises(ValueError, match="neither qwen3 nor a JSON file"):
        load_source(str(source_dir), "ranking", reranker="llama")


def test_int8_and_other_models_say_what_to_pass(source_dir: Path, artifacts: Any, tmp_path: Path) -> None:
    from optimize.options import OptimizeOptions
    from optimize.pipeline import optimize

    with pytest.raises(ValueError, match="INT8 is not built for causal rerankers yet: pass --precision fp32"):
        optimize(OptimizeOptions(model=str(source_dir), task="ranking", out=tmp_path / "int8",
                                 reranker_template="qwen3"), log=lambda _: None)
    with pytest.raises(ValueError, match="--reranker-template is for ranking with a causal language model"):
        load_source(str(artifacts.source("ranking")), "ranking", reranker="qwen3")


def test_a_request_may_name_its_own_instruction(server: Server, source_dir: Path, reference: np.ndarray) -> None:
    instruction = "Judge whether the document names a European capital"
    source = load_source(str(source_dir), "ranking", reranker={**RERANKERS["qwen3"], "instruction": instruction})
    expected = np.array(torch_reference(source, [(QUERY, text) for text in TEXTS]), dtype=np.float64)
    assert np.abs(expected - reference).max() > 1e-3  # the instruction is part of what the model reads
    body = {"query": QUERY, "texts": TEXTS, "instruction": instruction}
    ranked = httpx.post(server.url + "/rerank", json=body, timeout=60).json()
    assert np.abs(np.array([r["score"] for r in sorted(ranked, key=lambda r: r["index"])]) - expected).max() < 1e-4
    predicted = httpx.post(server.url + "/predict", json={"inputs": {"query": QUERY, "texts": TEXTS},
                                                          "parameters": {"instruction": instruction}}, timeout=60)
    assert sorted(predicted.json(), key=lambda r: r["index"]) == sorted(ranked, key=lambda r: r["index"])
    cohere = httpx.post(server.url + "/v2/rerank", json={"query": QUERY, "documents": TEXTS, "model": "m",
                                                         "instruction": instruction}, timeout=60).json()
    assert {r["index"]: r["relevance_score"] for r in cohere["results"]} == {r["index"]: r["score"] for r in ranked}


def windows_by_the_rule(source: Any, query: str, document: str) -> list[str]:
    """A long document's windows, from transformers' tokenizer: its tokens in runs of what the prefix, the template
    (filled in with the query and an empty document) and the suffix leave of the maximum length, each window the
    characters its tokens cover."""
    tokenizer, reranker = source.tokenizer, source.facts.reranker
    template = reranker.template.format(instruction=reranker.instruction, query=query, document="")
    frame = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in (reranker.prefix, reranker.suffix)]
    room = source.max_length - sum(frame) - len(tokenizer(template)["input_ids"])  # as the model card tokenizes it
    offsets = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    starts = range(0, len(offsets), room)
    return [document[offsets[start][0]:offsets[min(start + room, len(offsets)) - 1][1] if start + room < len(offsets)
                     else None] for start in starts]


def test_a_long_document_scores_as_its_best_window_inside_the_prompt(server: Server, source_dir: Path) -> None:
    import cohere

    from tests.test_chunking import prose

    source = load_source(str(source_dir), "ranking", reranker="qwen3")
    document = prose(1500)
    texts = [TEXTS[0], document]
    ranked = httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": texts, "chunking": True}, timeout=60)
    cut = httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": texts}, timeout=60)
    capped = cohere.ClientV2(base_url=server.url, api_key="unused").rerank(
        model="m", query=QUERY, documents=texts, max_tokens_per_doc=40)
    assert ranked.status_code == 200, ranked.text[:300]
    scores = {entry["index"]: entry["score"] for entry in ranked.json()}
    windows = windows_by_the_rule(source, QUERY, document)
    assert len(windows) >= 3 and int(ranked.headers["x-compute-windows"]) == 1 + len(windows)
    assert abs(scores[1] - max(torch_reference(source, [(QUERY, window) for window in windows]))) < 1e-4
    # a document that fits scores as without chunking; the long one, without, as its first window's worth
    assert scores[0] == {entry["index"]: entry["score"] for entry in cut.json()}[0]
    # max_tokens_per_doc drops a document's tokens past it, inside the template too
    offsets = source.tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    expected = torch_reference(source, [(QUERY, document[:offsets[39][1]])])[0]
    assert abs({r.index: r.relevance_score for r in capped.results}[1] - expected) < 1e-4


def test_kserve_reads_each_pair_through_the_template(server: Server) -> None:
    name = httpx.get(server.url + "/info").json()["model"]["id"]
    body = {"inputs": [{"name": "query", "shape": [1], "datatype": "BYTES", "data": [QUERY]},
                       {"name": "text", "shape": [len(TEXTS)], "datatype": "BYTES", "data": TEXTS}]}
    answer = httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text[:300]
    ranked = httpx.post(server.url + "/rerank", json={"query": QUERY, "texts": TEXTS}, timeout=60).json()
    scores = [r["score"] for r in sorted(ranked, key=lambda r: r["index"])]
    np.testing.assert_array_equal(np.float32(answer.json()["outputs"][0]["data"]), np.float32(scores))  # FP32 data
