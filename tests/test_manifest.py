import json
from pathlib import Path

import pytest

from infinity.artifact import sha256_file, verify_checksums, write_atomically
from infinity.manifest import (
    SCHEMA_VERSION,
    Activations,
    Manifest,
    ManifestError,
    ModelFile,
    Optimization,
    Outliers,
    Parity,
    Precision,
    Quantization,
    Source,
    Target,
    TaskFacts,
    TaskName,
    TokenizerFile,
    WeightType,
)


def make_manifest(directory):
    (directory / "model.onnx").write_bytes(b"model bytes")
    (directory / "tokenizer.json").write_text("{}")
    return Manifest(
        source=Source(model="m", task="sequence-classification", library_versions={"onnx": "1"}),
        target=Target(name="avx2", providers=["CPUExecutionProvider"], required_cpu_flags=["avx2"]),
        model=ModelFile(file="model.onnx", sha256=sha256_file(directory / "model.onnx"), precision="int8", opset=17,
                        inputs={"input_ids": ["batch", "sequence"]}, outputs={"logits": ["batch", 2]}),
        tokenizer=TokenizerFile(file="tokenizer.json", sha256=sha256_file(directory / "tokenizer.json"),
                                max_length=128, pad_id=0),
        task=TaskFacts(id2label={0: "NEG", 1: "POS"}, score_activation="softmax"),
        optimization=Optimization(fusion={"Attention": 2}, quantization=Quantization(activations="per_token")),
        parity=Parity(reference="ref", probe_size=3, metrics={"top1_agreement": 1.0},
                      thresholds={"top1_agreement": 0.99}, passed=True),
    )


def test_manifest_round_trips_through_json(tmp_path):
    manifest = make_manifest(tmp_path)
    manifest.save(tmp_path)
    loaded = Manifest.load(tmp_path)
    assert loaded == manifest
    assert loaded.task.id2label == {0: "NEG", 1: "POS"}  # JSON keys come back as ints


def test_other_schema_versions_are_refused(tmp_path):
    manifest = make_manifest(tmp_path)
    data = manifest.to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="schema version"):
        Manifest.load(tmp_path)


@pytest.mark.parametrize("text", ["not json", "{}", '{"schema_version": 1, "source": {}}'])
def test_malformed_manifests_are_refused(tmp_path, text):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(ManifestError):
        Manifest.load(tmp_path)


def test_a_directory_without_manifest_is_not_an_artifact(tmp_path):
    with pytest.raises(ManifestError, match="not an artifact"):
        Manifest.load(tmp_path)


def test_checksums_catch_an_edited_model(tmp_path):
    manifest = make_manifest(tmp_path)
    verify_checksums(tmp_path, manifest)
    (tmp_path / "model.onnx").write_bytes(b"model bytez")
    with pytest.raises(ManifestError, match="checksum mismatch for model.onnx"):
        verify_checksums(tmp_path, manifest)


def test_write_atomically_replaces_an_existing_artifact(tmp_path):
    old, new = tmp_path / "artifact", tmp_path / "staging"
    old.mkdir()
    (old / "stale").write_text("x")
    new.mkdir()
    (new / "fresh").write_text("y")
    write_atomically(new, old)
    assert [p.name for p in old.iterdir()] == ["fresh"]
    assert not new.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["artifact"]


def edited(directory, **changes):
    """The manifest's JSON with `section.field` (or a top-level key) replaced, as written to disk."""
    data = json.loads(json.dumps(make_manifest(directory).to_dict()))
    for where, value in changes.items():
        section, _, name = where.partition("__")
        if name:
            data[section][name] = value
        else:
            data[section] = value
    (directory / "manifest.json").write_text(json.dumps(data))
    return directory


@pytest.mark.parametrize(("changes", "message"), [
    ({"task__id2label": {"zero": "NEG"}}, "task.id2label keys must be integers, not 'zero'"),
    ({"schema_version": "1"}, "schema_version must be the integer 1, not '1'"),
    ({"model__file": "/etc/hostname"}, "model.file must name a file inside the artifact directory"),
    ({"tokenizer__file": "../tokenizer.json"}, "tokenizer.file must name a file inside the artifact directory"),
    ({"tokenizer__max_length": "512"}, "tokenizer.max_length must be an integer, not '512'"),
    ({"tokenizer__max_length": 0}, "tokenizer.max_length must be at least 1"),
    ({"model__sha256": "abc"}, "model.sha256 must be 64 lowercase hex digits"),
    ({"task__pooling": "median"}, "task.pooling must be one of cls, mean, max, mean_sqrt_len_tokens"),
    ({"task__pooling": "cls+median"}, "task.pooling must be one of cls, mean"),
    ({"task__default_prompt_name": "query"}, "task.default_prompt_name must be one of the prompts (none)"),
    ({"parity__passed": "yes"}, "parity.passed must be true or false"),
    ({"target__providers": []}, "target.providers must name at least one"),
    ({"source__extra": 1}, "unknown field source.extra"),
    ({"task": [1]}, "task must be an object"),
])
def test_every_field_is_checked_with_a_one_line_error(tmp_path, changes, message):
    with pytest.raises(ManifestError) as caught:
        Manifest.load(edited(tmp_path, **changes))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_schema_version_of_another_number_is_named(tmp_path):
    with pytest.raises(ManifestError, match=r"schema version 2 is not supported \(expected 1\)"):
        Manifest.load(edited(tmp_path, schema_version=2))


