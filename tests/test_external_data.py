"""Models over 2 GiB keep their weights beside the graph: a small model forced down that path end to end."""
from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from infinity.cli import main
from infinity.manifest import Manifest, sha256_file, verify_checksums
from tests.servers import running

TEXTS = ["This movie was wonderful.", "Terrible service, never again.", "Angela Merkel visited Berlin."]


@pytest.fixture(scope="session")
def split_artifacts(artifacts) -> dict[str, Path]:
    """distilbert-tiny at fp32 and INT8 with every weight in model.onnx.data (threshold 0 bytes), every graph on
    the way (export, fusion, each INT8 trial) written the same way, as a model over 2 GiB is."""
    from optimize import onnxio
    from optimize.pipeline import OptimizeOptions, optimize

    built = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnxio, "EXTERNAL_DATA_BYTES", 0)
        for precision in ("fp32", "int8"):
            out = artifacts.root / f"distilbert-tiny-external-{precision}"
            if not (out / "manifest.json").is_file():
                optimize(OptimizeOptions(model=str(artifacts.source("distilbert-tiny")), task="sequence-classification",
                                         out=out, target="icelake", precision=precision, external_data_bytes=0),
                         log=lambda _: None)
            built[precision] = out
    return built


def scores(artifact: Path, log: Path) -> np.ndarray:
    with running(artifact, log) as server:
        answer = httpx.post(f"{server.url}/predict", json={"inputs": TEXTS}, timeout=60).json()
    return np.array([[item["score"] for item in sorted(row, key=lambda item: item["label"])] for row in answer])


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_weights_beside_the_graph_are_checksummed_and_served_like_one_file(split_artifacts, artifact_for, precision,
                                                                          tmp_path):
    artifact = split_artifacts[precision]
    manifest = Manifest.load(artifact)
    assert manifest.model.external_data == {"model.onnx.data": sha256_file(artifact / "model.onnx.data")}
    assert manifest.model.size_bytes == sum(path.stat().st_size for path in artifact.glob("model.onnx*"))
    assert (artifact / "model.onnx").stat().st_size < (artifact / "model.onnx.data").stat().st_size
    assert (artifact / "model.onnx.data").stat().st_mode & 0o044 == 0o044  # readable by the server's own user
    assert manifest.parity.passed
    verify_checksums(artifact, manifest)
    one_file = artifact_for("sequence-classification", precision, model="distilbert-tiny")
    assert not Manifest.load(one_file).model.external_data and not (one_file / "model.onnx.data").exists()
    np.testing.assert_allclose(scores(artifact, tmp_path / "split.log"), scores(one_file, tmp_path / "one.log"),
                               atol=1e-6)


def test_a_changed_or_missing_weights_file_is_refused_in_one_line(split_artifacts, tmp_path, capsys):
    artifact = tmp_path / "artifact"
    shutil.copytree(split_artifacts["fp32"], artifact)
    data = artifact / "model.onnx.data"
    content = bytearray(data.read_bytes())
    content[len(content) // 2] ^= 0xFF
    data.write_bytes(bytes(content))
    assert main(["serve", str(artifact)], environ={}) == 1
    assert "checksum mismatch for model.onnx.data" in capsys.readouterr().err
    data.unlink()
    assert main(["serve", str(artifact)], environ={}) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "model.onnx.data is missing" in lines[0]


def test_a_candidate_graph_is_evaluated_with_the_weights_file_beside_it(split_artifacts, tmp_path):
    from optimize.onnxio import copy_model
    from optimize.served import load_candidate

    artifact = split_artifacts["fp32"]
    graph = tmp_path / "work" / "candidate.onnx"  # where the quantizer writes its trials: outside the artifact
    graph.parent.mkdir()
    copy_model(artifact / "model.onnx", graph, external_data_bytes=0)
    staging = tmp_path / "staging"
    shutil.copytree(artifact, staging)
    model = load_candidate(staging, Manifest.load(staging), graph)
    scores = [item["score"] for item in model.predict(TEXTS[0])]
    assert len(scores) == 3 and abs(sum(scores) - 1) < 1e-5
    assert not (staging / "candidate.onnx.data").exists()  # linked for loading only


def test_an_int8_build_that_quantizes_every_node_carries_its_weights_file(tmp_path):
    from optimize import onnxio
    from optimize.pipeline import OptimizeOptions, optimize
    from tests.models import build_tiny_family

    source = build_tiny_family("bert", "feature-extraction", tmp_path / "source")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnxio, "EXTERNAL_DATA_BYTES", 0)
        manifest = optimize(OptimizeOptions(model=str(source), task="feature-extraction", out=tmp_path / "out",
                                            target="icelake", precision="int8", external_data_bytes=0),
                            log=lambda _: None)
    assert manifest.parity.passed and not manifest.optimization.kept_float  # the full INT8 graph was chosen
    assert set(manifest.model.external_data) == {"model.onnx.data"}
    verify_checksums(tmp_path / "out", manifest)
