"""The optimizer end to end on real (MiniLM) and locally built models: artifacts, graphs, parity."""
import json
import subprocess
import sys
from collections import Counter

import numpy as np
import onnx
import pytest

from bench.inprocess import predict
from infinity.artifact import sha256_file, verify_checksums
from infinity.engine.hostinfo import cpu_flags, cpu_name
from infinity.engine.model import LoadedModel
from infinity.manifest import Manifest
from optimize.presets import PRESETS, VNNI_FLAGS
from tests.conftest import HOST_TARGET

QUANTIZED_OPS = {"MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QAttention",
                 "DynamicQuantizeLinear"}
# (task, source model) pairs whose INT8 artifacts are checked; the MiniLM classification head is served in fp32
# only: its random head has near-tied probes that no INT8 node survives, so its INT8 build is all float.
INT8_CASES = [("feature-extraction", "minilm"), ("sequence-classification", "distilbert-tiny"),
              ("token-classification", "token-classification"), ("ranking", "ranking")]
ALL_CASES = [*INT8_CASES, ("sequence-classification", "sequence-classification")]


def op_counts(path):
    """Operators by type; ONNX's own Attention counts as `onnx.Attention`, apart from onnxruntime's fused one."""
    return Counter(("onnx." if node.domain in ("", "ai.onnx") and node.op_type == "Attention" else "") + node.op_type
                   for node in onnx.load(str(path)).graph.node)


@pytest.mark.parametrize("precision", ["int8", "fp32"])
@pytest.mark.parametrize("task, model", INT8_CASES)
def test_artifact_is_complete_consistent_and_passes_parity(artifact_for, task, model, precision):
    path = artifact_for(task, precision, model=model)
    manifest = Manifest.load(path)
    on_disk = json.loads((path / "manifest.json").read_text())
    assert json.loads(json.dumps(manifest.to_dict())) == on_disk
    verify_checksums(path, manifest)
    assert manifest.model.sha256 == sha256_file(path / "model.onnx")
    assert manifest.source.task == task and manifest.target.name == HOST_TARGET
    assert manifest.model.precision == precision
    assert manifest.parity.passed and not manifest.parity.failures
    assert manifest.parity.probe_size >= 200 and "held-out" in manifest.parity.probe_set
    assert set(manifest.parity.modes) == {"alone", "batched"} and manifest.parity.batch_invariance
    for name, bound in manifest.parity.thresholds.items():
        assert manifest.parity.metrics[name] >= bound
    assert manifest.optimization.fusion.get("Attention", 0) >= 2, manifest.optimization.fusion
    assert set(manifest.model.inputs) >= {"input_ids", "attention_mask"}
    ops = op_counts(path / "model.onnx")
    if precision == "int8":
        q = manifest.optimization.quantization
        # 8-bit weights only from a VNNI build host, and only where every node quantized within parity; the reason
        # names the instruction that decided it
        vnni_host = bool({"avx512_vnni", "avx_vnni"} & cpu_flags())
        assert q.activations == "per_token" and q.batch_invariant
        assert ("VPDPBUSD" if vnni_host else "VPMADDUBSW") in q.weight_bits_why
        assert q.weight_bits == 7 or (q.weight_bits == 8 and vnni_host and not manifest.optimization.kept_float)
        assert q.reduce_range == (q.weight_bits == 7)
        assert manifest.target.required_cpu_flags == list(PRESETS[HOST_TARGET].required_cpu_flags)
        # a quantized attention projects Q, K and V as three INT8 MatMuls of the same codes
        expected = q.candidates - len(manifest.optimization.kept_float) + 2 * ops["onnx.Attention"]
        assert ops["MatMulIntegerToFloat"] == expected > 0
        assert not {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "QAttention"} & set(ops)  # no per-batch scale
        assert ops["onnx.Attention"] + ops["Attention"] >= 2 and not ops["MultiHeadAttention"]
        if manifest.optimization.kept_float:  # what keeping nodes in float costs is recorded with it
            assert set(q.latency_ms_seq128) == {"fp32", "full_int8", "final"}
        assert q.calibration_inputs >= 10 and q.smoothing["smoothed_inputs"] > 0
        assert q.latency_host == cpu_name() and q.latency_ms  # the timings name the CPU they ran on
        # one calibrated scale (LayerNorm and attention outputs) comes only with 8-bit weights
        assert not q.calibrated_roles or (q.weight_bits == 8 and q.smoothing["calibrated_inputs"] > 0)
    else:
        assert not QUANTIZED_OPS & set(ops)
        assert manifest.optimization.quantization is None and manifest.target.required_cpu_flags == []
    # residual LayerNorms as Add + LayerNormalization, which onnxruntime's CPU kernels run faster
    assert ops["LayerNormalization"] >= 2 and not ops["SkipLayerNormalization"]


