"""SkipLayerNormalization written back as Add + LayerNormalization: the same function, kept so at load."""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from infinity.engine.session import DISABLED_OPTIMIZERS
from optimize.attention.padding_mask import MASK
from optimize.attention.written import written_attention
from optimize.stages.s3_fuse import split_skip_layer_norms


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


HEADS, SIZE = 2, 4
WIDTH = HEADS * SIZE


def _written_attention_graph(softmax_read_twice: bool = False, split_read_twice: bool = False,
                             mask: str = "given") -> onnx.ModelProto:
    """Two layers of attention as an export writes it out: the first as MPNet (K^T from [batch, sequence, heads,
    size], scores divided by 8), the second as a rotary family (Q and K turned by cos and sin after the split, K^T
    from [batch, heads, sequence, size], scores multiplied by 1/8); both add the same position bias and padding
    mask. `mask`: "given" as an input [batch, 1, 1, sequence], or computed as transformers does from
    attention_mask ("padding"; "scaled" as older exports did), the same with a window of 2 tokens ("window"), or
    from the token ids ("ids")."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array([0, 0, HEADS, SIZE], np.int64), "heads"),
             numpy_helper.from_array(np.array([0, 0, WIDTH], np.int64), "merged"),
             numpy_helper.from_array(np.array(0.125, np.float32), "eighth"),
             numpy_helper.from_array(np.array(3, np.int64), "three"),
             numpy_helper.from_array(np.array(2, np.int64), "two"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([3], np.int64), "last"),
             numpy_helper.from_array(np.array([2**62], np.int64), "end")]
    nodes = [helper.make_node("Constant", [], ["eight"], value=numpy_helper.from_array(np.array(8.0, np.float32)))]

    def rotate(tensor: str) -> str:
        """tensor x cos + rotate_half(tensor) x sin, the half read from the tensor's shape, as exports write it."""
        p = f"{tensor}/rotary"
        nodes.extend([
            helper.make_node("Shape", [tensor], [f"{p}/shape"]),
            helper.make_node("Gather", [f"{p}/shape", "three"], [f"{p}/size"], axis=0),
            helper.make_node("Div", [f"{p}/size", "two"], [f"{p}/half0"]),
            helper.make_node("Unsqueeze", [f"{p}/half0", "zero"], [f"{p}/half"]),
            helper.make_node("Slice", [tensor, f"{p}/half", "end", "last"], [f"{p}/upper"]),
            helper.make_node("Neg", [f"{p}/upper"], [f"{p}/negated"]),
            helper.make_node("Slice", [tensor, "zero", f"{p}/half", "last"], [f"{p}/lower"]),
            helper.make_node("Concat", [f"{p}/negated", f"{p}/lower"], [f"{p}/turned"], axis=-1),
            helper.make_node("Mul", [tensor, "cos"], [f"{p}/cos"]),
            helper.make_node("Mul", [f"{p}/turned", "sin"], [f"{p}/sin"]),
            helper.make_node("Add", [f"{p}/cos", f"{p}/sin"], [f"{tensor}/rotated"])])
        return f"{tensor}/rotated"

    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", WIDTH]),
              helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, HEADS, "s", "s"]),
              helper.make_tensor_value_info("cos", TensorProto.FLOAT, [1, 1, "s", SIZE]),
              helper.make_tensor_value_info("sin", TensorProto.FLOAT, [1, 1, "s", SIZE])]
    if mask == "given":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["b", 1, 1, "s"]))
    else:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"]))
        nodes += _computed_mask(mask, inits, inputs)
    x = "x"
    for layer, k_perm in enumerate(((0, 2, 3, 1), (0, 1, 3, 2))):
        p = f"layer{layer}"
        for part in "qkv":
            inits.append(numpy_helper.from_array(rng.normal(0, 0.5, (WIDTH, WIDTH)).astype(np.float32), f"{p}/w{part}"))
            nodes += [helper.make_node("MatMul", [x, f"{p}/w{part}"], [f"{p}/{part}"]),
                      helper.make_node("Reshape", [f"{p}/{part}", "heads"], [f"{p}/{part}4"])]
        nodes += [helper.make_node("Transpose", [f"{p}/q4"], [f"{p}/qt"], perm=[0, 2, 1, 3]),
                  helper.make_node("Transpose", [f"{p}/v4"], [f"{p}/vt"], perm=[0, 2, 1, 3])]
        if k_perm == (0, 2, 3, 1):
            nodes += [helper.make_node("Transpose", [f"{p}/k4"], [f"{p}/kT"], perm=list(k_perm)),
                      helper.make_node("MatMul", [f"{p}/qt", f"{p}/kT"], [f"{p}/scores"]),
                      helper.make_node("Div", [f"{p}/scores", "eight"], [f"{p}/scaled"])]
        else:
            nodes.append(helper.make_node("Transpose", [f"{p}/k4"], [f"{p}/kh"], perm=[0, 2, 1, 3]))
            query, key = rotate(f"{p}/qt"), rotate(f"{p}/kh")
            nodes += [helper.make_node("Transpose", [key], [f"{p}/kT"], perm=list(k_perm)),
                      helper.make_node("MatMul", [query, f"{p}/kT"], [f"{p}/scores"]),
                      helper.make_node("Mul", ["eighth", f"{p}/scores"], [f"{p}/scaled"])]
        nodes += [helper.make_node("Add", [f"{p}/scaled", "bias"], [f"{p}/biased"]),
                  helper.make_node("Add", ["mask", f"{p}/biased"], [f"{p}/masked"]),
                  helper.make_node("Softmax", [f"{p}/masked"], [f"{p}/probs"], axis=-1),
                  helper.make_node("MatMul", [f"{p}/probs", f"{p}/vt"], [f"{p}/context"]),
                  helper.make_node("Transpose", [f"{p}/context"], [f"{p}/ct"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"{p}/ct", "merged"], [f"{p}/out"])]
        x = f"{p}/out"
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["b", "s", WIDTH])]
    if softmax_read_twice:
        outputs.append(helper.make_tensor_value_info("layer1/probs", TensorProto.FLOAT, None))
    if split_read_twice:
        outputs.append(helper.make_tensor_value_info("layer0/vt", TensorProto.FLOAT, None))
    return helper.make_model(helper.make_graph(nodes, "written", inputs, outputs, inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def _computed_mask(kind: str, inits: list[onnx.TensorProto], inputs: list[onnx.ValueInfoProto]
                   ) -> list[onnx.NodeProto]:
    """`mask` [batch, 1, sequence, sequence], 0 where a query may attend a key and the lowest float elsewhere, as
    transformers' export computes it: keys and query positions from Range over the sequence length (read from x's
    shape), combined with And, broadcast by an Expand."""
    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (
        ("m/0", 0), ("m/1", 1), ("m/rows", [0, 1, 3]), ("m/cols", [0, 1, 2]), ("m/axes12", [1, 2]),
        ("m/window", 2), ("m/pad", 0))]
    inits += [numpy_helper.from_array(np.array(0, np.float32), "m/zero"),
              numpy_helper.from_array(np.array(1, np.float32), "m/one"),
              numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "m/lowest")]
    if kind == "scaled":  # as transformers' get_extended_attention_mask: (1 - mask) x lowest, [b, 1, 1, s]
        return [helper.make_node("Cast", ["attention_mask"], ["m/float"], to=TensorProto.FLOAT),
                helper.make_node("Unsqueeze", ["m/float", "m/axes12"], ["m/keys"]),
                helper.make_node("Sub", ["m/one", "m/keys"], ["m/dropped"]),
                helper.make_node("Mul", ["m/dropped", "m/lowest"], ["mask"])]
    if kind == "ids":
        inputs.append(helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]))
        kept = [helper.make_node("Equal", ["input_ids", "m/pad"], ["m/padded"]),
                helper.make_node("Not", ["m/padded"], ["m/kept"])]
    else:
        kept = [helper.make_node("Cast", ["attention_mask"], ["m/kept"], to=TensorProto.BOOL)]
    nodes = [*kept,
             helper.make_node("Unsqueeze", ["m/kept", "m/axes12"], ["m/keys"]),  # [b, 1, 1, s]
             helper.make_node("Shape", ["x"], ["m/shape"]),
             helper.make_node("Gather", ["m/shape", "m/1"], ["m/length"], axis=0),
             helper.make_node("Range", ["m/0", "m/length", "m/1"], ["m/positions"]),
             helper.make_node("Unsqueeze", ["m/positions", "m/rows"], ["m/queried"]),  # [1, 1, s, 1]
             helper.make_node("GreaterOrEqual", ["m/queried", "m/0"], ["m/queries"]),
             helper.make_node("And", ["m/keys", "m/queries"], ["m/allowed"])]
    allowed = "m/allowed"
    if kind == "window":
        nodes += [helper.make_node("Unsqueeze", ["m/positions", "m/cols"], ["m/keyed"]),  # [1, 1, 1, s]
                  helper.make_node("Sub", ["m/keyed", "m/queried"], ["m/apart"]),
                  helper.make_node("Abs", ["m/apart"], ["m/distance"]),
                  helper.make_node("LessOrEqual", ["m/distance", "m/window"], ["m/near"]),
                  helper.make_node("And", ["m/allowed", "m/near"], ["m/allowed_near"])]
        allowed = "m/allowed_near"
    return [*nodes, helper.make_node("Where", [allowed, "m/zero", "m/lowest"], ["mask"])]


