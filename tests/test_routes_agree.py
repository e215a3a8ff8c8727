"""Every route answers what /predict answers, for every task the suite builds and every per-request field a family
exposes: the same inputs with the same fields (renamed as each family names them) give the same numbers, bit for
bit, on /, /invocations, Vertex AI, KServe, OpenAI, TEI, Cohere and TEI's gRPC services (unary and streamed, from a
client generated from tei.proto: tests/tei_client.py). Short and long texts, each field alone."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from bench.process import free_port
from infinity.manifest import Manifest
from tests.servers import Server, running
from tests.tei_client import generated

SHORT = ["What is the capital of France?", "Paris is the capital and largest city of France.", "rivet"]
LONG = " ".join(f"Sentence {i} says something about topic {i % 7} and its neighbour {i % 5}." for i in range(160))
TEXTS = [*SHORT, LONG]
QUERY = "Where is Paris?"
COHERE_TYPES = {"query": "search_query", "document": "search_document"}
COHERE_TRUNCATE = {"right": "END", "left": "START"}

# Each case: /predict's parameters. A family that cannot say one of them is not asked that case.
EMBEDDING_CASES = [{}, {"prompt_name": "query"}, {"prompt_name": "document"}, {"dimensions": 8},
                   {"truncation_direction": "left"}, {"normalize": False}, {"precision": "ubinary"}]
RANKING_CASES = [{}, {"chunking": True}, {"truncation_direction": "left"}, {"raw_scores": True},
                 {"max_tokens_per_doc": 8}, {"max_tokens_per_doc": 8, "chunking": True}]
Answer = Callable[[httpx.Response], Any]


def post(server: Server, path: str, body: Any) -> httpx.Response:
    response = httpx.post(server.url + path, json=body, timeout=120)
    assert response.status_code == 200, (path, body, response.text)
    return response


GRPC: dict[str, grpc.Channel] = {}  # each server's gRPC channel, by its HTTP address
DIRECTIONS = {"right": 0, "left": 1}  # tei.v1's TruncationDirection


def served(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    manifest = Manifest.load(artifact)
    args = () if manifest.parity.passed else ("--allow-failed-parity",)
    port = free_port()
    with running(artifact, tmp_path_factory.mktemp("server") / "server.log", *args, "--grpc-port", str(port)) as server:
        GRPC[server.url] = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            yield server
        finally:
            GRPC.pop(server.url).close()


def stub(server: Server, service: str) -> Any:
    return getattr(generated()[1], f"{service}Stub")(GRPC[server.url])


def said(params: dict[str, Any], *fields: str) -> bool:
    """Whether tei.v1's message can say every one of these parameters."""
    return set(params) <= set(fields)


def alone(server: Server, params: dict[str, Any], pick: Callable[[Any], Any] = lambda answer: answer) -> list[Any]:
    """/predict's answer to each text sent alone: what a tei.v1 message of one text is the same request as."""
    return [pick(post(server, "/predict", {"inputs": [text], "parameters": params}).json()[0]) for text in TEXTS]


def check_grpc(server: Server, service: str, rpc: str, messages: list[Any], answer: Callable[[Any], Any],
               single: list[Any], batched: Any, params: dict[str, Any]) -> None:
    """Each message as its own call answers as /predict does that text alone, bit for bit; the same messages in one
    stream, which the batcher batches as they arrive, as /predict does them batched, to float32 rounding (bit for
    bit where the graph is batch-invariant: tests/test_grpc.py)."""
    unary, streamed = getattr(stub(server, service), rpc), getattr(stub(server, service), f"{rpc}Stream")
    got = [answer(unary(message, timeout=120)) for message in messages]
    assert len(got) == len(single) and all(same(g, e) for g, e in zip(got, single)), (
        f"grpc {rpc} answers otherwise than /predict for {params}")
    got = [answer(each) for each in streamed(iter(messages), timeout=120)]
    assert len(got) == len(messages) and all(
        np.allclose(g, b, rtol=1e-4, atol=1e-5) for g, b in zip(got, batched)), f"grpc {rpc}Stream for {params}"