def test_minilm_int8_embeddings_agree_with_sentence_transformers(minilm_int8_artifact):
    from sentence_transformers import SentenceTransformer

    from optimize.measure.texts import SINGLES

    manifest = Manifest.load(minilm_int8_artifact)
    assert manifest.parity.metrics["cosine_min"] >= 0.99
    # every MiniLM node quantizes within parity: a VNNI build host keeps 8-bit weights (exact on VPDPBUSD)
    vnni = bool({"avx512_vnni", "avx_vnni"} & cpu_flags())
    assert manifest.optimization.quantization.weight_bits == (8 if vnni else 7)
    # and with 8 bits, LayerNorm and attention outputs quantize within parity with one calibrated scale
    assert manifest.optimization.quantization.calibrated_roles == (["normalized", "context"] if vnni else [])
    assert manifest.task.pooling == "mean" and manifest.task.normalize and manifest.tokenizer.max_length == 256
    # Independently of the optimizer's own check: the serving pipeline against the original library.
    model = LoadedModel.load(minilm_int8_artifact)
    texts = [*SINGLES, "An unseen sentence about gardening in the rain.", "Quarterly revenue grew 12%."]
    ours = np.stack([predict(model, text) for text in texts])
    reference = SentenceTransformer(str(manifest.source.model), device="cpu").encode(texts)
    cosine = (ours * reference).sum(1) / np.linalg.norm(reference, axis=1) / np.linalg.norm(ours, axis=1)
    assert cosine.min() >= 0.98, cosine.min()
    assert ours.shape == (len(texts), 384)


def test_every_task_model_passes_parity_in_float(artifact_for):
    for task, model in ALL_CASES:
        manifest = Manifest.load(artifact_for(task, "fp32", model=model))
        assert manifest.parity.passed, (task, manifest.parity.failures)


def test_edited_weights_fail_parity(artifact_for, tmp_path):
    from optimize.stages.s7_validate.artifact import validate_artifact

    source = artifact_for("sequence-classification", "fp32")
    assert Manifest.load(source).parity.passed  # as built; a second held-out run of it would only repeat that
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in source.iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    model = onnx.load(str(broken / "model.onnx"))
    # An encoder weight (the FFN's), not the embedding table.
    weight = next(t for t in model.graph.initializer if list(t.dims) == [384, 1536])
    values = onnx.numpy_helper.to_array(weight)
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(values.reshape(-1)).reshape(values.shape)
    weight.CopyFrom(onnx.numpy_helper.from_array(shuffled, weight.name))
    onnx.save(model, str(broken / "model.onnx"))
    manifest = Manifest.load(broken)
    manifest.model.sha256 = sha256_file(broken / "model.onnx")  # a consistent manifest: only parity can tell
    manifest.save(broken)
    result = validate_artifact(broken)
    assert not result.result.passed and "top1_agreement" in result.result.failures[0]
    run = subprocess.run([sys.executable, "-m", "optimize", "validate", str(broken)], capture_output=True, text=True)
    assert run.returncode == 3 and "parity failed" in run.stderr


