"""Outlier channels and smoothing: the float function is unchanged, and INT8 of the rewrite is closer to it."""
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.stages.s6_quantize.calibrate import activation_ranges
from optimize.stages.s6_quantize.config import QuantizationConfig
from optimize.stages.s6_quantize.outliers import MAX_CHANNELS, outlier_channels, split_outliers
from optimize.stages.s6_quantize.per_tensor import quantize

HIDDEN, HEADS, OUTLIERS = 64, 4, (3, 17, 40)


def activations(rng: np.random.Generator, batch: int = 4, seq: int = 12) -> np.ndarray:
    """Hidden states shaped like a post-LayerNorm encoder's: a few channels ~30x the rest, largest on token 0."""
    x = rng.normal(0, 1, (batch, seq, HIDDEN)).astype(np.float32)
    x[:, :, list(OUTLIERS)] *= 8
    x[:, 0, list(OUTLIERS)] = 30
    return x


def build_graph(path, rng: np.random.Generator) -> None:
    """x -> MatMul -> Attention(num_heads) -> MatMul: the node kinds the optimizer rewrites."""
    w1 = rng.normal(0, 0.1, (HIDDEN, HIDDEN)).astype(np.float32)
    qkv = rng.normal(0, 0.1, (HIDDEN, 3 * HIDDEN)).astype(np.float32)
    w2 = rng.normal(0, 0.1, (HIDDEN, HIDDEN)).astype(np.float32)
    bias = np.zeros(3 * HIDDEN, np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="ffn/MatMul"),
        helper.make_node("Add", ["h1", "x"], ["h"], name="residual"),  # keeps the outliers in the attention input
        helper.make_node("Attention", ["h", "qkv", "bias", "attention_mask"], ["a"], name="Attention_0",
                         domain="com.microsoft", num_heads=HEADS),
        helper.make_node("Add", ["a", "x"], ["r"], name="residual2"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="out/MatMul"),
    ]
    graph = helper.make_graph(
        nodes, "outliers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", HIDDEN]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", HIDDEN])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(qkv, "qkv"),
         numpy_helper.from_array(bias, "bias"), numpy_helper.from_array(w2, "w2")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    onnx.save(model, str(path))


def run(path, feeds) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.fixture
def graph(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "model.onnx"
    build_graph(path, rng)
    calibration = [{"x": activations(rng), "attention_mask": np.ones((4, 12), np.int32)} for _ in range(3)]
    held_out = {"x": activations(rng), "attention_mask": np.ones((4, 12), np.int32)}
    held_out["attention_mask"][1, 7:] = 0
    return path, calibration, held_out


def test_outlier_channels_are_the_ones_far_above_the_median():
    peak = np.ones(100)
    peak[[5, 50]] = [10, 4]
    assert outlier_channels(peak).tolist() == [5, 50]
    assert outlier_channels(peak, ratio=5).tolist() == [5]
    assert outlier_channels(peak, limit=1).tolist() == [5]
    assert len(outlier_channels(np.arange(100.0), ratio=0)) == MAX_CHANNELS


def test_rewrite_keeps_the_float_function_and_brings_int8_closer(graph, tmp_path):
    path, calibration, held_out = graph
    ranges = activation_ranges(path, ["ffn/MatMul", "Attention_0", "out/MatMul"], calibration)
    assert set(np.argsort(ranges["ffn/MatMul"])[-3:]) == set(OUTLIERS)
    split = split_outliers(path, tmp_path / "split.onnx", ranges)
    assert split.channels == {"ffn/MatMul": 3, "out/MatMul": 3} and split.smoothed == ["Attention_0"]
    ops = Counter(n.op_type for n in onnx.load(str(tmp_path / "split.onnx")).graph.node)
    assert ops["MatMul"] == 4 and ops["Gather"] == 2 and ops["Mul"] == 3

    reference = run(path, held_out)
    np.testing.assert_allclose(run(tmp_path / "split.onnx", held_out), reference, rtol=1e-4, atol=1e-4)

    config = QuantizationConfig(reduce_range=True, activations="per_tensor")
    quantize(tmp_path / "split.onnx", tmp_path / "split_int8.onnx", config, exclude=split.float_nodes)
    int8_ops = Counter(n.op_type for n in onnx.load(str(tmp_path / "split_int8.onnx")).graph.node)
    assert int8_ops["QAttention"] == 1 and int8_ops["MatMul"] == 2  # only the float side paths stay MatMul

    def error(model, node) -> float:
        quantize(model, tmp_path / "int8.onnx", config, include=[node])
        return float(np.abs(run(tmp_path / "int8.onnx", held_out) - reference).mean())

    # Each node quantized alone, before and after the rewrite.
    assert error(tmp_path / "split.onnx", "ffn/MatMul") < 0.5 * error(path, "ffn/MatMul")
    assert error(tmp_path / "split.onnx", "out/MatMul") < error(path, "out/MatMul")
    assert error(tmp_path / "split.onnx", "Attention_0") < error(path, "Attention_0")


def test_limits_carry_a_channel_count_instead_of_the_ratio(graph, tmp_path):
    path, calibration, _ = graph
    ranges = activation_ranges(path, ["ffn/MatMul", "out/MatMul"], calibration)
    split = split_outliers(path, tmp_path / "split.onnx", ranges, limits={"ffn/MatMul": 5})
    assert split.channels == {"ffn/MatMul": 5} and split.float_nodes == ["ffn/MatMul/outliers/MatMul"]


def test_ranges_of_an_input_without_the_batch_axis_cover_all_its_rows(tmp_path):
    """DeBERTa multiplies relative position embeddings ([1, positions, hidden], whatever the batch) by weights:
    their range is over every row, where the activations' is over the real tokens only."""
    rng = np.random.default_rng(0)
    positions = rng.normal(size=(1, 5, 8)).astype(np.float32)
    positions[0, 4, 3] = 40.0  # the largest value sits in a row past every input's length
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="tokens/MatMul"),
         helper.make_node("Identity", ["positions"], ["relative"], name="relative/Identity"),
         helper.make_node("MatMul", ["relative", "w2"], ["z"], name="positions/MatMul")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.normal(size=(8, 4)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(size=(8, 4)).astype(np.float32), "w2"),
         numpy_helper.from_array(positions, "positions")])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = rng.normal(size=(3, 2, 8)).astype(np.float32)
    mask = np.array([[1, 1], [1, 0], [1, 1]], np.int64)
    x[1, 1] = 99.0  # padding: never counted
    ranges = activation_ranges(path, ["tokens/MatMul", "positions/MatMul"], [{"x": x, "attention_mask": mask}])
    np.testing.assert_array_equal(ranges["tokens/MatMul"], np.abs(x[mask.astype(bool)]).max(axis=0))
    np.testing.assert_array_equal(ranges["positions/MatMul"], np.abs(positions[0]).max(axis=0))
