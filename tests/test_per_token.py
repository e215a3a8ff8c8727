"""Per-token INT8 on a small graph: one scale per row, so a row's answer is the same alone and in a batch."""
from collections import Counter

import numpy as np
import onnx

from optimize.outliers import activation_ranges
from optimize.per_token import per_token_candidates, quantize_per_token, quantize_weight
from optimize.presets import QuantizationConfig
from optimize.quantize import quantize
from tests.test_outliers import graph, run  # noqa: F401  (the fixture)


def test_weights_are_symmetric_per_column_within_their_bits():
    weight = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32) * np.array([1, 10, 100, 0.01])
    for bits, limit in ((7, 63), (8, 127)):
        codes, scale = quantize_weight(weight, bits)
        assert np.abs(codes).max(axis=0).tolist() == [limit] * 4
        np.testing.assert_allclose(codes * scale, weight, atol=scale.max() / 2 + 1e-7)


def test_rows_answer_alike_alone_and_batched_and_closer_than_per_tensor(graph, tmp_path):  # noqa: F811
    path, calibration, held_out = graph
    nodes = per_token_candidates(path)
    assert set(nodes) == {"ffn/MatMul", "Attention_0", "out/MatMul"}
    ranges = activation_ranges(path, nodes, calibration)
    record = quantize_per_token(path, tmp_path / "pt.onnx", ranges, weight_bits=7)
    assert len(record.quantized) == 3 and record.smoothed_inputs == 3
    ops = Counter(n.op_type for n in onnx.load(str(tmp_path / "pt.onnx")).graph.node)
    assert ops["MatMulIntegerToFloat"] == 3 and ops["MultiHeadAttention"] == 1
    assert not {"DynamicQuantizeLinear", "MatMul", "Attention"} & set(ops)

    batched = run(tmp_path / "pt.onnx", held_out)
    for row in range(len(held_out["x"])):
        length = int(held_out["attention_mask"][row].sum())
        alone = run(tmp_path / "pt.onnx", {"x": held_out["x"][row:row + 1, :length],
                                          "attention_mask": held_out["attention_mask"][row:row + 1, :length]})
        assert np.array_equal(alone[0], batched[row, :length]), row

    reference = run(path, held_out)
    quantize(path, tmp_path / "dynamic.onnx", QuantizationConfig(reduce_range=True, activations="per_tensor"))
    per_token = np.abs(batched - reference).mean()
    assert per_token < np.abs(run(tmp_path / "dynamic.onnx", held_out) - reference).mean()
    assert per_token < 0.05 * np.abs(reference).mean()


def test_excluded_nodes_stay_float(graph, tmp_path):  # noqa: F811
    path, calibration, _ = graph
    record = quantize_per_token(path, tmp_path / "pt.onnx", None, exclude=["Attention_0"])
    ops = Counter(n.op_type for n in onnx.load(str(tmp_path / "pt.onnx")).graph.node)
    assert record.quantized == ["ffn/MatMul", "out/MatMul"] and ops["Attention"] == 1 and record.smoothed_inputs == 0
