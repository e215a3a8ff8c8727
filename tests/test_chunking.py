"""Long texts embedded whole: windows of the model's maximum length, each pooled as a short text is, their vectors
averaged by token count and then normalized, against that formula computed independently in PyTorch FP32."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bench.corpus import build
from tests.models import minilm_dir
from tests.servers import ROOT, WAIT, running
from tests.test_sparse import dense

pytestmark = pytest.mark.slow


def prose(tokens: int) -> str:
    """Real passages joined until the text has about this many MiniLM tokens (a token is ~4 characters)."""
    text = ""
    for passage in build(count=400):
        text += passage + "\n\n"
        if len(text) > 4.2 * tokens:
            return text
    raise AssertionError("the corpus is shorter than asked")


def minilm_windows(text: str, overlap: int = 0) -> list[np.ndarray]:
    """Each window's last hidden state, from transformers: the text's ids without special tokens in windows of 254
    (the last shorter, each after the first starting `overlap` ids back), [CLS] w [SEP]."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(minilm_dir()), AutoModel.from_pretrained(minilm_dir()).eval()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    room, start, hidden = 254, 0, []
    while True:
        window = [tokenizer.cls_token_id, *ids[start:start + room], tokenizer.sep_token_id]
        with torch.no_grad():
            hidden.append(model(input_ids=torch.tensor([window])).last_hidden_state[0].double().numpy())
        if start + room >= len(ids):
            return hidden
        start += room - overlap


def windowed_reference(text: str, overlap: int = 0) -> np.ndarray:
    """The defined answer: each window mean-pooled, the means averaged weighted by window length, normalized."""
    hidden = minilm_windows(text, overlap)
    vector = np.average([h.mean(0) for h in hidden], axis=0, weights=[len(h) for h in hidden])
    return vector / np.linalg.norm(vector)


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url, json=body, timeout=WAIT)


def test_a_long_text_is_one_vector_of_its_windows_and_a_short_one_answers_as_without(minilm_int8_artifact: Path,
                                                                                    tmp_path: Path) -> None:
    document, short = prose(2000), "A short text fits in one window."
    with running(minilm_int8_artifact, tmp_path / "on.log", "--chunk-long-inputs") as server:
        whole = post(server.url + "/v1/embeddings", {"input": document})
        fits = post(server.url + "/v1/embeddings", {"input": short})
        unchunked = post(server.url + "/v1/embeddings", {"input": [document, short], "chunking": False})
        info = httpx.get(server.url + "/info").json()["chunking"]
    with running(minilm_int8_artifact, tmp_path / "off.log") as server:
        off = post(server.url + "/v1/embeddings", {"input": [document, short]})
        refused = post(server.url + "/embed", {"inputs": document, "truncate": False})
        opted = post(server.url + "/embed", {"inputs": [document], "chunking": True})
    assert whole.status_code == 200, whole.text[:300]
    assert info == {"long_inputs": True, "overlap": 0, "max_chunks_per_input": 64}
    vector = np.array(whole.json()["data"][0]["embedding"])
    assert float(vector @ windowed_reference(document)) >= 0.99
    windows = int(whole.headers["x-compute-windows"])
    assert windows >= 8 and whole.json()["usage"]["prompt_tokens"] == int(whole.headers["x-compute-tokens"]) > 2000
    # with chunking off, by the request or by the server, the document is cut as before
    assert "x-compute-windows" not in off.headers and off.json()["usage"]["prompt_tokens"] < 300
    assert unchunked.json()["data"] == off.json()["data"] and unchunked.json()["usage"] == off.json()["usage"]
    assert refused.status_code == 422 and "truncate" in refused.json()["error"]
    assert opted.status_code == 200 and opted.headers["x-compute-windows"] == str(windows)
    assert opted.json()[0] == whole.json()["data"][0]["embedding"]
    # a text that fits in one window: bit for bit what it answers without chunking
    assert fits.headers["x-compute-windows"] == "1"
    assert fits.json()["data"][0]["embedding"] == off.json()["data"][1]["embedding"]