def test_cli_reports_stages_and_refuses_to_write_a_failing_artifact(artifacts, tmp_path):
    source = artifacts.source("distilbert-tiny")
    out = tmp_path / "art"
    command = [sys.executable, "-m", "optimize", "optimize", str(source), "--task", "sequence-classification",
               "--target", "avx2", "--out", str(out)]
    # the refusal needs no INT8 search: a float build fails the same threshold in a quarter of the time
    failing = subprocess.run([*command, "--precision", "fp32", "--threshold", "top1_agreement=1.01"],
                             capture_output=True, text=True)
    assert failing.returncode == 3, failing.stderr
    assert "top1_agreement" in failing.stderr and not out.exists()
    kept = subprocess.run([*command, "--threshold", "top1_agreement=1.01", "--allow-failed-parity"],
                          capture_output=True, text=True)
    assert kept.returncode == 0, kept.stderr
    for stage in ("[export]", "[fuse]", "[quantize]", "[validate]", "[package]", "parity vs", "MB optimized"):
        assert stage in kept.stdout
    manifest = Manifest.load(out)
    assert manifest.parity.passed is False and manifest.parity.overridden
    assert manifest.target.name == "avx2" and manifest.optimization.quantization.reduce_range is True


@pytest.mark.skipif(not set(VNNI_FLAGS) & cpu_flags(), reason="calibrated scales come only with 8-bit weights, "
                    "which need a VNNI build host: here every recipe already scales each input per row")
