"""SkipLayerNormalization written back as Add + LayerNormalization: the same function, kept so at load."""
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from infinity.engine import DISABLED_OPTIMIZERS
from optimize.fuse import split_skip_layer_norms


def _graph(with_bias: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    hidden = 16
    inits = [numpy_helper.from_array(rng.normal(1, 0.1, hidden).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.normal(0, 0.1, hidden).astype(np.float32), "beta"),
             numpy_helper.from_array(rng.normal(0, 1, (hidden, hidden)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 1, hidden).astype(np.float32), "bias")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="dense/MatMul"),
             helper.make_node("SkipLayerNormalization", ["h", "x", "gamma", "beta", *(["bias"] if with_bias else [])],
                              ["y"], name="SkipLayerNorm_0", domain="com.microsoft", epsilon=1e-12)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", hidden])]
    graph = helper.make_graph(nodes, "skip", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", hidden])], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _run(model: onnx.ModelProto, x: np.ndarray, saved: str | None = None) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if saved:
        options.optimized_model_filepath = saved
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=DISABLED_OPTIMIZERS)  # as the server loads it
    return session.run(None, {"x": x})[0]


def test_split_keeps_the_function_and_onnxruntime_keeps_the_split(tmp_path):
    x = np.random.default_rng(1).normal(0, 1, (2, 5, 16)).astype(np.float32)
    for with_bias in (True, False):
        model = _graph(with_bias)
        reference = _run(model, x)
        assert split_skip_layer_norms(model.graph) == 1
        ops = [n.op_type for n in model.graph.node]
        assert ops == ["MatMul", *(["Add"] if with_bias else []), "Add", "LayerNormalization"]
        if with_bias:  # the bias is added first, straight to the MatMul's output, where corrections fold into it
            assert list(model.graph.node[1].input) == ["h", "bias"]
        saved = str(tmp_path / f"loaded_{with_bias}.onnx")
        np.testing.assert_allclose(_run(model, x, saved), reference, rtol=1e-5, atol=1e-5)
        loaded = [n.op_type for n in onnx.load(saved).graph.node]
        assert "LayerNormalization" in loaded and "SkipLayerNormalization" not in loaded, loaded


def test_a_node_whose_statistics_are_read_stays_fused():
    model = _graph(True)
    node = model.graph.node[1]
    node.output.extend(["mean"])
    model.graph.output.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, None))
    assert split_skip_layer_norms(model.graph) == 0
    assert [n.op_type for n in model.graph.node] == ["MatMul", "SkipLayerNormalization"]
