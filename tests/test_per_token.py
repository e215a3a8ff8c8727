"""Per-token INT8 on a small graph: one scale per row, so a row's answer is the same alone and in a batch."""
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infinity.engine.hostinfo import cpu_flags
from optimize.graph.onnxio import activation_shapes
from optimize.presets import VNNI_FLAGS
from optimize.stages.s6_quantize.calibrate import activation_bounds
from optimize.stages.s6_quantize.config import QuantizationConfig
from optimize.stages.s6_quantize.per_tensor import quantize
from optimize.stages.s6_quantize.per_token import (
    GELU_ZERO,
    calibrated_scale,
    per_token_candidates,
    quantize_per_token,
)
from optimize.stages.s6_quantize.rounding import quantize_weight
from tests.test_outliers import graph, run  # noqa: F401  (the fixture)

# 8-bit weights where this host sums u8 x s8 products in 32 bits (VNNI); 7 elsewhere, as the recipes build them:
# 8-bit ones saturate VPMADDUBSW's int16 pair sums on AVX2 and AVX-512 without VNNI
BITS = 8 if set(VNNI_FLAGS) & cpu_flags() else 7


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
    bounds = activation_bounds(path, nodes, calibration)
    record = quantize_per_token(path, tmp_path / "pt.onnx", bounds, weight_bits=7)
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
    bounds = activation_bounds(path, per_token_candidates(path), calibration)
    quantize_per_token(path, tmp_path / "pt.onnx", bounds, weight_bits=BITS)
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


def test_a_fused_checkpoints_inputs_share_their_zero_points(minilm_int8_artifact):
    """Symbolic shape inference has to follow the fused graph with its weights held aside; where it could not,
    each prologue shaped a zero point of its own, two operators more per input (MiniLM b1 s8: 10 % slower)."""
    model = onnx.load(str(minilm_int8_artifact / "model.onnx"), load_external_data=False)
    shared = [n for n in model.graph.node if n.name.startswith("per_token/zero_point/") and n.op_type == "Expand"]
    assert shared and "Expand" not in prologue_ops(model) and prologue_ops(model)["QuantizeLinear"] > 0


def test_a_row_of_zeros_gives_zeros_and_a_row_is_bit_identical_in_any_batch(graph, tmp_path):  # noqa: F811
    path, calibration, held_out = graph
    bounds = activation_bounds(path, per_token_candidates(path), calibration)
    quantize_per_token(path, tmp_path / "pt.onnx", bounds, weight_bits=BITS)
    zeros = {"x": np.zeros_like(held_out["x"][:1]), "attention_mask": held_out["attention_mask"][:1]}
    assert np.isfinite(run(tmp_path / "pt.onnx", zeros)).all()
    # every row alone, then in batches of every size: the same bits
    alone = [run(tmp_path / "pt.onnx", {k: v[row:row + 1] for k, v in held_out.items()})[0]
             for row in range(len(held_out["x"]))]
    for size in range(2, len(held_out["x"]) + 1):
        batched = run(tmp_path / "pt.onnx", {k: v[:size] for k, v in held_out.items()})
        for row in range(size):
            assert np.array_equal(batched[row], alone[row]), (size, row)


def save_graph(path, nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray], hidden: int) -> None:
    """x [b, s, hidden] and an int64 attention_mask in, y [b, s, hidden] out."""
    body = helper.make_graph(
        nodes, path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", hidden]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", hidden])],
        [numpy_helper.from_array(value, name) for name, value in constants.items()])
    onnx.save(helper.make_model(body, opset_imports=[helper.make_opsetid("", 17),
                                                 helper.make_opsetid("com.microsoft", 1)]), str(path))


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
    path = tmp_path / "attention.onnx"
    save_graph(path, nodes, {"qkv": qkv, "bias": bias, "out": out, "out_bias": out_bias}, hidden)
    quantize_per_token(path, tmp_path / "pt.onnx", None, weight_bits=BITS)
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