def _feeds(model: onnx.ModelProto | None = None) -> dict[str, np.ndarray]:
    """The inputs of _written_attention_graph(); for `model`, those it reads, attention_mask and input_ids with them
    (the same padding as `mask`, and a hole)."""
    rng = np.random.default_rng(1)
    mask = np.zeros((3, 1, 1, 6), np.float32)
    mask[0, ..., 4:] = np.finfo(np.float32).min  # a padded input
    angles = rng.uniform(0, 6, (1, 1, 6, SIZE)).astype(np.float32)
    feeds = {"x": rng.normal(0, 1, (3, 6, WIDTH)).astype(np.float32),
             "bias": rng.normal(0, 1, (1, HEADS, 6, 6)).astype(np.float32), "mask": mask,
             "cos": np.cos(angles), "sin": np.sin(angles)}
    if model is None:
        return feeds
    attention_mask = (mask[:, 0, 0] == 0).astype(np.int64)
    attention_mask[2, 2] = 0
    feeds.update(attention_mask=attention_mask, input_ids=attention_mask * 7)  # token 0 is the padding
    return {i.name: feeds[i.name] for i in model.graph.input}


def _answers(model: onnx.ModelProto) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, _feeds(model))


def test_written_out_attention_becomes_onnx_attention_with_the_same_answers():
    model = _written_attention_graph()
    rewritten, count = written_attention(model)
    assert count == 2
    assert next(o.version for o in rewritten.opset_import if o.domain == "") == 23
    ops = [node.op_type for node in rewritten.graph.node]
    assert ops.count("Attention") == 2 and "Softmax" not in ops and ops.count("Div") == 2  # the rotations' half sizes
    # the position bias and the mask, summed once for both layers; the rotations' own two
    assert ops.count("Add") == 3
    # each reads the projections as they come, [batch, sequence, heads x size], and answers the merged tensor; the
    # rotary layer turns Q and K split into heads but not transposed, cos and sin transposed once for both, and
    # merges them again
    assert ops.count("Transpose") == 2 and ops.count("Reshape") == 4
    first, second = (n for n in rewritten.graph.node if n.op_type == "Attention")
    assert list(first.input[:3]) == ["layer0/q", "layer0/k", "layer0/v"]
    assert list(second.input[:3]) == ["layer1/qt/rotated/merged", "layer1/kh/rotated/merged", "layer1/v"]
    for layer, node in enumerate((first, second)):
        assert node.output[0] == f"layer{layer}/out"
        assert {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT} == {
            "q_num_heads": HEADS, "kv_num_heads": HEADS}
    np.testing.assert_array_equal(_answers(rewritten)[0], _answers(model)[0])


