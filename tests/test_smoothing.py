"""Each input's smoothing strength is chosen by simulating the INT8 graph in numpy: the simulation must be the graph."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infinity.engine.hostinfo import cpu_flags
from optimize.presets import VNNI_FLAGS
from optimize.stages.s6_quantize.calibrate import calibrate
from optimize.stages.s6_quantize.per_token import quantize_per_token
from optimize.stages.s6_quantize.smoothing import choose_strengths, simulated_products
from tests.test_outliers import run

# 8-bit weights where this host sums u8 x s8 products in 32 bits (VNNI); 7 elsewhere, as the recipes build them:
# 8-bit ones saturate VPMADDUBSW's int16 pair sums on AVX2 and AVX-512 without VNNI
BITS = 8 if set(VNNI_FLAGS) & cpu_flags() else 7

HIDDEN, OUT = 16, 8
ROLES = {"row": frozenset(), "gelu": frozenset(), "calibrated": frozenset({"normalized"})}


def one_matmul(path, scheme: str, rng: np.random.Generator) -> np.ndarray:
    """x -> (nothing | Gelu | LayerNormalization) -> MatMul: an input of each quantization scheme."""
    weight = rng.normal(0, 0.3, (HIDDEN, OUT)).astype(np.float32)
    gamma = np.ones(HIDDEN, np.float32)
    gamma[3] = 30.0  # an outlier channel, as trained LayerNorms grow
    before = {"row": [],
              "gelu": [helper.make_node("Gelu", ["x"], ["h"], name="gelu", domain="com.microsoft")],
              "calibrated": [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], name="ln",
                                              axis=-1)]}[scheme]
    source = "h" if before else "x"
    nodes = [*before, helper.make_node("MatMul", [source, "w"], ["y"], name="mm")]
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(gamma, "gamma"),
             numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "beta")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", HIDDEN]),
                                           helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                                         ["b", "s"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", OUT])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(path))
    return weight


def feeds(rng: np.random.Generator, batch: int = 3) -> dict[str, np.ndarray]:
    x = rng.normal(0, 1, (batch, 7, HIDDEN)).astype(np.float32)
    x[:, :, 5] *= 12  # a channel of large values in every row
    mask = np.ones((batch, 7), np.int64)
    mask[0, 4:] = 0
    return {"x": x, "attention_mask": mask}


@pytest.mark.parametrize("alpha", [None, 0.2, 0.8])
@pytest.mark.parametrize("scheme", list(ROLES))
def test_the_simulated_int8_product_is_the_graphs(tmp_path, scheme, alpha):
    rng = np.random.default_rng(7)
    path = tmp_path / "g.onnx"
    weight = one_matmul(path, scheme, rng)
    calibration = calibrate(path, ["mm"], [feeds(rng) for _ in range(3)])
    quantize_per_token(path, tmp_path / "q.onnx", calibration.bounds, weight_bits=BITS,
                       calibrated_roles=ROLES[scheme], alphas={"h" if scheme != "row" else "x": alpha})
    held_out = feeds(rng, 4)
    rows = calibrate(path, ["mm"], [held_out], samples=True).samples["h" if scheme != "row" else "x"]
    real = held_out["attention_mask"].astype(bool)
    graph = run(tmp_path / "q.onnx", held_out)[real]
    simulated = simulated_products(rows, calibration.bounds["mm"], [weight], alpha, scheme, BITS)[0]
    exact = rows @ weight
    assert np.abs(graph - exact).max() > 1e-3  # INT8 really moved the answer
    np.testing.assert_allclose(simulated, graph, rtol=1e-4, atol=1e-4 * np.abs(exact).max())


def test_the_chosen_strength_is_the_one_whose_graph_is_closest_on_held_out_rows(tmp_path):
    rng = np.random.default_rng(11)
    path = tmp_path / "g.onnx"
    one_matmul(path, "row", rng)
    calibration = calibrate(path, ["mm"], [feeds(rng) for _ in range(6)], samples=True)
    grid = (0.2, 0.5, 0.8)
    chosen = choose_strengths(path, calibration, grid, BITS, frozenset())["x"]
    held_out = feeds(rng, 8)
    real = held_out["attention_mask"].astype(bool)
    exact = run(path, held_out)[real]
    errors = {}
    for alpha in (None, *grid):
        quantize_per_token(path, tmp_path / "q.onnx", calibration.bounds, weight_bits=BITS, alphas={"x": alpha})
        errors[alpha] = float(np.linalg.norm(run(tmp_path / "q.onnx", held_out)[real] - exact))
    assert errors[chosen] <= 1.05 * min(errors.values()), (chosen, errors)
    assert errors[chosen] < errors[None]  # the large channel is worth smoothing


def test_a_pooled_input_as_wide_as_the_sequence_is_long_is_calibrated_whole(tmp_path):
    """[batch, hidden] with hidden == the sequence length: not a [batch, sequence] of tokens to mask."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["p"], name="pool", keepdims=0),
             helper.make_node("MatMul", ["p", "w"], ["y"], name="mm")]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "axes"),
             numpy_helper.from_array(rng.normal(0, 0.3, (HIDDEN, OUT)).astype(np.float32), "w")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", HIDDEN]),
                                           helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                                         ["b", "s"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", OUT])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(tmp_path / "g.onnx"))
    mask = np.ones((3, HIDDEN), np.int64)
    mask[0, 5:] = 0
    feeds = {"x": rng.normal(0, 1, (3, HIDDEN, HIDDEN)).astype(np.float32), "attention_mask": mask}
    calibration = calibrate(tmp_path / "g.onnx", ["mm"], [feeds], samples=True)
    pooled = feeds["x"].mean(axis=1)
    np.testing.assert_allclose(calibration.samples["p"], pooled, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(calibration.bounds["mm"][1], pooled.max(axis=0), rtol=1e-5, atol=1e-6)
