"""The quantizer leaves the process's logging as it found it."""
import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from optimize.stages.s6_quantize.config import QuantizationConfig
from optimize.stages.s6_quantize.per_tensor import quantize


def test_quantizing_does_not_change_the_root_logger(tmp_path):
    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.INFO)
    try:
        quantize(tmp_path / "m.onnx", tmp_path / "q.onnx", QuantizationConfig(activations="per_tensor"))
        assert root.level == logging.INFO
    finally:
        root.setLevel(before)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul"}