def test_attention_whose_heads_first_value_is_read_elsewhere_keeps_the_split_form():
    model = _written_attention_graph(split_read_twice=True)
    rewritten, count = written_attention(model)
    assert count == 2
    first, second = (n for n in rewritten.graph.node if n.op_type == "Attention")
    assert first.input[2] == "layer0/vt" and [a.name for a in first.attribute] == ["scale"]
    assert second.input[2] == "layer1/v"
    for have, want in zip(_answers(rewritten), _answers(model)):
        np.testing.assert_array_equal(have, want)


def test_attention_whose_probabilities_are_read_elsewhere_stays_written_out():
    model = _written_attention_graph(softmax_read_twice=True)
    rewritten, count = written_attention(model)
    assert count == 1  # the first layer only
    assert [node.op_type for node in rewritten.graph.node].count("Softmax") == 1
    for have, want in zip(_answers(rewritten), _answers(model)):
        np.testing.assert_array_equal(have, want)


def test_a_graph_whose_weights_are_in_a_file_fuses_as_it_does_in_one_file(artifacts, tmp_path):
    """Past 1 GiB the fusions run with the weights left in their file, reading only those they fuse: the graph and
    every weight come out as they do from the one-file export."""
    from transformers import AutoConfig

    from optimize.graph.onnxio import copy_model, external_files
    from optimize.stages.s1_load import load_source
    from optimize.stages.s2_export import export_onnx
    from optimize.stages.s3_fuse import fuse

    model = artifacts.source("distilbert-tiny")
    one, split = tmp_path / "one" / "exported.onnx", tmp_path / "split" / "exported.onnx"
    one.parent.mkdir()
    split.parent.mkdir()
    export_onnx(load_source(str(model), "sequence-classification"), one)
    copy_model(one, split, external_data_bytes=0)
    assert not external_files(one) and external_files(split) == ["exported.onnx.data"]
    cwd = os.getcwd()
    fused, stats = {}, {}
    for path in (one, split):
        stats[path] = fuse(path, path.with_name("fused.onnx"), AutoConfig.from_pretrained(model)).stats
        assert os.getcwd() == cwd
        fused[path] = onnx.load(str(path.with_name("fused.onnx")))
    assert stats[one] == stats[split] and stats[one]["Attention"] > 0
    assert [n.SerializeToString() for n in fused[one].graph.node] == \
        [n.SerializeToString() for n in fused[split].graph.node]
    weights = {path: {t.name: numpy_helper.to_array(t).tobytes() for t in fused[path].graph.initializer}
               for path in fused}
    assert weights[one] == weights[split]