def check_grpc_dense(server: Server, params: dict[str, Any], normalize: bool, batched: Any,
                     pick: Callable[[Any], Any] = lambda answer: answer) -> None:
    """Embed's vectors, `normalize` said as TEI's /embed says it; nothing where the message cannot say the case."""
    if not said(params, "prompt_name", "dimensions", "truncation_direction", "normalize"):
        return
    pb = generated()[0]
    fields = {k: v for k, v in params.items() if k in ("prompt_name", "dimensions")}
    messages = [pb.EmbedRequest(inputs=text, truncate=True, normalize=normalize,
                                truncation_direction=DIRECTIONS[params.get("truncation_direction", "right")],
                                **fields) for text in TEXTS]
    check_grpc(server, "Embed", "Embed", messages, lambda r: list(r.embeddings), alone(server, params, pick),
               batched, params)


def check_grpc_sparse(server: Server, params: dict[str, Any], batched: Any,
                      pick: Callable[[Any], Any] = lambda answer: answer) -> None:
    if not said(params, "truncation_direction"):
        return
    pb = generated()[0]
    messages = [pb.EmbedSparseRequest(inputs=text, truncate=True,
                                      truncation_direction=DIRECTIONS[params.get("truncation_direction", "right")])
                for text in TEXTS]
    width = 1 + max(entry["index"] for each in batched for entry in each)

    def dense(entries: list[tuple[int, float]]) -> np.ndarray:
        row = np.zeros(max(width, 1 + max((i for i, _ in entries), default=0)), np.float32)
        for index, value in entries:
            row[index] = value
        return row

    single = [dense([(e["index"], e["value"]) for e in each]) for each in alone(server, params, pick)]
    check_grpc(server, "Embed", "EmbedSparse", messages,
               lambda r: dense([(v.index, v.value) for v in r.sparse_embeddings]), single,
               [dense([(e["index"], e["value"]) for e in each]) for each in batched], params)


def model_name(server: Server) -> str:
    return str(httpx.get(server.url + "/info", timeout=60).json()["model"]["id"])


def same(a: Any, b: Any) -> bool:
    """Equal numbers bit for bit (as float32, the engine's), or equal JSON where the answers are not numbers."""
    try:
        return np.array_equal(np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32))
    except (ValueError, TypeError):
        return bool(a == b)


def check(server: Server, expected: Any, routes: dict[str, tuple[str, Any, Answer]]) -> None:
    assert routes, "no route to compare"
    for label, (path, body, answer) in routes.items():
        got = answer(post(server, path, body))
        assert same(got, expected), f"{label} ({path}) answers otherwise than /predict for {body}"


def platform_routes(server: Server, inputs: Any, params: dict[str, Any], answer_key: str = "") -> dict[str, Any]:
    """/, /invocations and Vertex AI's predict route, which take /predict's inputs and parameters."""
    def vertex(response: httpx.Response) -> Any:
        predictions = response.json()["predictions"]
        return predictions[0] if answer_key == "one" else predictions

    instances = [inputs] if answer_key == "one" else inputs
    body = {"inputs": inputs, "parameters": params}
    return {"hf /": ("/", body, lambda r: r.json()), "sagemaker": ("/invocations", body, lambda r: r.json()),
            "vertex": ("/vertex/predict", {"instances": instances, "parameters": params}, vertex)}


def kserve_route(server: Server, tensors: dict[str, list[str]], params: dict[str, Any],
                 shape: Callable[[np.ndarray], Any]) -> dict[str, Any]:
    inputs = [{"name": name, "datatype": "BYTES", "shape": [len(data)], "data": data} for name, data in tensors.items()]

    def answer(response: httpx.Response) -> Any:
        output = response.json()["outputs"][0]
        return shape(np.asarray(output["data"], dtype=np.float32).reshape(output["shape"]))

    return {"kserve": (f"/v2/models/{model_name(server)}/infer", {"inputs": inputs, "parameters": params}, answer)}


# --- embeddings: a prompted dense model (a default prompt of its own), bge-m3's dense head ---------------------------