def test_a_long_document_among_short_texts_leaves_their_answers_as_alone(minilm_int8_artifact: Path,
                                                                        tmp_path: Path) -> None:
    document = prose(5000)
    shorts = [f"Note {i}: " + "the weather in Lyon is mild " * (1 + i % 9) for i in range(31)]
    with running(minilm_int8_artifact, tmp_path / "server.log", "--chunk-long-inputs") as server:
        mixed = post(server.url + "/embed", {"inputs": [*shorts[:10], document, *shorts[10:]]})
        alone = [post(server.url + "/embed", {"inputs": text}).json()[0] for text in shorts]
    assert mixed.status_code == 200, mixed.text[:300]
    vectors = mixed.json()
    assert vectors[:10] + vectors[11:] == alone
    assert float(np.array(vectors[10]) @ windowed_reference(document)) >= 0.99


def test_a_passage_past_the_first_window_reaches_the_vector_only_with_chunking(minilm_int8_artifact: Path,
                                                                              tmp_path: Path) -> None:
    """The needle test, on trained weights: two documents alike but for one passage after their first window, one
    about the query and one not. Cut, they are the same vector; whole, the one with the answer is nearer."""
    query = "How do volcanoes erupt?"
    needle = ("A volcano erupts when magma rising from the mantle gathers beneath the crust until the pressure of its "
              "gas breaks through, throwing out lava, ash and volcanic rock.")
    other = ("A library lends books, journals and recordings to its members, who borrow them for a few weeks and "
             "return them to the desk, where a librarian checks them back in.")
    head, tail = prose(400), prose(200)
    documents = [f"{head}\n\n{passage}\n\n{tail}" for passage in (needle, other)]
    with running(minilm_int8_artifact, tmp_path / "server.log", "--chunk-long-inputs") as server:
        whole, cut = (np.array([d["embedding"] for d in post(server.url + "/v1/embeddings",
                                                              {"input": [query, *documents], "chunking": on}
                                                              ).json()["data"]]) for on in (True, False))
    assert (cut[1] == cut[2]).all()  # the passages are past the first 256 tokens
    near, far = whole[1:] @ whole[0]
    assert near > far + 0.02, (near, far)


def test_fp32_windows_with_overlap_match_the_reference_and_the_limits_are_one_line(minilm_fp32_artifact: Path,
                                                                                 tmp_path: Path) -> None:
    document = prose(1200)
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--chunk-long-inputs", "--chunk-overlap", "32",
                 "--max-chunks-per-input", "8", "--max-inputs-per-request", "8") as server:
        answer = post(server.url + "/predict", {"inputs": document})
        cohere = post(server.url + "/v2/embed", {"texts": [document], "embedding_types": ["float"]})
        too_many = post(server.url + "/v1/embeddings", {"input": prose(3000)})
        tokens = post(server.url + "/embed_all", {"inputs": [document, "A short text."]})
        short = post(server.url + "/embed_all", {"inputs": "A short text.", "chunking": False})
        # every token's vectors: no more than 8 texts of 256 tokens could ask for without chunking
        too_many_vectors = post(server.url + "/embed_all", {"inputs": [document, document]})
        pooled = post(server.url + "/embed", {"inputs": [document, document]})
    assert answer.status_code == 200, answer.text[:300]
    np.testing.assert_allclose(answer.json(), windowed_reference(document, overlap=32), atol=1e-4)
    # every token's vector: the windows' one after another, each window's special tokens included
    np.testing.assert_allclose(tokens.json()[0], np.concatenate(minilm_windows(document, overlap=32)), atol=1e-4)
    assert tokens.json()[1] == short.json()[0] and tokens.headers["x-compute-windows"] == str(
        int(answer.headers["x-compute-windows"]) + 1)
    assert too_many_vectors.status_code == 413 and pooled.status_code == 200
    message = too_many_vectors.json()["error"]
    assert "token's vectors holds at most 2048 (--max-inputs-per-request x the maximum length)" in message
    assert cohere.json()["embeddings"]["float"][0] == answer.json()
    assert too_many.status_code == 413
    message = too_many.json()["error"]["message"]
    assert "windows of 256 tokens; the limit is 8 (--max-chunks-per-input)" in message and "\n" not in message