@pytest.mark.parametrize("kind", ["padding", "scaled"])
def test_the_padding_mask_transformers_computes_is_found_and_made_in_seven_operators(kind):
    model = _written_attention_graph(mask=kind)
    rewritten, count = written_attention(model)
    assert count == 2
    ops = [node.op_type for node in rewritten.graph.node]
    assert {"Range", "GreaterOrEqual", "And", "Sub"}.isdisjoint(ops), ops
    made = {node.output[0]: node for node in rewritten.graph.node}
    attention = [node for node in rewritten.graph.node if node.op_type == "Attention"]
    (total,) = {node.input[3] for node in attention}
    # the position bias goes in as it is, beside the mask, which the sum broadcasts to [batch, heads, ...]
    assert sorted(made[total].input) == ["bias", MASK], made[total]
    assert [node.op_type for node in rewritten.graph.node if node.name.startswith(MASK)] == [
        "Cast", "Unsqueeze", "Where", "Shape", "Shape", "Concat", "Expand"]
    np.testing.assert_array_equal(_answers(rewritten)[0], _answers(model)[0])


@pytest.mark.parametrize("kind", ["window", "ids"])
def test_a_mask_that_is_more_than_the_padding_keeps_its_operators(kind):
    """A sliding window, or a mask read from the token ids rather than attention_mask, is not the padding mask:
    written as exported, with the same answers."""
    model = _written_attention_graph(mask=kind)
    rewritten, count = written_attention(model)
    assert count == 2
    assert not any(node.name.startswith(MASK) for node in rewritten.graph.node)
    assert "And" in [node.op_type for node in rewritten.graph.node]
    np.testing.assert_array_equal(_answers(rewritten)[0], _answers(model)[0])
