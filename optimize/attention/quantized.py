"""A fused Attention taken apart for INT8: Q, K and V as three MatMulIntegerToFloat of the same codes, then ONNX's
Attention (or MultiHeadAttention below opset 23), with V's bias moved past it into the output projection."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from optimize.attention.padding_mask import padding_mask
from optimize.graph.onnxio import constant, matmul_weight

MS = "com.microsoft"


class AttentionMask:
    """ONNX Attention's boolean mask [batch, 1, sequence, sequence] (True: attend), made once from the graph's
    attention_mask input."""

    def __init__(self, graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
        self.graph, self.nodes, self.made = graph, nodes, ""
        self.source = next((i.name for i in graph.input if i.name == "attention_mask"), "")

    def get(self) -> str:
        if self.source and not self.made:
            self.made = "per_token/attention_mask"
            self.nodes += padding_mask(self.graph, self.made)
        return self.made


class ValueBias:
    """Moves V's bias past the attention: context + b_v feeds the output projection, which adds b_v @ W_o to its
    own bias. Possible when the attention's output is read only by that MatMul and its bias is a constant only it
    uses; `inverse`: 1/s when the projection's input is smoothed by a Mul (b_v meets the smoothed weights)."""

    def __init__(self, node: onnx.NodeProto, consumers: dict[str, list[onnx.NodeProto]],
                 weights: dict[str, onnx.TensorProto], codes: dict[str, tuple[np.ndarray, np.ndarray]],
                 inverse: np.ndarray | None) -> None:
        users = consumers.get(node.output[0], [])
        self.projection = users[0] if len(users) == 1 and users[0].input[0] == node.output[0] else None
        self.weight = None
        if self.projection is not None and matmul_weight(self.projection, weights) is not None:
            name = self.projection.name
            if name in codes:  # as the INT8 MatMul will multiply: the codes times their scales
                self.weight = codes[name][0].astype(np.float32) * codes[name][1]
            else:  # kept in float
                self.weight = numpy_helper.to_array(weights[self.projection.input[1]]).astype(np.float32)
        self.consumers, self.weights, self.inverse = consumers, weights, inverse

    def fold(self, bias: np.ndarray) -> bool:
        if self.projection is None or self.weight is None:
            return False
        bias = bias if self.inverse is None else bias * self.inverse
        return fold_bias(self.projection.output[0], bias @ self.weight, self.consumers, self.weights)


def quantized_attention(node: onnx.NodeProto, quantized: str, row_scale: str, codes: np.ndarray, scale: np.ndarray,
               bias: np.ndarray | None, graph: onnx.GraphProto, mask: AttentionMask | None,
               value_bias: ValueBias, in_kernel: bool = False) -> list[onnx.NodeProto]:
    """Q, K and V as three INT8 MatMuls of the same codes (no Split to copy them apart), then ONNX's Attention
    (or MultiHeadAttention, below opset 23). `in_kernel`: A's scale is one constant, so the MatMuls add Q's and V's
    biases themselves."""
    p = node.name
    hidden = codes.shape[1] // 3
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    masked = len(node.input) > 3 and bool(node.input[3])
    nodes = []
    for index, part in enumerate("qkv"):
        columns = slice(index * hidden, (index + 1) * hidden)
        constant(graph, f"{p}/{part}/w_q", np.ascontiguousarray(codes[:, columns]))
        constant(graph, f"{p}/{part}/w_scale", np.ascontiguousarray(scale[columns]))
        nodes.append(helper.make_node("MatMulIntegerToFloat", [quantized, f"{p}/{part}/w_q", row_scale,
                                                               f"{p}/{part}/w_scale", f"{p}/a_zero"],
                                      [f"{p}/{part}"], name=f"{p}/MatMulInteger_{part}", domain=MS))
    if mask is None or (masked and not mask.get()):
        inputs = [f"{p}/q", f"{p}/k", f"{p}/v"]
        if bias is not None:
            inputs.append(constant(graph, f"{p}/qkv_bias", bias.astype(np.float32)))
        elif masked:
            inputs.append("")
        if masked:
            inputs.append(node.input[3])
        extra = {k: attrs[k] for k in ("mask_filter_value", "scale") if k in attrs}
        nodes.append(helper.make_node("MultiHeadAttention", inputs, [node.output[0]], name=f"{p}/MultiHeadAttention",
                                      domain=MS, num_heads=attrs["num_heads"], **extra))
        return nodes
    parts = {"q": f"{p}/q", "k": f"{p}/k", "v": f"{p}/v"}
    if bias is not None:
        query, value = bias[:hidden].astype(np.float32), bias[2 * hidden:].astype(np.float32)
        for part, values in (("q", query), ("v", None if value_bias.fold(value) else value)):
            if values is not None and values.any() and in_kernel:
                matmul = nodes["qkv".index(part)]
                matmul.input.extend(["", constant(graph, f"{p}/{part}/bias", values)])
            elif values is not None and values.any():
                nodes.append(helper.make_node("Add", [parts[part], constant(graph, f"{p}/{part}/bias", values)],
                                              [f"{p}/{part}_biased"], name=f"{p}/{part}/AddBias"))
                parts[part] = f"{p}/{part}_biased"
    extra = {"scale": attrs["scale"]} if "scale" in attrs else {}
    if attrs.get("unidirectional"):
        extra["is_causal"] = 1
    inputs = [parts["q"], parts["k"], parts["v"], *([mask.get()] if masked else [])]
    nodes.append(helper.make_node("Attention", inputs, [node.output[0]], name=f"{p}/Attention",
                                  q_num_heads=attrs["num_heads"], kv_num_heads=attrs["num_heads"], **extra))
    return nodes


