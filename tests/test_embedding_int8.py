"""Large word-embedding tables stored as INT8 rows: a quarter of the bytes, the same vectors to 1e-4."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from optimize.graph.onnxio import model_bytes
from optimize.options import OptimizeOptions
from optimize.pipeline import optimize
from optimize.stages.s6_quantize.embeddings import quantize_embedding_tables
from tests.models import build_tiny_family


def test_a_looked_up_table_becomes_int8_rows_and_a_fused_one_stays_float(tmp_path, artifact_for):
    source = build_tiny_family("xlm-roberta", "feature-extraction", tmp_path / "source", outliers=False)
    optimize(OptimizeOptions(model=str(source), task="feature-extraction", out=tmp_path / "fp32", target="icelake",
                             precision="fp32"), log=lambda _: None)
    src, dst = tmp_path / "fp32" / "model.onnx", tmp_path / "int8-table.onnx"
    assert quantize_embedding_tables(src, dst) == []  # 4 MB: under the default threshold, nothing changes
    assert quantize_embedding_tables(src, dst, min_bytes=1 << 20) == ["model.embeddings.word_embeddings.weight"]
    tables = {t.name: t.data_type for t in onnx.load(str(dst)).graph.initializer}
    assert tables["model.embeddings.word_embeddings.weight/int8"] == onnx.TensorProto.INT8
    assert "model.embeddings.word_embeddings.weight" not in tables
    assert model_bytes(dst) < 0.4 * model_bytes(src)  # graph and weights file alike
    ids = np.random.default_rng(0).integers(0, 30522, (4, 24))
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    before, after = (ort.InferenceSession(str(path)) for path in (src, dst))
    names = {i.name for i in before.get_inputs()}
    x, y = (session.run(None, {k: v for k, v in feeds.items() if k in names})[0] for session in (before, after))
    cosine = (x * y).sum(-1) / np.linalg.norm(x, axis=-1) / np.linalg.norm(y, axis=-1)
    assert cosine.min() >= 0.9999, cosine.min()
    # BERT's fused EmbedLayerNormalization reads its table whole: it is left alone.
    fused = artifact_for("sequence-classification", "fp32", model="distilbert-tiny") / "model.onnx"
    assert quantize_embedding_tables(fused, tmp_path / "unchanged.onnx", min_bytes=1) == []