def dense_routes(server: Server, params: dict[str, Any], normalize: bool, hybrid: bool) -> dict[str, Any]:
    """Every route's dense vectors; `normalize`: the model's default, which TEI's /embed does not share."""
    heads = {"outputs": ["dense"]} if hybrid else {}
    routes = {label: (path, body, (lambda r, extract=extract: [a["dense"] for a in extract(r)]) if hybrid else extract)
              for label, (path, body, extract) in platform_routes(server, TEXTS, {**params, **heads}).items()}
    routes.update(kserve_route(server, {"text": TEXTS}, params, lambda data: data))
    if "truncation_direction" not in params and "normalize" not in params:  # OpenAI's body has neither
        fields = {"dimensions", "prompt_name", "chunking", "precision"}
        openai = {"input": TEXTS, "model": "any", **{k: v for k, v in params.items() if k in fields}}
        routes["openai"] = ("/v1/embeddings", openai, lambda r: [d["embedding"] for d in r.json()["data"]])
    routes["tei /embed"] = ("/embed", {"inputs": TEXTS, "normalize": normalize, **params}, lambda r: r.json())
    if "normalize" not in params:  # Cohere normalizes as the model does
        cohere: dict[str, Any] = {"texts": TEXTS, "embedding_types": [params.get("precision", "float")]}
        if "prompt_name" in params:
            cohere["input_type"] = COHERE_TYPES[params["prompt_name"]]
        if "dimensions" in params:
            cohere["output_dimension"] = params["dimensions"]
        if "chunking" in params:
            cohere["chunking"] = params["chunking"]
        if "truncation_direction" in params:
            cohere["truncate"] = COHERE_TRUNCATE[params["truncation_direction"]]
        kind = cohere["embedding_types"][0]
        routes["cohere v2"] = ("/v2/embed", cohere, lambda r: r.json()["embeddings"][kind])
    return routes