@pytest.mark.parametrize(("args", "said"), [
    (("--chunk-long-inputs",), "--chunk-long-inputs runs long texts in windows for embeddings pooled in the "
                               "server, max-pooled sparse embeddings, bge-m3's heads, multi-vector documents and "
                               "rankers; this artifact serves sequence-classification"),
    (("--chunk-overlap", "254"), "--chunk-overlap 254 leaves no new tokens in a window of 254"),
])
def test_chunking_the_model_cannot_take_is_refused_at_start(args: tuple[str, ...], said: str,
                                                            artifact_for: Any, minilm_fp32_artifact: Path) -> None:
    artifact = artifact_for("sequence-classification") if "--chunk-long-inputs" in args else minilm_fp32_artifact
    done = subprocess.run([sys.executable, "-m", "infinity", "serve", str(artifact), *args], check=False, cwd=ROOT,
                          env={**os.environ, "INFINITY_THREADS": "1"}, capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 1 and said in done.stderr, done.stderr[-500:]


def ranked_reference(source: Path, query: str, document: str, document_tokens: int | None = None,
                     windows: int | None = None, max_length: int = 512) -> float:
    """A long document's raw score by the rule, from transformers: its ids (cut to `document_tokens`) in windows of
    what fits beside the whole query, [CLS] query [SEP] window [SEP], the best of the (first `windows`) windows'
    logits."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForSequenceClassification.from_pretrained(source).eval()
    query_ids = tokenizer(query, add_special_tokens=False)["input_ids"]
    ids = tokenizer(document, add_special_tokens=False)["input_ids"][:document_tokens]
    room, best = max_length - 3 - len(query_ids), -np.inf
    for start in range(0, len(ids), room)[:windows]:
        window = ids[start:start + room]
        input_ids = [tokenizer.cls_token_id, *query_ids, tokenizer.sep_token_id, *window, tokenizer.sep_token_id]
        types = [0] * (len(query_ids) + 2) + [1] * (len(window) + 1)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([input_ids]), token_type_ids=torch.tensor([types])).logits
        best = max(best, float(logits[0, 0]))
    return best


def sigmoid(logit: float) -> float:
    return float(1 / (1 + np.exp(-logit)))


def test_a_long_document_scores_as_its_best_window_beside_the_whole_query(artifacts: Any, artifact_for: Any,
                                                                           tmp_path: Path) -> None:
    import cohere

    query, short = "Which module parses command-line arguments?", "argparse parses command-line arguments."
    document = prose(1500)
    with running(artifact_for("ranking"), tmp_path / "server.log") as server:
        ranked = post(server.url + "/rerank", {"query": query, "texts": [short, document], "chunking": True})
        cut = post(server.url + "/rerank", {"query": query, "texts": [short, document]})
        predicted = post(server.url + "/predict", {"inputs": {"query": query, "texts": [short, document]},
                                                   "parameters": {"chunking": True}})
        capped = cohere.ClientV2(base_url=server.url, api_key="unused").rerank(
            model="m", query=query, documents=[short, document], max_tokens_per_doc=300,
            request_options={"additional_body_parameters": {"chunking": True}})
        plain = cohere.ClientV2(base_url=server.url, api_key="unused").rerank(
            model="m", query=query, documents=[short, document])
        long_query = post(server.url + "/rerank", {"query": document, "texts": [short], "chunking": True})
    assert ranked.status_code == 200, ranked.text[:300]
    scores = {entry["index"]: entry["score"] for entry in ranked.json()}
    source = artifacts.source("ranking")
    assert abs(scores[1] - sigmoid(ranked_reference(source, query, document))) < 1e-4
    assert int(ranked.headers["x-compute-windows"]) == 1 + 4 and "x-compute-windows" not in cut.headers
    # a pair that fits in one window scores as without chunking; the long one as its first window without
    uncut = {entry["index"]: entry["score"] for entry in cut.json()}
    assert scores[0] == uncut[0]
    assert abs(uncut[1] - sigmoid(ranked_reference(source, query, document, windows=1))) < 1e-4
    assert predicted.json() == ranked.json()
    # max_tokens_per_doc drops a document's tokens past it before its windows are cut
    relevance = {r.index: r.relevance_score for r in capped.results}
    assert abs(relevance[1] - sigmoid(ranked_reference(source, query, document, 300))) < 1e-4
    assert {r.index: r.relevance_score for r in plain.results}[0] == relevance[0]
    assert long_query.status_code == 422 and "beside the query" in long_query.json()["error"]
    assert "send a shorter query" in long_query.json()["error"] and "\n" not in long_query.json()["error"]


def sparse_windowed_reference(source: Path, text: str, room: int = 254) -> np.ndarray:
    """SPLADE's max pooling over a long text read window by window, from transformers: the text's ids in windows of
    `room`, [CLS] w [SEP], log1p(relu(logits)) of every token, the largest of each vocabulary entry over them all."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(source), AutoModelForMaskedLM.from_pretrained(source).eval()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    best = np.zeros(model.config.vocab_size)
    for start in range(0, len(ids), room):
        window = [tokenizer.cls_token_id, *ids[start:start + room], tokenizer.sep_token_id]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([window])).logits[0]
        best = np.maximum(best, torch.log1p(torch.relu(logits)).amax(0).double().numpy())
    return best


