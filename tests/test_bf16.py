"""sapphirerapids' bf16: the exported float graph on OpenVINO's CPU plugin inside onnxruntime, built, checked and served
on every host the plugin offers a device on. Where the CPU has no bfloat16 arithmetic OpenVINO runs the graph in fp32,
and the server refuses the artifact unless --allow-cpu-mismatch; where the plugin offers no device (an AMD EPYC), the
optimizer refuses to build it in one line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from infinity.engine import openvino
from infinity.engine.hostinfo import missing_cpu_flags
from infinity.manifest import Manifest
from optimize.measure.texts import heldout_inputs
from optimize.presets import PRESETS
from tests.models import minilm_dir
from tests.servers import ROOT, running

TARGET = PRESETS["sapphirerapids"]
MISSING = missing_cpu_flags(list(TARGET.required_cpu_flags))
# How far a bf16 answer may move between alone and batched: OpenVINO's kernels block its bfloat16 sums by the
# batch's shape. Measured on an AMX host (Intel Xeon, family 6, model 167) over the 220 held-out texts: MiniLM 7.8e-4
# (37 texts moved at all), all-mpnet-base-v2 7.1e-4 (56).
BOUND = 2e-3
TEXTS = [text for text in heldout_inputs("singles") if isinstance(text, str)][:40]
UNAVAILABLE = openvino.unavailable()  # the test extra installs the plugin: None, or the CPU it offers no device for


@pytest.fixture(scope="module")
def bf16(artifact_for) -> Path:
    if UNAVAILABLE:
        pytest.skip(f"the bf16 graph runs on OpenVINO, {UNAVAILABLE}")
    return artifact_for("feature-extraction", "bf16", "sapphirerapids")


@pytest.mark.skipif(not UNAVAILABLE, reason="OpenVINO's plugin offers a device for this CPU")
def test_where_the_plugin_offers_no_device_the_optimizer_refuses_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "optimize", "optimize", str(minilm_dir()), "--target",
                             "sapphirerapids", "--precision", "bf16", "--out", str(tmp_path / "out")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        f"multiverse: error: sapphirerapids's bf16 runs (and its parity is checked) on OpenVINO, {UNAVAILABLE}")
    assert not (tmp_path / "out").exists()


def test_the_manifest_names_openvino_its_precision_and_what_the_check_measured(bf16: Path) -> None:
    manifest = Manifest.load(bf16)
    assert manifest.model.precision == "bf16"
    assert manifest.target.providers == ["OpenVINOExecutionProvider", "CPUExecutionProvider"]
    assert manifest.target.provider_options == {"OpenVINOExecutionProvider": {"INFERENCE_PRECISION_HINT": "bf16"}}
    assert manifest.target.required_cpu_flags == list(TARGET.required_cpu_flags)
    assert manifest.parity.provider == "OpenVINOExecutionProvider"
    assert manifest.parity.passed and manifest.parity.metrics["cosine_min"] >= 0.99
    assert manifest.parity.batch_invariance["max_abs_diff"] <= BOUND
    assert manifest.optimization.fusion == {}  # OpenVINO fuses the export itself
    assert any(note.startswith("BF16: the export as it is") and "validated on OpenVINOExecutionProvider" in note
               for note in manifest.optimization.notes)


def test_served_answers_agree_with_pytorch_alone_and_batched_within_the_bound(bf16: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_dir()), device="cpu").encode(TEXTS, normalize_embeddings=True)
    with running(bf16, tmp_path / "server.log", *(("--allow-cpu-mismatch",) if MISSING else ())) as server:
        batched = np.array(httpx.post(f"{server.url}/predict", json={"inputs": TEXTS}, timeout=120).json())
        alone = np.array([httpx.post(f"{server.url}/predict", json={"inputs": [text]}, timeout=60).json()[0]
                          for text in TEXTS])
        assert "ready: feature-extraction on sapphirerapids (bf16)" in server.logged()
    for answers in (alone, batched):
        cosine = (answers * reference).sum(-1) / np.linalg.norm(answers, axis=-1)
        assert cosine.min() >= 0.99, cosine.min()
    assert np.abs(alone - batched).max() <= BOUND


@pytest.mark.skipif(not MISSING, reason="this host has every flag sapphirerapids needs")
def test_a_host_without_amx_refuses_it_in_one_line_naming_the_flags(bf16: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "infinity", "serve", str(bf16)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"infinity: error: this CPU lacks {', '.join(MISSING)}, required by the 'sapphirerapids' target; pass "
        "--allow-cpu-mismatch to serve it anyway"]


def test_without_the_plugin_the_server_says_which_extra_to_install(bf16: Path, tmp_path: Path) -> None:
    (tmp_path / "onnxruntime_ep_openvino.py").write_text("raise ImportError('not installed')\n")
    result = subprocess.run([sys.executable, "-m", "infinity", "serve", str(bf16), "--allow-cpu-mismatch"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(tmp_path),
                                                                              "PATH": "/usr/bin:/bin"})
    assert result.returncode == 1
    mismatch = [f"WARNING:     infinity.preflight: this CPU lacks {', '.join(MISSING)}, required by the "
                "'sapphirerapids' target; serving anyway (--allow-cpu-mismatch)"] if MISSING else []
    assert result.stderr.strip().splitlines() == [*mismatch,
        "infinity: error: the 'sapphirerapids' target's bf16 graph runs on OpenVINO, whose onnxruntime plugin is "
        "not installed: pip install 'infinity-multiverse[openvino]'"]