@pytest.fixture(scope="module")
def prompted(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """gemma3-tiny: prompts query and document, and "query" as the model's own default prompt."""
    yield from served(artifact_for("feature-extraction", model="gemma3-tiny"), tmp_path_factory)


@pytest.fixture(scope="module")
def minilm(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """MiniLM: pooled in the server, so long texts can run whole in windows."""
    yield from served(minilm_fp32_artifact, tmp_path_factory)


@pytest.mark.parametrize("params", EMBEDDING_CASES, ids=lambda p: ",".join(p) or "defaults")
def test_a_prompted_embedding_model_answers_alike_on_every_route(prompted: Server, params: dict[str, Any],
                                                                 artifact_for: Any) -> None:
    expected = post(prompted, "/predict", {"inputs": TEXTS, "parameters": params}).json()
    default = Manifest.load(artifact_for("feature-extraction", model="gemma3-tiny")).task.normalize
    check(prompted, expected, dense_routes(prompted, params, params.get("normalize", default), hybrid=False))
    check_grpc_dense(prompted, params, params.get("normalize", default), expected)


@pytest.mark.parametrize("params", [{}, {"chunking": True}, {"chunking": True, "dimensions": 8}],
                         ids=lambda p: ",".join(p) or "defaults")
def test_a_dense_model_runs_long_texts_alike_on_every_route(minilm: Server, params: dict[str, Any],
                                                            minilm_fp32_artifact: Path) -> None:
    expected = post(minilm, "/predict", {"inputs": TEXTS, "parameters": params}).json()
    default = Manifest.load(minilm_fp32_artifact).task.normalize
    check(minilm, expected, dense_routes(minilm, params, default, hybrid=False))
    check_grpc_dense(minilm, params, default, expected)


def test_the_default_prompt_is_what_a_route_without_a_prompt_field_gets(prompted: Server) -> None:
    """KServe once skipped it: the model's default prompt applies on every route, and naming it changes nothing."""
    default = post(prompted, "/predict", {"inputs": TEXTS}).json()
    named = post(prompted, "/predict", {"inputs": TEXTS, "parameters": {"prompt_name": "query"}}).json()
    other = post(prompted, "/predict", {"inputs": TEXTS, "parameters": {"prompt_name": "document"}}).json()
    assert same(default, named) and not same(default, other)


@pytest.fixture(scope="module")
def hybrid(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from served(artifact_for("hybrid-embedding"), tmp_path_factory)


@pytest.mark.parametrize("params", [{}, {"dimensions": 8}, {"chunking": True}, {"truncation_direction": "left"}],
                         ids=lambda p: ",".join(p) or "defaults")
def test_bge_m3_heads_answer_alike_on_every_route(hybrid: Server, params: dict[str, Any], artifact_for: Any) -> None:
    whole = post(hybrid, "/predict", {"inputs": TEXTS, "parameters": params}).json()
    default = Manifest.load(artifact_for("hybrid-embedding")).task.normalize
    check(hybrid, [a["dense"] for a in whole], dense_routes(hybrid, params, default, hybrid=True))
    check_grpc_dense(hybrid, params, default, [a["dense"] for a in whole], pick=lambda answer: answer["dense"])
    sparse = {k: v for k, v in params.items() if k != "dimensions"}
    check(hybrid, [a["sparse"] for a in whole],
          {"tei /embed_sparse": ("/embed_sparse", {"inputs": TEXTS, **sparse}, lambda r: r.json())})
    check_grpc_sparse(hybrid, sparse, [a["sparse"] for a in whole], pick=lambda answer: answer["sparse"])


# --- sparse and multi-vector ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def splade(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from served(artifact_for("sparse-embedding"), tmp_path_factory)


@pytest.mark.parametrize("params", [{}, {"top_k": 5}, {"threshold": 0.5}, {"chunking": True},
                                    {"truncation_direction": "left"}], ids=lambda p: ",".join(p) or "defaults")
def test_sparse_embeddings_answer_alike_on_every_route(splade: Server, params: dict[str, Any]) -> None:
    expected = post(splade, "/predict", {"inputs": TEXTS, "parameters": params}).json()
    routes = platform_routes(splade, TEXTS, params)
    routes["tei /embed_sparse"] = ("/embed_sparse", {"inputs": TEXTS, **params}, lambda r: r.json())
    check(splade, expected, routes)
    check_grpc_sparse(splade, params, expected)


@pytest.fixture(scope="module")
def colbert(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from served(artifact_for("multi-vector"), tmp_path_factory)


@pytest.mark.parametrize("params", [{}, {"input_type": "query"}, {"input_type": "document"}, {"chunking": True},
                                    {"input_type": "query", "truncation_direction": "left"}],
                         ids=lambda p: ",".join(p) or "defaults")
def test_multi_vector_answers_alike_on_every_route(colbert: Server, params: dict[str, Any]) -> None:
    """Vertex once dropped the role: a query there got no expansion and a document's length."""
    expected = post(colbert, "/predict", {"inputs": TEXTS, "parameters": params}).json()
    routes = platform_routes(colbert, TEXTS, params)
    routes["tei /embed_all"] = ("/embed_all", {"inputs": TEXTS, **params}, lambda r: r.json())
    for label, (path, body, answer) in routes.items():
        got = answer(post(colbert, path, body))
        assert len(got) == len(expected) and all(same(g, e) for g, e in zip(got, expected)), (label, params)
    if not params:  # tei.v1's EmbedAll has no role: a document's tokens, the model's default
        pb = generated()[0]
        messages = [pb.EmbedAllRequest(inputs=text, truncate=True) for text in TEXTS]
        check_grpc(colbert, "Embed", "EmbedAll", messages,
                   lambda r: [list(token.embeddings) for token in r.token_embeddings], alone(colbert, params),
                   expected, params)


# --- rankers: a cross-encoder and a causal reranker -------------------------------------------------------------------

def ranking_routes(server: Server, params: dict[str, Any]) -> dict[str, Any]:
    """Each route's scores, in the texts' order."""
    def by_index(results: list[dict[str, Any]], key: str = "score") -> list[float]:
        return [item[key] for item in sorted(results, key=lambda item: item["index"])]

    inputs = {"query": QUERY, "texts": TEXTS}
    routes = {label: (path, body, lambda r, extract=extract: by_index(extract(r)))
              for label, (path, body, extract) in platform_routes(server, inputs, params, "one").items()}
    routes.update(kserve_route(server, {"query": [QUERY], "text": TEXTS}, params, lambda data: data.tolist()))
    if "max_tokens_per_doc" not in params:  # TEI's /rerank has no such field
        routes["tei /rerank"] = ("/rerank", {**inputs, **params}, lambda r: by_index(r.json()))
    if "raw_scores" not in params and "truncation_direction" not in params:
        cohere = {"query": QUERY, "documents": TEXTS, **{k: v for k, v in params.items()
                                                          if k in ("chunking", "instruction", "max_tokens_per_doc")}}
        for path in ("/v1/rerank", "/v2/rerank"):
            routes[f"cohere {path}"] = (path, cohere, lambda r: by_index(r.json()["results"], "relevance_score"))
    return routes


def scores(server: Server, params: dict[str, Any]) -> list[float]:
    answer = post(server, "/predict", {"inputs": {"query": QUERY, "texts": TEXTS}, "parameters": params}).json()
    return [item["score"] for item in sorted(answer, key=lambda item: item["index"])]


def grpc_ranking(server: Server, params: dict[str, Any]) -> dict[str, Any]:
    """Rerank's scores in the texts' order, unary and as RerankStream (one text a message)."""
    if not said(params, "truncation_direction", "raw_scores"):
        return {}
    pb = generated()[0]
    direction = DIRECTIONS[params.get("truncation_direction", "right")]
    raw = params.get("raw_scores", False)

    def by_index(response: Any) -> list[float]:
        return [rank.score for rank in sorted(response.ranks, key=lambda rank: rank.index)]

    rerank = stub(server, "Rerank")
    unary = rerank.Rerank(pb.RerankRequest(query=QUERY, texts=TEXTS, truncate=True, raw_scores=raw,
                                           truncation_direction=direction), timeout=120)
    streamed = rerank.RerankStream(iter([pb.RerankStreamRequest(query=QUERY, text=text, truncate=True, raw_scores=raw,
                                                                truncation_direction=direction) for text in TEXTS]),
                                   timeout=120)
    return {"grpc Rerank": by_index(unary), "grpc RerankStream": by_index(streamed)}


def check_ranking(server: Server, params: dict[str, Any]) -> None:
    expected = scores(server, params)
    check(server, expected, ranking_routes(server, params))
    for label, got in grpc_ranking(server, params).items():
        assert same(got, expected), f"{label} answers otherwise than /predict for {params}"
    if "max_tokens_per_doc" in params:  # a route that dropped it would answer the long text's whole score
        assert not same(expected, scores(server, {k: v for k, v in params.items() if k != "max_tokens_per_doc"}))


@pytest.fixture(scope="module")
def cross_encoder(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from served(artifact_for("ranking"), tmp_path_factory)


@pytest.mark.parametrize("params", RANKING_CASES, ids=lambda p: ",".join(p) or "defaults")
def test_a_cross_encoder_ranks_alike_on_every_route(cross_encoder: Server, params: dict[str, Any]) -> None:
    check_ranking(cross_encoder, params)


@pytest.fixture(scope="module")
def causal_reranker(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from served(artifact_for("ranking", model="qwen3-reranker-tiny"), tmp_path_factory)


@pytest.mark.parametrize("params", [*RANKING_CASES, {"instruction": "Find the city's country"}],
                         ids=lambda p: ",".join(p) or "defaults")
def test_a_causal_reranker_ranks_alike_on_every_route(causal_reranker: Server, params: dict[str, Any]) -> None:
    """Vertex once dropped the instruction; KServe takes it among /predict's parameters."""
    check_ranking(causal_reranker, params)


# --- classifiers ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def classifier(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from served(artifact_for("sequence-classification"), tmp_path_factory)


@pytest.mark.parametrize("params", [{}, {"function_to_apply": "none"}, {"truncation_direction": "left"}],
                         ids=lambda p: ",".join(p) or "defaults")
def test_a_sequence_classifier_answers_alike_on_every_route(classifier: Server, params: dict[str, Any]) -> None:
    expected = post(classifier, "/predict", {"inputs": TEXTS, "parameters": params}).json()
    check(classifier, expected, platform_routes(classifier, TEXTS, params))
    names = httpx.get(classifier.url + "/info", timeout=60).json()["labels"]  # KServe's scores: in label id order
    by_label = [{item["label"]: item["score"] for item in each} for each in expected]
    ordered = [[scores[names[str(i)]] for i in range(len(names))] for scores in by_label]
    check(classifier, ordered, kserve_route(classifier, {"text": TEXTS}, params, lambda data: data.tolist()))
    if said(params, "function_to_apply", "truncation_direction") and params.get("function_to_apply") in (None, "none"):
        pb = generated()[0]
        messages = [pb.PredictRequest(inputs=text, truncate=True, raw_scores="function_to_apply" in params,
                                      truncation_direction=DIRECTIONS[params.get("truncation_direction", "right")])
                    for text in TEXTS]
        def in_order(answer: Any) -> list[float]:  # every label, best first, as /predict answers
            return [score for _, score in sorted((p.label, p.score) for p in answer.predictions)]

        def named(answer: Any) -> list[float]:
            return [score for _, score in sorted((item["label"], item["score"]) for item in answer)]

        check_grpc(classifier, "Predict", "Predict", messages, in_order, alone(classifier, params, named),
                   [named(each) for each in expected], params)


@pytest.fixture(scope="module")
def tagger(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from served(artifact_for("token-classification"), tmp_path_factory)


@pytest.mark.parametrize("params", [{}, {"aggregation_strategy": "none"}, {"truncation_direction": "left"}],
                         ids=lambda p: ",".join(p) or "defaults")
def test_a_token_classifier_answers_alike_on_every_route(tagger: Server, params: dict[str, Any]) -> None:
    expected = post(tagger, "/predict", {"inputs": TEXTS, "parameters": {**params, "ignore_labels": []}}).json()
    check(tagger, expected, platform_routes(tagger, TEXTS, {**params, "ignore_labels": []}))