def test_a_long_text_is_one_sparse_vector_the_largest_weights_of_its_windows(artifacts: Any, artifact_for: Any,
                                                                            tmp_path: Path) -> None:
    document, short = prose(1500), "A short text fits in one window."
    with running(artifact_for("sparse-embedding"), tmp_path / "server.log", "--chunk-long-inputs") as server:
        whole = post(server.url + "/embed_sparse", {"inputs": [document, short]})
        predicted = post(server.url + "/predict", {"inputs": [document, short]})
        cut = post(server.url + "/embed_sparse", {"inputs": [document, short], "chunking": False})
        alone = post(server.url + "/embed_sparse", {"inputs": document})
    assert whole.status_code == 200, whole.text[:300]
    assert int(whole.headers["x-compute-windows"]) >= 1 + 6 and "x-compute-windows" not in cut.headers
    expected = sparse_windowed_reference(artifacts.source("splade-tiny"), document)
    served = dense(whole.json()[0], len(expected))
    assert np.abs(served - expected).max() < 1e-4
    assert set(np.flatnonzero(expected > 1e-5)) <= set(np.flatnonzero(served))
    assert whole.json()[1] == cut.json()[1]  # a text that fits: as without chunking
    assert whole.json()[0] != cut.json()[0]  # the long one: more than its first window
    assert predicted.json() == whole.json() and alone.json()[0] == whole.json()[0]


def colbert_windows(source: Path, text: str, room: int) -> tuple[np.ndarray, int]:
    """A long document's ColBERT vectors by the rule, from sentence-transformers' MultiVectorEncoder: the text's
    ids in windows of `room`, [CLS] document-prompt w [SEP] each run as a document is (skiplist included), the
    windows' vectors one after another (and how many windows)."""
    import torch
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(source), device="cpu")
    tokenizer = model.tokenizer
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    marker = tokenizer(model.prompts["document"], add_special_tokens=False)["input_ids"]
    vectors = []
    for start in range(0, len(ids), room):
        window = torch.tensor([[tokenizer.cls_token_id, *marker, *ids[start:start + room], tokenizer.sep_token_id]])
        with torch.no_grad():
            out = model({"input_ids": window, "attention_mask": torch.ones_like(window)}, task="document")
        vectors.append(out["token_embeddings"][0][out["attention_mask"][0].bool()].numpy())
    return np.concatenate(vectors), len(vectors)