def encoder_layer(path, rng: np.random.Generator, hidden: int = 32, heads: int = 4) -> None:
    """LayerNorm -> Attention -> out projection + bias + residual -> LayerNorm -> FFN (BiasGelu) -> bias: every
    input role once, with biases large enough that one added in the wrong place shows."""
    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return rng.normal(0, scale, shape).astype(np.float32)

    inits = {"gamma": 1 + weight(hidden), "beta": weight(hidden), "qkv": weight(hidden, 3 * hidden),
             "qkv_bias": weight(3 * hidden, scale=1.0), "out": weight(hidden, hidden), "out_bias": weight(hidden),
             "gamma2": 1 + weight(hidden), "beta2": weight(hidden), "ffn1": weight(hidden, 4 * hidden),
             "ffn1_bias": weight(4 * hidden, scale=1.0), "ffn2": weight(4 * hidden, hidden),
             "ffn2_bias": weight(hidden, scale=1.0)}
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], name="ln", axis=-1),
             helper.make_node("Cast", ["attention_mask"], ["mask32"], name="mask/Cast", to=TensorProto.INT32),
             helper.make_node("Attention", ["n", "qkv", "qkv_bias", "mask32"], ["a"], name="Attention_0",
                              domain="com.microsoft", num_heads=heads),
             helper.make_node("MatMul", ["a", "out"], ["o"], name="out/MatMul"),
             helper.make_node("Add", ["o", "out_bias"], ["ob"], name="out/AddBias"),
             helper.make_node("Add", ["ob", "n"], ["r"], name="residual"),
             helper.make_node("LayerNormalization", ["r", "gamma2", "beta2"], ["n2"], name="ln2", axis=-1),
             helper.make_node("MatMul", ["n2", "ffn1"], ["f"], name="ffn1/MatMul"),
             helper.make_node("BiasGelu", ["f", "ffn1_bias"], ["g"], name="gelu", domain="com.microsoft"),
             helper.make_node("MatMul", ["g", "ffn2"], ["f2"], name="ffn2/MatMul"),
             helper.make_node("Add", ["f2", "ffn2_bias"], ["y"], name="ffn2/AddBias")]
    save_graph(path, nodes, inits, hidden)


def test_calibrated_inputs_scale_and_add_the_bias_in_the_kernel_and_rows_stay_batch_invariant(tmp_path):
    rng = np.random.default_rng(2)
    path = tmp_path / "layer.onnx"
    encoder_layer(path, rng)

    def feeds(batch: int) -> dict[str, np.ndarray]:
        mask = np.ones((batch, 9), np.int64)
        mask[0, 5:] = 0
        return {"x": rng.normal(0, 1, (batch, 9, 32)).astype(np.float32), "attention_mask": mask}

    calibration = [feeds(4) for _ in range(4)]
    bounds = activation_bounds(path, per_token_candidates(path), calibration)
    every_row = quantize_per_token(path, tmp_path / "rows.onnx", bounds, weight_bits=BITS)
    record = quantize_per_token(path, tmp_path / "pt.onnx", bounds, weight_bits=BITS,
                                calibrated_roles=frozenset({"normalized", "context"}))
    assert every_row.calibrated == 0 and record.calibrated == 3  # the two LayerNorm outputs and the attention's
    model = onnx.load(str(tmp_path / "pt.onnx"))
    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    matmuls = {n.name: n for n in model.graph.node if n.op_type == "MatMulIntegerToFloat"}
    for name, matmul in matmuls.items():
        one_scale = name != "ffn2/MatMul/MatMulInteger"  # the GELU output keeps a scale per row
        assert (matmul.input[2] in constants and constants[matmul.input[2]].shape == ()) == one_scale, name
    # the biases of Q, the out projection and the FFN's first MatMul are added in their kernels
    assert {n for n, m in matmuls.items() if len(m.input) > 6} == {
        "Attention_0/MatMulInteger_q", "out/MatMul/MatMulInteger", "ffn1/MatMul/MatMulInteger"}
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Gelu"] == 1 and "BiasGelu" not in ops
    # the GELU output is not shifted: its zero point holds its floor
    assert sorted(n.name for n in model.graph.node if n.op_type == "Add") == ["ffn2/AddBias", "residual"]
    # one QuantizeLinear per input; only the GELU output finds its rows' peaks (ReduceMax, the step Mul and the
    # least step's Max)
    assert prologue_ops(model) == Counter({"QuantizeLinear": 4, "ReduceMax": 1, "Mul": 1, "Max": 1})
    quantize = next(n for n in model.graph.node if n.name == "g/q/QuantizeLinear")
    assert len(quantize.input) == 3 and constants["ffn2/MatMul/a_zero"] == GELU_ZERO

    held_out = feeds(5)
    real = held_out["attention_mask"].astype(bool)
    reference = run(path, held_out)
    quantized, per_row = run(tmp_path / "pt.onnx", held_out), run(tmp_path / "rows.onnx", held_out)
    scale = np.abs(reference[real]).mean()
    assert np.abs(quantized - reference)[real].mean() < 0.03 * scale
    assert np.abs(quantized - per_row)[real].mean() < 0.03 * scale
    for row in range(5):
        length = int(real[row].sum())
        alone = run(tmp_path / "pt.onnx", {k: v[row:row + 1, :length] for k, v in held_out.items()})
        assert np.array_equal(alone[0], quantized[row, :length]), row


