"""The cores benchmark's parts: the corpus, random-weight shapes, placement on cores, the embedding baseline, a run."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import orjson
import pytest
from starlette.testclient import TestClient

from bench.cores import Layout, core_groups, default_layouts, drive, placement
from bench.corpus import MIN_WORDS, build, passages
from bench.shapes import random_checkpoint
from bench.vanilla_server import create_app
from tests.models import minilm_dir


def test_the_corpus_is_distinct_passages_chosen_alike_on_every_run():
    texts = build(count=200)
    passages.cache_clear()  # parsed again, not remembered
    assert texts == build(count=200) and len(set(texts)) == 200
    words = sorted(len(text.split()) for text in texts)
    assert words[0] >= MIN_WORDS and words[-1] > 5 * words[0]  # a natural spread, not one length


def test_a_corpus_of_long_texts_holds_only_texts_of_that_many_tokens_uncut():
    from tokenizers import Tokenizer

    tokenizer = minilm_dir() / "tokenizer.json"
    long = build(count=20, min_tokens=256, tokenizer=tokenizer)
    counter = Tokenizer.from_file(str(tokenizer))
    counter.no_truncation()
    assert len(set(long)) == 20 and all(len(counter.encode(text).ids) >= 256 for text in long)
    assert set(long) < set(passages(Path(sysconfig.get_paths()["stdlib"])))
    with pytest.raises(ValueError, match="give --tokenizer"):
        build(count=20, min_tokens=256)


def test_layouts_split_the_cores_into_engines():
    assert [str(layout) for layout in default_layouts(1)] == ["1x1"]
    assert [str(layout) for layout in default_layouts(8)] == ["1x8", "8x1", "2x4"]
    assert Layout.parse("2x4") == Layout(2, 4) and Layout(2, 4).cores == 8


def test_servers_get_one_cpu_per_physical_core_and_the_clients_the_others():
    cpus = os.sched_getaffinity(0)
    groups = core_groups(cpus)
    assert sorted(cpu for group in groups for cpu in group) == sorted(cpus)
    servers, clients = placement(1)
    assert servers == [groups[0][0]] and clients
    if len(groups) > 1:  # a core to spare: the load generator stays off the server's core
        assert not set(clients) & set(groups[0])
    with pytest.raises(ValueError, match="physical cores"):
        placement(len(groups) + 1)


def test_a_shape_keeps_the_files_and_draws_new_weights(tmp_path: Path):
    from safetensors.numpy import load_file

    source = minilm_dir()
    out = random_checkpoint(source, tmp_path / "shape", seed=0)
    assert (out / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    assert (out / "modules.json").is_file() and not (out / "README.md").exists()
    trained, drawn = load_file(source / "model.safetensors"), load_file(out / "model.safetensors")
    name = "embeddings.word_embeddings.weight"
    assert drawn[name].shape == trained[name].shape and not np.allclose(drawn[name], trained[name])
    again = load_file(random_checkpoint(source, tmp_path / "again", seed=0) / "model.safetensors")
    assert np.array_equal(again[name], drawn[name])


def test_the_embedding_baseline_answers_sentence_transformers_vectors():
    from sentence_transformers import SentenceTransformer

    texts = ["hello world", "a second, longer text about embeddings"]
    expected = SentenceTransformer(str(minilm_dir()), device="cpu").encode(texts)
    with TestClient(create_app(str(minilm_dir()), threads=1, task="feature-extraction")) as client:
        one = client.post("/predict", json={"inputs": texts[0]})
        both = client.post("/predict", json={"inputs": texts})
    assert one.status_code == both.status_code == 200 and "x-compute-time" in one.headers
    assert np.allclose(one.json(), expected[0], atol=1e-5) and np.allclose(both.json(), expected, atol=1e-5)


def test_the_load_generator_sums_its_connections_over_engines(minilm_fp32_artifact: Path):
    from bench.process import Server

    server = Server.infinity(minilm_fp32_artifact, "--threads", "1")
    port = server.port
    try:
        server.wait_ready()
        body = orjson.dumps({"inputs": "a short text"})
        req_s, tokens_s, latencies, errors = drive([port], [(body, 5)], 2, 0.3, sorted(os.sched_getaffinity(0)))
        assert not errors and len(latencies) >= 2 and req_s > 0 and tokens_s == pytest.approx(5 * req_s)
        bad = orjson.dumps({"inputs": ""})
        _, _, latencies, errors = drive([port], [(bad, 1)], 1, 0.1, sorted(os.sched_getaffinity(0)))
        assert not latencies and errors.get("400", 0) > 0
    finally:
        server.stop()


def test_a_run_measures_every_cell_and_writes_it(minilm_fp32_artifact: Path, tmp_path: Path):
    corpus = tmp_path / "corpus.json"
    corpus.write_bytes(orjson.dumps(build(count=40)))
    out = tmp_path / "cells.json"
    run = subprocess.run([sys.executable, "-m", "bench", "cores", f"m={minilm_fp32_artifact}", "--servers", "ours",
                          "--cores", "1", "--seq", "8", "--concurrency", "1", "2", "--seconds", "0.3",
                          "--corpus", str(corpus), "--bulk-batch", "8", "--bulk-seconds", "0.3",
                          "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    cells = orjson.loads(out.read_bytes())
    assert [(c["kind"], c["seq"], c["concurrency"]) for c in cells] == [("seq", 8, 1), ("seq", 8, 2), ("bulk", 0, 2)]
    assert all(c["req_s"] > 0 and not c["errors"] and c["layout"] == "1x1" for c in cells)
    assert cells[2]["tokens_s"] > cells[2]["req_s"] * 8  # a bulk request is 8 texts of 30+ words
    assert "| 1, ours, 1x1 |" in run.stdout