def test_a_long_document_is_the_colbert_vectors_of_its_windows_and_a_query_is_cut(artifacts: Any,
                                                                                   artifact_for: Any,
                                                                                   tmp_path: Path) -> None:
    document, short, query = prose(700), "A short document.", prose(100)
    with running(artifact_for("multi-vector"), tmp_path / "server.log") as server:
        whole = post(server.url + "/embed_all", {"inputs": [document, short], "chunking": True})
        cut = post(server.url + "/embed_all", {"inputs": [document, short]})
        predicted = post(server.url + "/predict", {"inputs": [document, short], "parameters": {"chunking": True}})
        alone = post(server.url + "/embed_all", {"inputs": document, "chunking": True})
        queries = [post(server.url + "/embed_all", {"inputs": query, "input_type": "query", "chunking": chunking})
                   for chunking in (True, False)]
    assert whole.status_code == 200, whole.text[:300]
    # 180 tokens a document: [CLS], "document", ":" and [SEP] around 176 of its own
    expected, windows = colbert_windows(artifacts.source("colbert-tiny"), document, room=176)
    np.testing.assert_allclose(whole.json()[0], expected, atol=1e-4)
    assert int(whole.headers["x-compute-windows"]) == 1 + windows and windows >= 4
    assert whole.json()[1] == cut.json()[1] and len(cut.json()[0]) < 180  # fits: as without chunking
    assert predicted.json() == whole.json() and alone.json()[0] == whole.json()[0]
    # a query runs as the model runs it, cut to its length, whatever chunking says
    assert queries[0].json() == queries[1].json() and "x-compute-windows" not in queries[0].headers


def m3_windows(source: Path, text: str, room: int) -> dict[str, Any]:
    """A long text's three bge-m3 heads by the rule, from the formulas of tests/test_hybrid.py applied to each
    window <s> w </s> of `room` ids: dense = the windows' first-token states averaged by window length, normalized;
    sparse = each id's largest weight over every window; colbert = every window's vectors but its first, in order."""
    from tests.test_hybrid import m3_heads

    tokenizer, passes = m3_heads(source)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    windows = [[tokenizer.cls_token_id, *ids[start:start + room], tokenizer.sep_token_id]
               for start in range(0, len(ids), room)]
    heads = [passes(window) for window in windows]
    dense = np.average([head["first"] for head in heads], axis=0, weights=[len(window) for window in windows])
    sparse: dict[int, float] = {}
    for head in heads:
        for token, weight in head["sparse"].items():
            sparse[token] = max(sparse.get(token, 0.0), weight)
    return {"dense": dense / np.linalg.norm(dense), "sparse": sparse,
            "colbert": np.concatenate([head["colbert"] for head in heads])}


def test_a_long_text_is_each_m3_head_of_its_windows_by_that_heads_rule(artifacts: Any, artifact_for: Any,
                                                                        tmp_path: Path) -> None:
    document, short = prose(700), "A short text."
    with running(artifact_for("hybrid-embedding"), tmp_path / "server.log", "--chunk-long-inputs") as server:
        whole = post(server.url + "/predict", {"inputs": [document, short]})
        cut = post(server.url + "/predict", {"inputs": [document, short], "parameters": {"chunking": False}})
        sparse = post(server.url + "/embed_sparse", {"inputs": document})
        dense = post(server.url + "/embed", {"inputs": document})
        tokens = post(server.url + "/embed_all", {"inputs": document})
    assert whole.status_code == 200, whole.text[:300]
    expected = m3_windows(artifacts.source("m3-tiny"), document, room=254)
    served = whole.json()[0]
    np.testing.assert_allclose(served["dense"], expected["dense"], atol=1e-4)
    assert {e["index"] for e in served["sparse"]} == set(expected["sparse"])
    assert max(abs(e["value"] - expected["sparse"][e["index"]]) for e in served["sparse"]) < 1e-4
    np.testing.assert_allclose(served["colbert"], expected["colbert"], atol=1e-4)
    assert int(whole.headers["x-compute-windows"]) >= 1 + 3
    assert whole.json()[1] == cut.json()[1] and served["dense"] != cut.json()[0]["dense"]  # fits: as without
    assert (sparse.json()[0], dense.json()[0], tokens.json()[0]) == (served["sparse"], served["dense"],
                                                                     served["colbert"])
