"""Pooling as the model declares it (never guessed), modules after pooling in the graph, decoder embedding models,
prompts, and the model's served name: against sentence-transformers, over real HTTP."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bench.inprocess import predict
from infinity.manifest import Manifest
from infinity.tasks.feature_extraction import pool
from optimize.checkpoint import pooling_mode
from optimize.stages.s1_load import hub_id, load_source
from tests.models import QWEN3_PROMPTS, minilm_dir
from tests.servers import ROOT, Server, running

TEXTS = ["What is the capital of France?", "Paris is the capital and most populous city of France.",
         "a", "Stocks fell 3.2% on Tuesday after the Fed raised rates by 25 basis points."]
MODES = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken", "cls+mean")


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("mode", MODES)
def test_the_servers_pooling_matches_sentence_transformers_pooling_on_padded_batches(mode: str, side: str) -> None:
    import torch
    from sentence_transformers.sentence_transformer.modules import Pooling

    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((3, 6, 8)).astype(np.float32)
    lengths = [6, 2, 4]
    mask = np.zeros((3, 6), dtype=np.int64)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    if side == "left":
        mask = mask[:, ::-1].copy()
    modes = mode.split("+")
    reference = Pooling(8, pooling_mode=modes[0] if len(modes) == 1 else tuple(modes))
    expected = reference({"token_embeddings": torch.from_numpy(hidden),
                          "attention_mask": torch.from_numpy(mask)})["sentence_embedding"].numpy()
    np.testing.assert_allclose(pool(hidden, mask, mode), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("config", "expected"), [
    ({"word_embedding_dimension": 8, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}, "mean"),
    ({"word_embedding_dimension": 8, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls"),
    ({"word_embedding_dimension": 8, "pooling_mode_lasttoken": True, "include_prompt": True}, "lasttoken"),
    ({"word_embedding_dimension": 8, "pooling_mode_mean_sqrt_len_tokens": True}, "mean_sqrt_len_tokens"),
    ({"word_embedding_dimension": 8, "pooling_mode_cls_token": True, "pooling_mode_max_tokens": True}, "cls+max"),
    ({"word_embedding_dimension": 8}, "mean"),  # sentence-transformers' own default
    ({"embedding_dimension": 8, "pooling_mode": "weightedmean", "include_prompt": True}, "weightedmean"),
    ({"embedding_dimension": 8, "pooling_mode": ["cls", "mean"]}, "cls+mean"),
])
def test_every_pooling_config_format_is_read(config: dict[str, Any], expected: str) -> None:
    assert pooling_mode(config) == (expected, True)


@pytest.mark.parametrize(("config", "message"), [
    ({"embedding_dimension": 8, "pooling_mode": "median"}, "unknown pooling mode"),
    ({"embedding_dimension": 8, "pooling_mode": "mean", "pooling_temperature": 2}, "pooling_temperature"),
])
def test_a_pooling_config_it_cannot_read_is_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pooling_mode(config)


def plain_transformers_copy(directory: Path) -> Path:
    """The bundled MiniLM without its sentence-transformers files: a model that declares no pooling."""
    directory.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "vocab.txt"):
        (directory / name).symlink_to(minilm_dir() / name)
    return directory


def multiverse(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "optimize", "optimize", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_model_without_a_pooling_config_needs_pooling_given_in_one_line(tmp_path: Path) -> None:
    source = plain_transformers_copy(tmp_path / "plain")
    result = multiverse(str(source), "--precision", "fp32", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "pass --pooling with one of cls, mean" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_reference_pools_as_declared_so_parity_checks_the_declared_pooling(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    from optimize.stages.s4_reference import torch_reference

    source = load_source(str(plain_transformers_copy(tmp_path / "plain")), "feature-extraction", pooling="cls")
    assert source.facts.pooling == "cls" and not source.facts.normalize
    reference = np.stack(torch_reference(source, TEXTS[:2]))
    tokenizer, model = AutoTokenizer.from_pretrained(source.path), AutoModel.from_pretrained(source.path).eval()
    with torch.no_grad():
        first = model(**tokenizer(TEXTS[:2], padding=True, return_tensors="pt")).last_hidden_state[:, 0].numpy()
    np.testing.assert_allclose(reference, first, atol=1e-5)


def test_pooling_given_against_the_models_own_config_is_refused() -> None:
    with pytest.raises(ValueError, match=r"--pooling cls contradicts the model's own Pooling config \(mean\)"):
        load_source(str(minilm_dir()), "feature-extraction", pooling="cls")


def test_an_unknown_module_in_modules_json_is_refused_by_name(tmp_path: Path) -> None:
    source = tmp_path / "odd"
    shutil.copytree(minilm_dir(), source, ignore=shutil.ignore_patterns("model.safetensors"))
    (source / "model.safetensors").symlink_to(minilm_dir() / "model.safetensors")
    modules = json.loads((source / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_LSTM", "type": "sentence_transformers.models.LSTM"})
    (source / "modules.json").write_text(json.dumps(modules))
    result = multiverse(str(source), "--precision", "fp32", "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "lists the module 'sentence_transformers.models.LSTM', which cannot be exported" in result.stderr


E5_CACHED = "/cache/models--intfloat--e5-small-v2/snapshots/ffb93f3b"


@pytest.mark.parametrize(("model", "path", "expected"), [
    ("BAAI/bge-small-en-v1.5", "/cache/models--BAAI--bge-small-en-v1.5/snapshots/5c38ec7c", "BAAI/bge-small-en-v1.5"),
    (E5_CACHED, E5_CACHED, "intfloat/e5-small-v2"),
    ("/models/mine", "/models/mine", None),
])
def test_a_hub_id_is_read_from_the_id_given_or_the_hub_cache_path(model: str, path: str, expected: str | None) -> None:
    assert hub_id(model, Path(path)) == expected


def test_model_id_given_to_the_optimizer_wins() -> None:
    source = load_source(str(minilm_dir()), "feature-extraction", model_id="acme/minilm-finetuned")
    assert source.model_id == "acme/minilm-finetuned"


def test_a_pooling_that_excludes_the_prompt_is_refused(artifacts: Any, tmp_path: Path) -> None:
    source = tmp_path / "instructor-like"
    shutil.copytree(artifacts.source("qwen3-tiny"), source)
    config = json.loads((source / "1_Pooling" / "config.json").read_text())
    (source / "1_Pooling" / "config.json").write_text(json.dumps({**config, "include_prompt": False}))
    with pytest.raises(ValueError, match="include_prompt=false"):
        load_source(str(source), "feature-extraction")


def test_the_bundled_minilm_is_named_by_its_hub_id(minilm_fp32_artifact: Path) -> None:
    manifest = Manifest.load(minilm_fp32_artifact)
    assert manifest.source.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert manifest.public_model_id == "sentence-transformers/all-MiniLM-L6-v2"


def test_a_manifest_written_before_prompts_and_hub_ids_still_loads(minilm_fp32_artifact: Path) -> None:
    data = json.loads((minilm_fp32_artifact / "manifest.json").read_text())
    for section, name in (("task", "prompts"), ("task", "default_prompt_name"), ("task", "pooled_in_graph"),
                          ("source", "model_id")):
        del data[section][name]
    manifest = Manifest.from_dict(data)
    assert manifest.task.prompts == {} and not manifest.task.pooled_in_graph
    assert manifest.public_model_id == Path(data["source"]["model"]).name


# A decoder embedding model (Qwen3-Embedding's shape) and an encoder with Dense modules (EmbeddingGemma's)

@pytest.fixture(scope="module")
def qwen3(artifacts: Any) -> Path:
    return artifacts.artifact("feature-extraction", "fp32", model="qwen3-tiny")


@pytest.fixture(scope="module")
def qwen3_server(qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("qwen3") / "server.log"
    with running(qwen3, log, "--served-model-name", "tiny-qwen3-embedding") as server:
        yield server


def st_model(artifacts: Any, name: str) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(artifacts.source(name)), device="cpu")


def test_a_decoder_embedding_model_is_exported_with_last_token_pooling_over_its_eos(qwen3: Path) -> None:
    manifest = Manifest.load(qwen3)
    assert manifest.task.pooling == "lasttoken" and manifest.task.normalize
    assert manifest.task.prompts == QWEN3_PROMPTS and manifest.task.default_prompt_name is None
    assert manifest.model.inputs["input_ids"] == ["batch", "sequence"]
    assert "last-token pooling reads the <|endoftext|> its tokenizer appends to every input" in \
        manifest.optimization.notes
    assert manifest.parity.passed and manifest.parity.batch_invariance["cosine_min"] >= 0.9999


def test_qwen3_with_a_prompt_over_http_matches_sentence_transformers(qwen3_server: Server, artifacts: Any) -> None:
    import openai

    reference = st_model(artifacts, "qwen3-tiny")
    queries = reference.encode(TEXTS, prompt_name="query")
    plain = reference.encode(TEXTS)
    assert np.min(np.sum(queries * plain, axis=1)) < 0.999  # the prompt changes the vectors

    tei = httpx.post(qwen3_server.url + "/embed", json={"inputs": TEXTS, "prompt_name": "query"}, timeout=30)
    assert tei.status_code == 200
    np.testing.assert_allclose(np.array(tei.json()), queries, atol=1e-5)
    predicted = httpx.post(qwen3_server.url + "/predict",
                           json={"inputs": TEXTS, "parameters": {"prompt_name": "query"}}, timeout=30)
    np.testing.assert_allclose(np.array(predicted.json()), queries, atol=1e-5)
    client = openai.OpenAI(base_url=qwen3_server.url + "/v1", api_key="none", max_retries=0)
    answer = client.embeddings.create(input=TEXTS, model="whatever", encoding_format="float",
                                      extra_body={"prompt_name": "query"})
    np.testing.assert_allclose(np.array([d.embedding for d in answer.data]), queries, atol=1e-5)
    assert answer.model == "tiny-qwen3-embedding"
    without = httpx.post(qwen3_server.url + "/embed", json={"inputs": TEXTS}, timeout=30)
    np.testing.assert_allclose(np.array(without.json()), plain, atol=1e-5)


def test_a_decoder_embedding_model_quantizes_to_int8_within_parity(artifacts: Any) -> None:
    from infinity.engine.model import LoadedModel

    int8 = LoadedModel.load(artifacts.artifact("feature-extraction", "int8", model="qwen3-tiny"), threads=1)
    assert int8.manifest.parity.passed and int8.manifest.model.precision == "int8"
    got = np.array(predict(int8, TEXTS, {"prompt_name": "query"}))
    expected = st_model(artifacts, "qwen3-tiny").encode(TEXTS, prompt_name="query")
    assert np.min(np.sum(got * expected, axis=1)) >= 0.99


def test_padded_batches_give_a_decoder_the_same_vector_as_alone(qwen3_server: Server) -> None:
    long = " ".join(TEXTS * 4)
    alone = httpx.post(qwen3_server.url + "/embed", json={"inputs": TEXTS[2], "prompt_name": "query"}).json()
    batch = httpx.post(qwen3_server.url + "/embed",
                       json={"inputs": [long, TEXTS[2], long + " more"], "prompt_name": "query"}).json()
    np.testing.assert_allclose(batch[1], alone[0], atol=1e-5)


def test_a_decoders_token_vectors_with_a_prompt_match_sentence_transformers(qwen3_server: Server,
                                                                           artifacts: Any) -> None:
    reference = st_model(artifacts, "qwen3-tiny").encode(TEXTS, prompt_name="query", output_value="token_embeddings")
    got = httpx.post(qwen3_server.url + "/embed_all", json={"inputs": TEXTS, "prompt_name": "query"}).json()
    prompted = [QWEN3_PROMPTS["query"] + text for text in TEXTS]
    tokens = httpx.post(qwen3_server.url + "/tokenize", json={"inputs": prompted}).json()
    assert [len(vectors) for vectors in got] == [len(t) for t in tokens]
    for vectors, expected in zip(got, reference):
        # sentence-transformers pads a decoder on the left and trims only trailing padding: its last rows are the text's
        np.testing.assert_allclose(np.array(vectors), expected.numpy()[-len(vectors):], atol=1e-4)


def test_token_counts_and_truncation_include_the_prompt(qwen3_server: Server, qwen3: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(qwen3 / "tokenizer.json"))
    tokenizer.no_truncation()
    prompt = QWEN3_PROMPTS["query"]
    response = httpx.post(qwen3_server.url + "/embed", json={"inputs": TEXTS[0], "prompt_name": "query"})
    assert int(response.headers["x-compute-tokens"]) == len(tokenizer.encode(prompt + TEXTS[0]).ids)

    max_length = Manifest.load(qwen3).tokenizer.max_length
    text = "word " * 10
    while len(tokenizer.encode(prompt + text).ids) <= max_length:
        text += "word "
    assert len(tokenizer.encode(text).ids) <= max_length  # fits alone, not behind the prompt
    fits = httpx.post(qwen3_server.url + "/embed", json={"inputs": text, "truncate": False})
    assert fits.status_code == 200
    refused = httpx.post(qwen3_server.url + "/embed",
                         json={"inputs": text, "truncate": False, "prompt_name": "query"})
    assert refused.status_code == 422 and "more than the model's maximum" in refused.json()["error"]
    cut = httpx.post(qwen3_server.url + "/embed", json={"inputs": text, "prompt_name": "query"})
    assert int(cut.headers["x-compute-tokens"]) == max_length


def test_an_unknown_prompt_name_is_a_422_naming_the_known_ones(qwen3_server: Server) -> None:
    for path, body in (("/embed", {"inputs": "x", "prompt_name": "passage"}),
                       ("/predict", {"inputs": "x", "parameters": {"prompt_name": "passage"}})):
        response = httpx.post(qwen3_server.url + path, json=body)
        assert response.status_code == 422
        assert response.json()["error"].endswith("prompt_name must be one of document, query")
    openai_answer = httpx.post(qwen3_server.url + "/v1/embeddings", json={"input": "x", "prompt_name": "passage"})
    assert openai_answer.status_code == 400 and "document, query" in openai_answer.json()["error"]["message"]
    # OpenAI's token ids are read as the text they encode, so that text gets the prompt as any text does
    from infinity.api.openai import cl100k_base

    ids = cl100k_base().encode("What is late interaction?")
    embedded = [httpx.post(qwen3_server.url + "/v1/embeddings", json={"input": value, "prompt_name": "query",
                                                                      "encoding_format": "float"}).json()
                for value in (ids, "What is late interaction?")]
    assert embedded[0]["data"] == embedded[1]["data"]


def test_the_served_model_name_shows_in_every_dialect(qwen3_server: Server) -> None:
    models = httpx.get(qwen3_server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny-qwen3-embedding"]
    info = httpx.get(qwen3_server.url + "/info").json()
    assert info["model_id"] == info["model"]["id"] == "tiny-qwen3-embedding"
    assert info["prompts"] == {"names": ["document", "query"], "default": None}
    answer = httpx.post(qwen3_server.url + "/v1/embeddings", json={"input": "x", "model": "other"}).json()
    assert answer["model"] == "tiny-qwen3-embedding"


def test_the_default_prompt_name_comes_from_the_flag_or_the_environment(qwen3: Path, artifacts: Any,
                                                                        tmp_path: Path) -> None:
    queries = st_model(artifacts, "qwen3-tiny").encode(TEXTS[:2], prompt_name="query")
    with running(qwen3, tmp_path / "flag.log", "--default-prompt-name", "query") as server:
        got = httpx.post(server.url + "/embed", json={"inputs": TEXTS[:2]}).json()
        np.testing.assert_allclose(np.array(got), queries, atol=1e-5)
        assert httpx.get(server.url + "/info").json()["prompts"]["default"] == "query"
    with running(qwen3, tmp_path / "env.log", env={"INFINITY_DEFAULT_PROMPT_NAME": "query"}) as server:
        got = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[:2]}).json()["data"]
        np.testing.assert_allclose(np.array([d["embedding"] for d in got]), queries, atol=1e-5)


def test_an_unknown_default_prompt_name_stops_the_server_in_one_line(qwen3: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "infinity", "serve", str(qwen3), "--port", "0",
                             "--default-prompt-name", "passage"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == ("infinity: error: --default-prompt-name 'passage' is not one of the model's "
                                     "prompts (document, query)")


def test_dense_modules_after_pooling_are_in_the_graph_and_the_default_prompt_applies(artifacts: Any,
                                                                                    tmp_path: Path) -> None:
    artifact = artifacts.artifact("feature-extraction", "fp32", model="gemma3-tiny")
    manifest = Manifest.load(artifact)
    assert manifest.task.pooled_in_graph and manifest.task.embedding_dim == 48
    assert manifest.model.outputs == {"sentence_embedding": ["batch", 48]}
    assert manifest.parity.passed and manifest.task.default_prompt_name == "query"
    reference = st_model(artifacts, "gemma3-tiny")
    with running(artifact, tmp_path / "gemma3.log") as server:
        default = httpx.post(server.url + "/embed", json={"inputs": TEXTS}).json()
        np.testing.assert_allclose(np.array(default), reference.encode(TEXTS), atol=1e-5)
        documents = httpx.post(server.url + "/embed", json={"inputs": TEXTS, "prompt_name": "document"}).json()
        np.testing.assert_allclose(np.array(documents), reference.encode(TEXTS, prompt_name="document"), atol=1e-5)
        refused = httpx.post(server.url + "/embed_all", json={"inputs": TEXTS})
        assert refused.status_code == 404 and refused.json()["error"] == (
            "/embed_all is not available: this feature-extraction artifact's graph answers pooled vectors only")
        assert "/embed_all" not in httpx.get(server.url + "/openapi.json").json()["paths"]