def test_no_calibrated_scales_gives_every_input_a_scale_per_row(minilm_int8_artifact, tmp_path):
    out = tmp_path / "every-row"
    run = subprocess.run([sys.executable, "-m", "optimize", "optimize", "--target", "icelake", "--out", str(out),
                          "--no-calibrated-scales", "--threads", "2", "--allow-failed-parity"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    q = Manifest.load(out).optimization.quantization
    assert q.calibrated_roles == [] and q.smoothing["calibrated_inputs"] == 0
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    constants = {i.name for i in graph.initializer}
    scales = [n.input[2] for n in graph.node if n.op_type == "MatMulIntegerToFloat"]
    assert scales and not constants & set(scales)  # every A scale is computed per row at run time
    default = Manifest.load(minilm_int8_artifact).optimization.quantization
    assert default.smoothing["calibrated_inputs"] == (18 if default.calibrated_roles else 0)


def test_unknown_threshold_metric_is_a_clear_error(tmp_path):
    run = subprocess.run([sys.executable, "-m", "optimize", "optimize", "--threshold", "cosine=0.9",
                          "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert run.returncode == 2 and "unknown parity metric" in run.stderr and "cosine_min" in run.stderr


@pytest.mark.parametrize("target", ["cuda", "tensorrt"])
def test_gpu_artifacts_have_fp16_weights_and_provider_settings(artifact_for, target):
    path = artifact_for("feature-extraction", "fp16", target=target)
    manifest = Manifest.load(path)
    model = onnx.load(str(path / "model.onnx"))
    big = [t for t in model.graph.initializer if np.prod(t.dims) >= 1024]
    assert big and all(t.data_type == onnx.TensorProto.FLOAT16 for t in big)
    io_types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]}
    assert io_types == {"input_ids": onnx.TensorProto.INT64, "attention_mask": onnx.TensorProto.INT64,
                        "token_type_ids": onnx.TensorProto.INT64, "last_hidden_state": onnx.TensorProto.FLOAT}
    assert manifest.model.precision == "fp16" and manifest.parity.passed
    assert manifest.target.providers[-1] == "CPUExecutionProvider"
    # parity as served: on the GPU where the session gets it, else fp16 weights in the CPU's fp32 arithmetic
    assert manifest.parity.provider in manifest.target.providers
    if manifest.parity.provider == "CPUExecutionProvider":
        assert any("validated on this host's CPU provider" in note for note in manifest.optimization.notes)
    else:
        assert any("validated on " + manifest.parity.provider in note for note in manifest.optimization.notes)
    if target == "tensorrt":
        options = manifest.target.provider_options["TensorrtExecutionProvider"]
        assert options["trt_fp16_enable"] and options["trt_engine_cache_enable"]
        assert options["trt_profile_max_shapes"] == "input_ids:32x256,attention_mask:32x256,token_type_ids:32x256"
    else:
        assert manifest.target.providers[0] == "CUDAExecutionProvider"


def test_a_carried_recipe_splits_as_many_outlier_channels_per_role(minilm_int8_artifact, artifacts, tmp_path):
    from optimize.options import OptimizeOptions
    from optimize.pipeline import optimize
    from optimize.stages.s6_quantize.carry import node_role

    out = tmp_path / "carried"
    manifest = optimize(OptimizeOptions(model=str(artifacts.source("distilbert-tiny")), task="sequence-classification",
                                        out=out, target="icelake", keep_float_like=minilm_int8_artifact,
                                        allow_failed_parity=True), log=lambda _: None)
    source = Manifest.load(minilm_int8_artifact).optimization.quantization.outliers
    carried = manifest.optimization.quantization
    assert carried.recipe_from == str(minilm_int8_artifact)
    # the weight bits come with the recipe (8 only where this host's kernels sum in 32 bits, as the source's did)
    assert carried.weight_bits == Manifest.load(minilm_int8_artifact).optimization.quantization.weight_bits
    assert carried.outliers.applied is source.applied
    if source.applied:
        by_role = {node_role(name): count for name, count in source["per_node"].items()}
        assert carried.outliers.per_node
        for name, count in carried.outliers.per_node.items():
            assert count == by_role[node_role(name)], name
        ops = op_counts(out / "model.onnx")
        assert ops["Gather"] >= carried.outliers.nodes


def test_the_task_comes_from_the_directory_where_it_says_which(artifacts, tmp_path):
    from sentence_transformers import CrossEncoder

    from optimize.stages.s1_load import detect_task
    from tests.models import minilm_dir

    assert detect_task(str(minilm_dir()))[0] == "feature-extraction"
    assert detect_task(str(artifacts.source("splade-tiny"))) == (
        "sparse-embedding", "its modules.json (a SparseEncoder: SpladePooling)")
    assert detect_task(str(artifacts.source("colbert-tiny")))[0] == "multi-vector"
    assert detect_task(str(minilm_dir()), pooling="splade")[0] == "sparse-embedding"
    classifier = artifacts.source("sequence-classification")  # a bare BertForSequenceClassification checkpoint
    with pytest.raises(ValueError, match="--task sequence-classification or --task ranking"):
        detect_task(str(classifier))
    cross_encoder = tmp_path / "cross-encoder"
    CrossEncoder(str(artifacts.source("ranking")), device="cpu").save(str(cross_encoder))
    assert detect_task(str(cross_encoder))[0] == "ranking"
    assert detect_task(str(artifacts.source("token-classification")))[0] == "token-classification"


def test_the_cli_says_which_task_it_read_from_the_directory_and_why(artifacts, tmp_path):
    # stopped right after: cuda offers no INT8, which the pipeline refuses before it loads the model
    run = subprocess.run([sys.executable, "-m", "optimize", "optimize", str(artifacts.source("splade-tiny")),
                          "--target", "cuda", "--precision", "int8", "--out", str(tmp_path / "splade")],
                         capture_output=True, text=True)
    assert "multiverse: task sparse-embedding, from its modules.json" in run.stdout, run.stdout + run.stderr
    assert run.returncode == 2 and "cuda offers precisions fp16, fp32, not int8" in run.stderr
    refused = subprocess.run([sys.executable, "-m", "optimize", "optimize",
                              str(artifacts.source("sequence-classification")), "--out", str(tmp_path / "x")],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.count("\n") == 1 and "--task sequence-classification or --task ranking" in refused.stderr
