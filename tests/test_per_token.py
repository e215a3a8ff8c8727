"""Per-token INT8 on a small graph: one scale per row, so a row's answer is the same alone and in a batch."""
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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
    model = onnx.load(str(tmp_path / "pt.onnx"))
    ops = Counter(n.op_type + ("" if n.domain in ("", "ai.onnx") else f"@{n.domain}") for n in model.graph.node)
    # Q, K, V apart (no Split), then ONNX's own Attention
    assert ops["MatMulIntegerToFloat@com.microsoft"] == 5 and ops["Attention"] == 1
    assert not {"DynamicQuantizeLinear", "MatMul", "Attention@com.microsoft", "MultiHeadAttention@com.microsoft",
                "Split"} & set(ops)

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


def prologue_ops(model: onnx.ModelProto) -> Counter:
    """Operators of the per-input prologues (named after the tensor they quantize: `<tensor>/q/<op>`)."""
    return Counter(n.op_type for n in model.graph.node if "/q/" in n.name)


def test_each_quantized_input_costs_abs_reducemax_scale_and_one_quantizelinear(graph, tmp_path):  # noqa: F811
    path, calibration, _ = graph
    ranges = activation_ranges(path, per_token_candidates(path), calibration)
    quantize_per_token(path, tmp_path / "pt.onnx", ranges, weight_bits=8)
    model = onnx.load(str(tmp_path / "pt.onnx"))
    # the attention mask is made once for every attention, apart from the prologues
    ops = Counter(n.op_type for n in model.graph.node if not n.name.startswith("per_token/attention_mask"))
    inputs = ops["QuantizeLinear"]
    assert inputs == 3  # the attention input, its output and the FFN input: one prologue per tensor
    # no Div, Max, Add or Cast per input, and the row scale goes into the MatMul instead of a Mul after it
    assert not {"Div", "Max", "Cast", "DynamicQuantizeLinear"} & set(ops)
    assert prologue_ops(model) == Counter({"QuantizeLinear": 3, "Mul": 3, "ReduceMax": 3, "Abs": 3})
    # the u8 zero points of all inputs are one shared tensor
    assert ops["Expand"] == 1 and "Expand" not in prologue_ops(model)
    assert {o.domain: o.version for o in model.opset_import}[""] >= 21


def test_a_row_of_zeros_gives_zeros_and_a_row_is_bit_identical_in_any_batch(graph, tmp_path):  # noqa: F811
    path, calibration, held_out = graph
    ranges = activation_ranges(path, per_token_candidates(path), calibration)
    quantize_per_token(path, tmp_path / "pt.onnx", ranges, weight_bits=8)
    zeros = {"x": np.zeros_like(held_out["x"][:1]), "attention_mask": held_out["attention_mask"][:1]}
    assert np.isfinite(run(tmp_path / "pt.onnx", zeros)).all()
    # every row alone, then in batches of every size: the same bits
    alone = [run(tmp_path / "pt.onnx", {k: v[row:row + 1] for k, v in held_out.items()})[0]
             for row in range(len(held_out["x"]))]
    for size in range(2, len(held_out["x"]) + 1):
        batched = run(tmp_path / "pt.onnx", {k: v[:size] for k, v in held_out.items()})
        for row in range(size):
            assert np.array_equal(batched[row], alone[row]), (size, row)


def test_attention_bias_goes_where_it_costs_least_and_the_answer_keeps_it(tmp_path):
    """K's bias is dropped, V's folded into the output projection's bias, Q's one Add: with large biases, a wrong
    move would be far off the float graph."""
    rng = np.random.default_rng(1)
    hidden, heads = 32, 4
    qkv = rng.normal(0, 0.2, (hidden, 3 * hidden)).astype(np.float32)
    bias = rng.normal(0, 1.0, 3 * hidden).astype(np.float32)
    out = rng.normal(0, 0.2, (hidden, hidden)).astype(np.float32)
    out_bias = rng.normal(0, 0.1, hidden).astype(np.float32)
    nodes = [helper.make_node("Cast", ["attention_mask"], ["mask32"], name="mask/Cast", to=TensorProto.INT32),
             helper.make_node("Attention", ["x", "qkv", "bias", "mask32"], ["a"], name="Attention_0",
                              domain="com.microsoft", num_heads=heads),
             helper.make_node("MatMul", ["a", "out"], ["o"], name="out/MatMul"),
             helper.make_node("Add", ["o", "out_bias"], ["y"], name="out/Add")]
    attention = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", hidden]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", hidden])],
        [numpy_helper.from_array(qkv, "qkv"), numpy_helper.from_array(bias, "bias"),
         numpy_helper.from_array(out, "out"), numpy_helper.from_array(out_bias, "out_bias")])
    path = tmp_path / "attention.onnx"
    onnx.save(helper.make_model(attention, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)]), str(path))
    quantize_per_token(path, tmp_path / "pt.onnx", None, weight_bits=8)
    model = onnx.load(str(tmp_path / "pt.onnx"))
    adds = [n for n in model.graph.node if n.op_type == "Add"]
    assert [n.name for n in adds] == ["Attention_0/q/AddBias", "out/Add"]  # no K or V bias Add
    folded = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "out_bias"))
    assert not np.allclose(folded, out_bias)

    x = rng.normal(0, 1, (3, 7, hidden)).astype(np.float32)
    mask = np.ones((3, 7), np.int64)
    mask[1, 4:] = 0
    feeds = {"x": x, "attention_mask": mask}
    reference, quantized = run(path, feeds), run(tmp_path / "pt.onnx", feeds)
    real = mask.astype(bool)
    error = np.abs(quantized - reference)[real].mean()
    assert error < 0.02 * np.abs(reference[real]).mean()
    for row in range(3):  # and a row is the same alone as in its batch
        length = int(mask[row].sum())
        alone = run(tmp_path / "pt.onnx", {"x": x[row:row + 1, :length], "attention_mask": mask[row:row + 1, :length]})
        assert np.array_equal(alone[0], quantized[row, :length]), row


def test_the_recipes_bench_sizes_a_gemm_floor_for_every_cell(graph, tmp_path):  # noqa: F811
    from bench.recipes import CELLS, gemm_floor

    path, _, _ = graph
    quantize_per_token(path, tmp_path / "pt.onnx", None, weight_bits=7)
    floors = gemm_floor(tmp_path / "pt.onnx", calls=2)
    assert set(floors) == set(CELLS)
    assert all(np.isfinite(ms) and ms > 0 and rate > 0 for ms, rate in floors.values())