def test_a_file_linked_from_outside_the_artifact_is_refused(tmp_path):
    artifact, outside = tmp_path / "artifact", tmp_path / "outside.onnx"
    artifact.mkdir()
    manifest = make_manifest(artifact)
    outside.write_bytes((artifact / "model.onnx").read_bytes())
    (artifact / "model.onnx").unlink()
    (artifact / "model.onnx").symlink_to(outside)
    with pytest.raises(ManifestError, match="model.onnx leads outside the artifact directory"):
        verify_checksums(artifact, manifest)


@pytest.mark.parametrize(("model", "public"), [
    ("sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"),
    ("/home/builder/models/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"),
    ("/home/builder/models/all-MiniLM-L6-v2/", "all-MiniLM-L6-v2"),
    ("./models/minilm", "minilm"),
    ("~/minilm", "minilm"),
    ("C:\\models\\minilm", "minilm"),
])
def test_the_public_model_id_never_shows_a_build_host_path(tmp_path, model, public):
    manifest = make_manifest(tmp_path)
    manifest.source.model = model
    assert manifest.public_model_id == public


# the quantization record as the optimizer wrote it before it was typed (a per-token MiniLM artifact)
EARLIER_QUANTIZATION = {
    "activation_type": "QUInt8", "activations": "per_token", "batch_invariant": True, "calibration_inputs": 18,
    "candidates": 24, "kept_float": 0, "latency_host": "AMD EPYC",
    "latency_ms": {"final": {"b1_seq8": 0.99}, "fp32": {"b1_seq8": 1.98}}, "mode": "per_token",
    "op_types": ["MatMul", "Attention"], "per_channel": True, "reduce_range": True, "split_outliers": True,
    "outliers": {"applied": False, "reason": "per-token recipe"}, "smoothing_alpha": 0.5, "trials": 1,
    "smoothing": {"one_sided_gelu_inputs": 6, "quantized": 24, "smoothed_inputs": 24,
                  "smoothing_folded_into_weights": 6},
    "full_int8_metrics": {"cosine_min": 0.99}, "weight_bits": 7, "weight_type": "QInt8", "why": "Generic AVX2",
}


def test_an_earlier_untyped_quantization_record_loads_typed(tmp_path):
    manifest = make_manifest(tmp_path)
    data = manifest.to_dict()
    data["optimization"]["quantization"] = EARLIER_QUANTIZATION
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    q = Manifest.load(tmp_path).optimization.quantization
    assert isinstance(q, Quantization)
    assert (q.activations, q.weight_bits, q.reduce_range, q.smoothing["smoothed_inputs"]) == ("per_token", 7, True, 24)
    assert q.weight_bits_why == ""  # not recorded then


def test_an_unknown_or_mistyped_quantization_field_is_named(tmp_path):
    manifest = make_manifest(tmp_path)
    data = manifest.to_dict()
    data["optimization"]["quantization"] = {**EARLIER_QUANTIZATION, "bits": 8}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="optimization.quantization.bits"):
        Manifest.load(tmp_path)
    data["optimization"]["quantization"] = {**EARLIER_QUANTIZATION, "weight_bits": "eight"}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="optimization.quantization.weight_bits must be an integer"):
        Manifest.load(tmp_path)


def test_the_first_manifest_shape_still_loads():
    """The manifest of the optimizer's first release (tests/manifests/first.json: its fields and its untyped
    quantization record, whose "mode" was the only name of the activation scheme) reads as today's dataclasses."""
    data = json.loads((Path(__file__).with_name("manifests") / "first.json").read_text())
    manifest = Manifest.from_dict(data)
    assert manifest.source.task is TaskName.FEATURE_EXTRACTION and manifest.model.precision is Precision.INT8
    q = manifest.optimization.quantization
    assert isinstance(q, Quantization) and q.activations is Activations.PER_TENSOR and not q.batch_invariant
    assert q.weight_type is WeightType.QINT8 and q.candidates == 38 and q.outliers == Outliers()
    assert manifest.parity.passed and manifest.parity.provider == ""  # not recorded then
    assert manifest.to_dict()["optimization"]["quantization"]["activations"] == "per_tensor"
    assert json.loads(json.dumps(manifest.to_dict()))["source"]["task"] == "feature-extraction"
