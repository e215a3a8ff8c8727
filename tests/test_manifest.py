import json

import pytest

from infinity.manifest import (SCHEMA_VERSION, Manifest, ManifestError, ModelFile, Optimization, Parity, Source,
                               Target, TaskFacts, TokenizerFile, sha256_file, verify_checksums, write_atomically)


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
        optimization=Optimization(fusion={"Attention": 2}, quantization={"weight_type": "QInt8"}),
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
