"""Every CPU target's INT8 recipe on every encoder family, whatever the host: a recipe is chosen by target, and the
graphs it writes run on any x86 host (7-bit weights exactly everywhere, 8-bit ones exactly where VNNI sums u8 x s8
products in 32 bits), so CI builds what an AVX2 host builds even when it lands on a VNNI one, and the reverse."""
from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

from infinity.engine.hostinfo import cpu_flags
from infinity.manifest import Manifest
from optimize.presets import PRESETS, VNNI_FLAGS
from optimize.stages.s7_validate.artifact import validate_artifact
from tests.models import FAMILIES, VARIANTS
from tests.servers import running

# targets that share another's recipe: built once here, and their graphs compared with the other's
SAME_RECIPE = {"skylake": "avx2", "cascadelake": "icelake", "sapphirerapids": "icelake"}
RECIPES = ("avx2", "icelake")
TEXTS = ["rivet", "What is the capital of France?", "def f(x): return x * 2", "a " * 150 + "beyond the maximum"]
VNNI_HOST = bool(set(VNNI_FLAGS) & cpu_flags())
# Without VNNI, icelake's recipe writes 7-bit weights: avx2's graph byte for byte (checked once, for bert, by
# test_without_vnni_icelake_writes_the_avx2_graph); each family's icelake build is its own graph only on VNNI hosts.
BUILT_HERE = RECIPES if VNNI_HOST else ("avx2",)


def test_every_cpu_target_is_one_of_the_recipes_built_here():
    cpu_targets = {name for name, preset in PRESETS.items() if not preset.is_gpu}
    assert cpu_targets == {*RECIPES, *SAME_RECIPE}
    for target, twin in SAME_RECIPE.items():
        assert PRESETS[target].quantization == PRESETS[twin].quantization


@pytest.mark.slow
@pytest.mark.parametrize("target", RECIPES)  # a family's targets in turn: they share the stages before quantize
@pytest.mark.parametrize("family", [*FAMILIES, *VARIANTS])
def test_every_family_builds_int8_under_every_cpu_target(family, target, family_artifact, tmp_path):
    if target not in BUILT_HERE and family != "bert":
        pytest.skip(f"without VNNI, {target} writes avx2's graph (test_without_vnni_icelake_writes_the_avx2_graph)")
    _, artifact = family_artifact(family, "feature-extraction", "int8", target)
    manifest = Manifest.load(artifact)
    quantization, kept = manifest.optimization.quantization, manifest.optimization.kept_float
    assert manifest.target.name == target and manifest.model.precision == "int8"
    assert manifest.target.required_cpu_flags == list(PRESETS[target].required_cpu_flags)
    assert quantization.activations == "per_token" and quantization.batch_invariant
    assert quantization.candidates > len(kept)  # some node is INT8
    graph = onnx.load(str(artifact / manifest.model.file), load_external_data=False).graph
    assert sum(node.op_type in ("MatMulIntegerToFloat", "MatMulInteger") for node in graph.node) >= (
        quantization.candidates - len(kept))
    # 8-bit weights only where the build host's kernels sum in 32 bits; the AVX2 recipe never
    assert quantization.weight_bits == 7 or (target == "icelake" and VNNI_HOST)
    assert manifest.parity.passed == (not manifest.parity.failures)  # passed, or failed and says why
    assert manifest.parity.batch_invariance["max_abs_diff"] == 0
    if target == "icelake":
        return  # served by tests/test_matrix.py's INT8 test
    args = () if manifest.parity.passed else ("--allow-failed-parity",)
    with running(artifact, tmp_path / "server.log", *args) as server:
        response = httpx.post(f"{server.url}/predict", json={"inputs": TEXTS}, timeout=60)
    assert response.status_code == 200 and np.isfinite(response.json()).all()


@pytest.mark.slow
def test_deberta_keeps_its_relative_position_projections_float_and_passes_parity_on_every_recipe(family_artifact):
    """DeBERTa projects its relative position embeddings through their own query and key weights: the same numbers
    for every request, computed from weights alone, so they stay float (and cost nothing per token); the tokens'
    six projections per layer are INT8, and the held-out parity passes on the 7-bit recipe as on the 8-bit one."""
    for target in BUILT_HERE:
        _, artifact = family_artifact("deberta-v2-own-position-projections", "feature-extraction", "int8", target)
        manifest = Manifest.load(artifact)
        assert manifest.optimization.quantization.candidates == 6 * 2  # Q, K, V, output, FFN in and out; 2 layers
        graph = onnx.load(str(artifact / manifest.model.file), load_external_data=False).graph
        positions = [node for node in graph.node if node.op_type == "MatMul" and "pos_" in node.name]
        assert positions and manifest.parity.passed, (target, manifest.parity.metrics)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["deberta-v2-own-position-projections"])
def test_recorded_parity_is_what_serving_here_gives(family, family_artifact):
    """The manifest's held-out parity, measured again as the server answers on this host: per-token answers do not
    depend on their batch, so the metrics come out the same, for the 7-bit recipe on any host and the 8-bit one
    where VNNI is."""
    for target in BUILT_HERE:
        source, artifact = family_artifact(family, "feature-extraction", "int8", target)
        manifest = Manifest.load(artifact)
        if manifest.optimization.quantization.weight_bits == 8 and not VNNI_HOST:
            pytest.skip("8-bit weights run exactly only on VNNI hosts; this one has none")
        again = validate_artifact(artifact, str(source))
        assert again.result.metrics == pytest.approx(manifest.parity.metrics, abs=1e-6)
        assert again.result.passed == manifest.parity.passed


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(SAME_RECIPE))
def test_a_target_sharing_a_recipe_writes_the_same_graph(target, family_artifact):
    _, twin = family_artifact("bert", "feature-extraction", "int8", SAME_RECIPE[target])
    _, artifact = family_artifact("bert", "feature-extraction", "int8", target)
    assert Manifest.load(artifact).target.name == target
    assert _digest(artifact / "model.onnx") == _digest(twin / "model.onnx")


@pytest.mark.slow
@pytest.mark.skipif(VNNI_HOST, reason="with VNNI, icelake's 8-bit weights make a graph of its own")
def test_without_vnni_icelake_writes_the_avx2_graph(family_artifact):
    _, avx2 = family_artifact("bert", "feature-extraction", "int8", "avx2")
    _, icelake = family_artifact("bert", "feature-extraction", "int8", "icelake")
    manifest = Manifest.load(icelake)
    assert manifest.target.name == "icelake" and manifest.optimization.quantization.weight_bits == 7
    assert _digest(icelake / "model.onnx") == _digest(avx2 / "model.onnx")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
