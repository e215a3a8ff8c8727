"""A restructuring never changes an answer: each task's suite artifacts, their graphs and their answers over HTTP to
fixed requests, hash as they did when the hashes were recorded on a host of this kind (tests/answers.json).

Answers depend on the CPU's kernels, so hashes are kept per host (its CPU name, family and model, and onnxruntime's
version); on a host with none recorded the test says so and skips. Record this host's with
`HF_HUB_OFFLINE=1 INFINITY_TEST_ARTIFACTS=DIR python -m tests.test_answers_unchanged` at a commit whose answers are
the reference, DIR holding the artifacts a suite run built (`-n auto`): an INT8 build rounds its weights against
calibration sums whose order follows the BLAS thread count, which the suite's workers set to their share of the
cores, so artifacts built in one process with every core can differ in their last bits."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import httpx
import onnx
import onnxruntime
import orjson
import pytest

from infinity.engine.hostinfo import cpu_name
from infinity.manifest import Manifest
from tests.servers import running

STORE = Path(__file__).with_name("answers.json")
TEXTS = ["What is the capital of France?", "Paris is the capital and largest city of France.",
         "Der Zug nach Hamburg hat heute vierzig Minuten Verspätung.", "def f(x): return x * 2", "rivet",
         "a " * 300 + "beyond the maximum length"]
RANKING = {"query": "What is the capital of France?", "texts": TEXTS[1:]}
# (task, precision, source model): what the suite builds for each task (tests/conftest.py: ArtifactCache.artifact)
ARTIFACTS = [
    ("feature-extraction", "fp32", "minilm"), ("feature-extraction", "int8", "minilm"),
    ("feature-extraction", "int8", "qwen3-tiny"), ("feature-extraction", "fp32", "gemma3-tiny"),
    ("sparse-embedding", "fp32", "splade-tiny"), ("sparse-embedding", "int8", "splade-tiny"),
    ("multi-vector", "fp32", "colbert-tiny"), ("multi-vector", "int8", "colbert-tiny"),
    ("hybrid-embedding", "fp32", "m3-tiny"), ("hybrid-embedding", "int8", "m3-tiny"),
    ("ranking", "fp32", "ranking"), ("ranking", "fp32", "qwen3-reranker-tiny"),
    ("sequence-classification", "fp32", "sequence-classification"),
    ("token-classification", "fp32", "token-classification"),
]
BODIES: dict[str, list[dict[str, Any]]] = {
    "feature-extraction": [{"inputs": TEXTS}, {"inputs": TEXTS[0]}, {"inputs": TEXTS, "parameters": {"dimensions": 8}}],
    "sparse-embedding": [{"inputs": TEXTS}, {"inputs": TEXTS, "parameters": {"top_k": 5}}],
    "multi-vector": [{"inputs": TEXTS}, {"inputs": TEXTS[:2], "parameters": {"input_type": "query"}}],
    "hybrid-embedding": [{"inputs": TEXTS}],
    "ranking": [{"inputs": RANKING}, {"inputs": RANKING, "parameters": {"raw_scores": True}}],
    "sequence-classification": [{"inputs": [*TEXTS, {"text": TEXTS[0], "text_pair": TEXTS[1]}]}],
    "token-classification": [{"inputs": TEXTS}, {"inputs": TEXTS, "parameters": {"aggregation_strategy": "none"}}],
}


def host() -> str:
    return f"{cpu_name()}, onnxruntime {onnxruntime.__version__}"


def name(task: str, precision: str, model: str) -> str:
    return f"{model}/{task}/{precision}"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def measure(artifact: Path, log: Path) -> dict[str, Any]:
    manifest = Manifest.load(artifact)
    args = () if manifest.parity.passed else ("--allow-failed-parity",)
    with running(artifact, log, *args) as server:
        answers = [httpx.post(f"{server.url}/predict", json=body, timeout=60) for body in BODIES[manifest.source.task]]
    assert all(answer.status_code == 200 for answer in answers), [answer.text for answer in answers]
    return {"graph": graph_digest(artifact / manifest.model.file),
            "answers": [digest(answer.content) for answer in answers]}


def graph_digest(path: Path) -> str:
    """The graph with its weights, however the artifact lays them out (in the graph, or in a weights file)."""
    model = onnx.load(str(path))
    for tensor in model.graph.initializer:
        tensor.ClearField("data_location")
    return digest(model.SerializeToString())


def stored() -> dict[str, dict[str, Any]]:
    return orjson.loads(STORE.read_bytes()) if STORE.is_file() else {}


@pytest.mark.slow
@pytest.mark.parametrize(("task", "precision", "model"), ARTIFACTS, ids=[name(*a) for a in ARTIFACTS])
def test_answers_hash_as_recorded(task, precision, model, artifacts, tmp_path):
    recorded = stored().get(host(), {})
    if not recorded:
        pytest.skip(f"no answers recorded for this host ({host()}); hosts recorded: {', '.join(stored()) or 'none'}")
    key = name(task, precision, model)
    assert key in recorded, f"{key} has no recorded answers on this host"
    assert measure(artifacts.artifact(task, precision, model=model), tmp_path / "server.log") == recorded[key]


def record() -> None:
    import os
    import tempfile

    from tests.conftest import ArtifactCache

    cache = ArtifactCache(Path(os.environ.get("INFINITY_TEST_ARTIFACTS") or tempfile.mkdtemp()))
    data = stored()
    data[host()] = {name(*a): measure(cache.artifact(a[0], a[1], model=a[2]), cache.root / "answers.log")
                    for a in ARTIFACTS}
    STORE.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    print(f"recorded {len(ARTIFACTS)} artifacts for {host()} in {STORE}", file=sys.stderr)


if __name__ == "__main__":
    record()