def value_projection(attention: onnx.NodeProto | None, producers: dict[str, onnx.NodeProto],
                      consumers: dict[str, list[onnx.NodeProto]], weights: dict[str, onnx.TensorProto]
                      ) -> tuple[onnx.NodeProto, str | None] | None:
    """(the MatMul, its bias constant or None) that alone makes V of ONNX's Attention over [batch, sequence, heads x
    size], where V feeds nothing else; None elsewhere."""
    if (attention is None or attention.op_type != "Attention" or attention.domain not in ("", "ai.onnx")
            or not any(a.name == "q_num_heads" for a in attention.attribute)):
        return None
    value = attention.input[2]
    node, bias = producers.get(value), None
    if len(consumers.get(value, [])) != 1 or node is None:
        return None
    if node.op_type == "Add" and node.domain in ("", "ai.onnx"):
        inner = [name for name in node.input if name not in weights]
        bias = next((name for name in node.input if name in weights), None)
        if len(inner) != 1 or bias is None or len(consumers.get(bias, [])) != 1 or len(consumers[inner[0]]) != 1:
            return None
        node = producers.get(inner[0])
    weight = None if node is None or node.op_type != "MatMul" else matmul_weight(node, weights)
    if node is None or weight is None or (bias is not None and list(weights[bias].dims) != [weight.dims[1]]):
        return None
    return node, bias


def fold_bias(output: str, addend: np.ndarray, consumers: dict[str, list[onnx.NodeProto]],
               weights: dict[str, onnx.TensorProto]) -> bool:
    """Add `addend` to the constant bias that the one reader of `output` adds to it (a SkipLayerNormalization's own
    bias, or an Add of a constant), if no other node uses that constant."""
    users = consumers.get(output, [])
    if len(users) != 1:
        return False
    user = users[0]
    if user.op_type == "SkipLayerNormalization" and len(user.input) > 4:
        bias_name = user.input[4]
    elif user.op_type == "Add" and user.domain in ("", "ai.onnx"):
        bias_name = next((name for name in user.input if name != output), "")
    else:
        return False
    if bias_name not in weights or len(consumers.get(bias_name, [])) != 1:
        return False
    bias = numpy_helper.to_array(weights[bias_name]).astype(np.float32)
    if bias.shape != addend.shape:
        return False
    weights[bias_name].CopyFrom(numpy_helper.from_array(bias + addend, bias_name))
    return True
