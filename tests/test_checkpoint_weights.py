"""What a checkpoint must carry for its task, read from transformers' own load: weights the model needs and the
checkpoint lacks, or holds in other shapes, are refused at export in one line, never started from random values;
a base model's pooler, which no embedding graph reads, is let through; transformers' load report stays quiet where
the export has checked."""
from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from optimize.stages.s1_load import load_source
from optimize.stages.s2_export import export_onnx
from optimize.tasks.base import CheckedLoadReport, UnsupportedModel
from tests.models import minilm_dir, transformers_files

Weights = dict[str, np.ndarray]


def rewritten(model: Path, out: Path, change: Callable[[Weights], Weights]) -> Path:
    """A copy of a sentence-transformers directory with its weights file changed."""
    shutil.copytree(model, out, ignore=shutil.ignore_patterns("pytorch_model.bin"))
    save_file(change(load_file(out / "model.safetensors")), out / "model.safetensors", metadata={"format": "pt"})
    return out


def without(prefix: str) -> Callable[[Weights], Weights]:
    return lambda weights: {name: value for name, value in weights.items() if not name.startswith(prefix)}


@pytest.mark.parametrize("task", ["sequence-classification", "ranking", "token-classification"])
def test_a_model_without_a_classifier_is_refused_not_run_on_random_weights(tmp_path: Path, task: str) -> None:
    bare = transformers_files(minilm_dir(), tmp_path / "bert")  # a BertModel: no classifier
    if task == "ranking":  # one label, as a cross-encoder's config says
        config = json.loads((bare / "config.json").read_text())
        (bare / "config.json").write_text(json.dumps({**config, "id2label": {"0": "score"}, "label2id": {"score": 0}}))
    with pytest.raises(UnsupportedModel, match=f"has no trained {task} head .*classifier.*--task feature-extraction"):
        export_onnx(load_source(str(bare), task), tmp_path / "model.onnx")


def test_a_checkpoint_missing_encoder_weights_is_refused_in_one_line(tmp_path: Path) -> None:
    query_key_value = "encoder.layer.3.attention.self."
    partial = rewritten(minilm_dir(), tmp_path / "partial", without(query_key_value))
    with pytest.raises(UnsupportedModel) as refused:
        export_onnx(load_source(str(partial), "feature-extraction"), tmp_path / "model.onnx")
    message = str(refused.value)
    assert message.startswith(f"partial has no trained weights for {query_key_value}")
    assert message.endswith(" and 3 more: transformers would start them from random values; pass the complete "
                            "checkpoint")
    assert "\n" not in message
    assert not (tmp_path / "model.onnx").exists()


def test_weights_in_other_shapes_than_the_config_says_are_refused_in_one_line(tmp_path: Path) -> None:
    ffn = "encoder.layer.2.intermediate.dense.weight"
    cut = rewritten(minilm_dir(), tmp_path / "cut", lambda weights: {**weights, ffn: weights[ffn][:1000]})
    with pytest.raises(UnsupportedModel) as refused:
        export_onnx(load_source(str(cut), "feature-extraction"), tmp_path / "model.onnx")
    assert str(refused.value) == (f"cut's weights do not fit its config.json: {ffn} is [1000, 384] in the checkpoint "
                                  "and [1536, 384] in the model")


def test_multiverse_leaves_transformers_logging_as_it_found_it(capsys: pytest.CaptureFixture[str]) -> None:
    """The load report's filter is for the command's run only: a process that calls the CLI in-process (the suite's
    artifact cache does) still hears transformers' report afterwards (the test below, in the same process)."""
    from optimize.cli import main

    logger = logging.getLogger("transformers.modeling_utils")
    before = list(logger.filters)
    assert main(["targets"]) == 0
    assert logger.filters == before


def test_a_pooler_no_embedding_graph_reads_may_be_missing_and_its_report_stays_quiet(tmp_path: Path) -> None:
    from transformers import AutoModel

    partial = rewritten(minilm_dir(), tmp_path / "nopooler", without("pooler."))
    names, _ = export_onnx(load_source(str(partial), "feature-extraction"), tmp_path / "model.onnx")
    assert names == ["input_ids", "attention_mask", "token_type_ids"]

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("transformers.modeling_utils")
    checked = CheckedLoadReport()
    logger.addHandler(handler)
    try:
        AutoModel.from_pretrained(partial)
        assert any("LOAD REPORT" in message and "pooler.dense.weight" in message for message in seen)
        seen.clear()
        logger.addFilter(checked)
        AutoModel.from_pretrained(partial)
        assert not any("LOAD REPORT" in message for message in seen)
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(checked)