def test_a_calibrated_scale_spreads_min_to_max_over_256_codes_and_holds_zero():
    scale, zero = calibrated_scale((np.array([-1.0, -3.0]), np.array([2.0, 7.1])), None)
    assert scale == pytest.approx(10.1 / 255) and zero == round(3.0 / scale)
    scale, zero = calibrated_scale((np.array([0.5, 1.0]), np.array([2.0, 4.0])), np.array([1.0, 0.25]))
    assert scale == pytest.approx(2.0 / 255) and zero == 0  # smoothed: max 2.0 and 1.0; widened down to 0


def test_shape_inference_that_stops_incomplete_leaves_no_file_behind(tmp_path, monkeypatch):
    """onnxruntime's tool saves the graph it could not complete into the working directory; the optimizer's
    inference runs in a scratch one, so a user's directory stays as it was."""
    nodes = [helper.make_node("Mystery", ["x"], ["h"], name="unknown", domain="example.custom"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    body = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("example.custom", 1)])
    monkeypatch.chdir(tmp_path)
    assert activation_shapes(model) == {}
    assert list(tmp_path.iterdir()) == []


def test_a_written_attentions_context_is_smoothed_in_its_value_projection_and_its_rows_share_zero_points(tmp_path):
    """ONNX's Attention over merged projections (the fusion's rewrite of a written-out attention): dividing V's
    output columns divides the context's channels, so smoothing the context costs no Mul; and shape inference
    follows the graph past the attention, so the context's per-row prologue takes the shared zero point."""
    from optimize.attention.written import written_attention
    from tests.test_fuse import _feeds, _written_attention_graph

    model, count = written_attention(_written_attention_graph())
    assert count == 2
    for index, node in enumerate(model.graph.node):  # as an export names them: the INT8 nodes are named after them
        node.name = node.name or f"{node.op_type}_{index}"
    path = tmp_path / "written.onnx"
    onnx.save(model, str(path))
    rng = np.random.default_rng(2)
    calibration = []
    for _ in range(3):
        feeds = {**_feeds(), "x": rng.normal(0, 1, (3, 6, 8)).astype(np.float32)}
        calibration.append({**feeds, "attention_mask": (feeds["mask"][:, 0, 0] == 0).astype(np.int64)})
    bounds = activation_bounds(path, per_token_candidates(path), calibration)
    record = quantize_per_token(path, tmp_path / "pt.onnx", bounds, weight_bits=BITS)
    quantized = onnx.load(str(tmp_path / "pt.onnx"))
    assert len(record.quantized) == 6 and record.smoothed_inputs == 2 and record.smoothing_folded == 1
    assert not [n for n in quantized.graph.node if n.op_type == "Mul" and "layer0/out" in n.input]
    assert prologue_ops(quantized)["QuantizeLinear"] == 2 and "Expand" not in prologue_ops(quantized)

    feeds = _feeds()
    want = run(path, feeds)
    have = run(tmp_path / "pt.onnx", feeds)
    assert np.abs(have - want).mean() < 0.02 * np.abs(want).mean()
    for row in range(len(feeds["x"])):
        alone = run(tmp_path / "pt.onnx", {**feeds, "x": feeds["x"][row:row + 1], "mask": feeds["mask"][row:row + 1]})
        assert np.array_equal(alone[0], have[row]), row
