"""Per-token INT8: every row of an activation gets its own scale, so an input's answer never depends on its batch.

Dynamic INT8 as onnxruntime writes it quantizes a whole padded batch with one scale: a short text batched with
long ones is quantized more coarsely, and its vector changes with whoever else was asking. Here each MatMul input
is quantized per token (symmetric, the row's max |x| -> 127, stored as u8 around 128, the fast u8 x s8 path), the
weights per output column, and activation outliers are first migrated into the weights (SmoothQuant): the input is
divided per channel by s and the weight rows multiplied by s. Where the input is an attention's output and nothing
else reads it, 1/s is folded into that attention's value projection (its output columns and bias), so smoothing
costs no operator; elsewhere it is one Mul shared by every MatMul reading that input.

Rows that something already bounds need no scale of their own: a LayerNorm's output (every row normalized) and an
attention's output (every row a weighted mean of value rows). With `calibrated_roles`, such inputs get one scale and
zero point from their calibrated [min, max] (asymmetric: all 256 codes), constant for every row and batch, so the
answer still never depends on the batch. The MatMul then scales inside its kernel and adds the bias there too,
where a per-row scale needs a pass of its own over the output and an Add after it. GELU outputs keep a scale per
row: their rows' ranges differ too much for one scale.

A fused Attention computes its projection inside one operator, so it is taken apart into three INT8 MatMuls (Q, K
and V) and ONNX's own Attention (opset 23), which onnxruntime runs faster than MultiHeadAttention. Its bias goes
where it costs least: K's is dropped (softmax ignores a constant added to every score of a row), V's moves past the
attention into the output projection's bias (softmax rows sum to 1, so it adds b_v @ W_o to the output), and Q's
is one Add (or the MatMul's own, with one calibrated scale).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from optimize.attention.quantized import AttentionMask, ValueBias, quantized_attention, value_projection
from optimize.graph.onnxio import ATTENTION_OPSET, activation_shapes, constant, converted, matmul_weight, save_model
from optimize.stages.s6_quantize.calibrate import Bounds, peaks
from optimize.stages.s6_quantize.rounding import CompensatedRounding, quantize_weight

MS = "com.microsoft"
OPSET = 21  # QuantizeLinear with a block size: one scale per row in one operator
GELU_OPS = ("Gelu", "BiasGelu", "FastGelu")
GELU_FLOOR = 0.17  # GELU(x) >= -0.1700 for every x
# A GELU output's zero point: codes 0-15 hold [floor, 0), 16-255 the rest of the row. An integer zero point keeps
# the many near-zero values near zero; shifting the row by the floor instead put every 0 at a fractional code and
# biased all of them alike (all-mpnet-base-v2's FFN down-projections: 11 of 12 closer with it, layer 6 0.0142 ->
# 0.0045 relative error of the product).
GELU_ZERO = 16
NORMALIZING_OPS = ("LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization",
                   "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")


@dataclass
class PerTokenRecord:
    quantized: list[str] = field(default_factory=list)
    smoothed_inputs: int = 0
    smoothing_folded: int = 0  # of those, how many cost no operator
    one_sided: int = 0  # MatMuls reading a GELU output, with GELU_ZERO of its codes below zero
    calibrated: int = 0  # inputs quantized with one calibrated scale: rows a LayerNorm or an attention bounds
    compensated: int = 0  # MatMuls whose weight codes were rounded against their input's calibration rows
    strengths: dict[str, int] = field(default_factory=dict)  # how many inputs were smoothed with each alpha

    def count_strength(self, alpha: float | None) -> None:
        key = "none" if alpha is None else f"{alpha:g}"
        self.strengths[key] = self.strengths.get(key, 0) + 1

    def to_dict(self) -> dict[str, int]:
        return {"quantized": len(self.quantized), "smoothed_inputs": self.smoothed_inputs,
                "smoothing_folded_into_weights": self.smoothing_folded, "one_sided_gelu_inputs": self.one_sided,
                "calibrated_inputs": self.calibrated, "compensated_weights": self.compensated}


def per_token_candidates(model_path: Path) -> list[str]:
    graph = onnx.load(str(model_path), load_external_data=False).graph
    return [n.name for n in rewritable(graph)]


def rewritable(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The MatMuls (and Attentions) with a constant weight that only such nodes read, and an input that depends on
    the request: one computed from weights alone (DeBERTa's relative position projections) is the same for every
    request, costs nothing per token, and stays float. A weight another operator reads too (an embedding table a
    Gather reads) cannot be rewritten for one of its readers; one several of these read (DeBERTa's query and key
    projections, applied to the tokens and to the relative positions) is copied for each by unshare_weights."""
    consumers = _consumers(graph)
    matmuls = weight_readers(graph)
    names = {n.name for n in matmuls}
    varying = _varying(graph)
    return [n for n in matmuls if n.input[0] in varying and all(
        c.name in names and c.input[1] == n.input[1] for c in consumers[n.input[1]])]


def weight_readers(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The MatMuls (and Attentions) that multiply by a constant weight."""
    weights = {init.name: init for init in graph.initializer}
    return [n for n in graph.node if matmul_weight(n, weights) is not None]


def _varying(graph: onnx.GraphProto) -> set[str]:
    """The tensors computed from the graph's inputs (in a graph's topological order), not from weights alone."""
    constants = {init.name for init in graph.initializer}
    varying = {value.name for value in graph.input if value.name not in constants}
    for node in graph.node:
        if any(name in varying for name in node.input):
            varying.update(node.output)
    return varying


def unshare_weights(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    """Each of `nodes` past the first to read a weight reads a copy of its own: every reader is smoothed by its own
    input's ranges and quantized apart, or stays float while another is quantized."""
    weights = {init.name: init for init in graph.initializer}
    seen: set[str] = set()
    for node in nodes:
        name = node.input[1]
        if name in seen:
            copy = onnx.TensorProto()
            copy.CopyFrom(weights[name])
            copy.name = f"{name}/{node.name}"
            graph.initializer.append(copy)
            node.input[1] = copy.name
        seen.add(name)


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    return consumers


def smoothing_scales(peak: np.ndarray, weight_peak: np.ndarray, alpha: float) -> np.ndarray:
    """s = range_x^alpha / range_w^(1 - alpha), with no overall gain (geometric mean 1)."""
    scale = np.maximum(peak, 1e-5) ** alpha / np.maximum(weight_peak, 1e-5) ** (1 - alpha)
    scale = scale / np.exp(np.log(scale).mean())
    return scale.astype(np.float32)


def input_role(tensor: str, producer: onnx.NodeProto | None) -> str:
    """What made a MatMul's input: "normalized" (a LayerNorm's output), "context" (an attention's output), "gelu"
    or "other"."""
    if producer is None:
        return "other"
    if producer.op_type in NORMALIZING_OPS and tensor == producer.output[0]:
        return "normalized"
    if producer.op_type in ("Attention", "MultiHeadAttention"):
        return "context"
    return "gelu" if producer.op_type in GELU_OPS else "other"


def quantize_per_token(src: Path, dst: Path, bounds: dict[str, Bounds] | None, weight_bits: int = 8,
                       alpha: float = 0.5, exclude: list[str] | None = None, activation_bits: int = 8,
                       calibrated_roles: frozenset[str] = frozenset(),
                       alphas: Mapping[str, float | None] | None = None,
                       rounding: CompensatedRounding | None = None) -> PerTokenRecord:
    """`bounds`: per-channel (min, max) of each candidate node's input from calibration (None: no smoothing).
    `calibrated_roles`: inputs of these roles (see input_role) get one scale and zero point from `bounds` instead
    of a scale per row. `alphas`: the smoothing strength of each input tensor (None: not smoothed), where it is not
    `alpha`. `rounding`: weight codes rounded to compensate each other's error on the inputs' calibration rows,
    where it has them, rather than each to its nearest code."""
    rewrite = _Rewrite(src, set(exclude or []))
    if bounds is not None:
        rewrite.smooth(peaks(bounds), alpha, alphas or {})
    calibrated = rewrite.calibrated(bounds, calibrated_roles)
    codes = rewrite.codes(weight_bits, rounding)
    rewrite.quantize(calibrated, codes, activation_bits)
    rewrite.save(dst)
    return rewrite.record


class _Rewrite:
    """One graph's candidate MatMuls (and Attentions) rewritten to per-token INT8, step by step: their inputs
    smoothed, each input's scale chosen, the weight codes rounded, and the nodes replaced."""

    def __init__(self, src: Path, skipped: set[str]) -> None:
        self.model = _at_opset(onnx.load(str(src)))
        self.inferred = _shapes_of(src, self.model)
        graph = self.graph = self.model.graph
        unshare_weights(graph, weight_readers(graph))
        self.opset = next(o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx"))
        self.weights = {init.name: init for init in graph.initializer}
        self.producers = {out: node for node in graph.node for out in node.output}
        self.consumers = _consumers(graph)
        self.chosen = [n for n in rewritable(graph) if n.name not in skipped]
        self.chosen_names = {n.name for n in self.chosen}
        self.by_input: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in self.chosen:
            self.by_input[node.input[0]].append(node)
        self.record = PerTokenRecord()
        weights = self.weights
        self.float_weights = {n.name: numpy_helper.to_array(weights[n.input[1]]).astype(np.float32)
                              for n in self.chosen}
        self.biases = {n.name: numpy_helper.to_array(weights[n.input[2]]).astype(np.float32) for n in self.chosen
                       if n.op_type == "Attention" and len(n.input) > 2 and n.input[2] in weights}
        # the float weights replaced below, held once (as arrays) from here on
        self.replaced = {n.input[1] for n in self.chosen} | {n.input[2] for n in self.chosen if n.name in self.biases}
        read_elsewhere = {name for node in graph.node if node.name not in self.chosen_names for name in node.input}
        for name in self.replaced:
            if name not in read_elsewhere:
                weights[name].ClearField("raw_data")
        self.smoothed_input: dict[str, str] = {}
        self.inverse_scales: dict[str, np.ndarray] = {}
        self.divided: dict[str, np.ndarray] = {}  # what each smoothed input's channels are multiplied by

    def smooth(self, ranges: dict[str, np.ndarray], alpha: float, alphas: Mapping[str, float | None]) -> None:
        """SmoothQuant per input: the weight rows multiplied by s, the input divided by it, where possible inside
        the attention or the value projection that made the input, else with one Mul."""
        record, weights, float_weights = self.record, self.weights, self.float_weights
        for tensor, nodes in self.by_input.items():
            strength = alphas.get(tensor, alpha)
            if any(n.name not in ranges for n in nodes):
                continue
            record.count_strength(strength)
            if strength is None:
                continue
            peak = np.max([ranges[n.name] for n in nodes], axis=0)
            weight_peak = np.max([np.abs(float_weights[n.name]).max(axis=1) for n in nodes], axis=0)
            scale = smoothing_scales(peak, weight_peak, strength)
            self.divided[tensor] = 1 / scale
            for n in nodes:
                float_weights[n.name] = float_weights[n.name] * scale[:, None]
            record.smoothed_inputs += 1
            source = self.producers.get(tensor)
            only_ours = all(c in nodes for c in self.consumers[tensor])
            # context = softmax(QK) V, channel by channel: dividing V's output column c divides context's c.
            if (source is not None and source.op_type == "Attention" and source.name in self.chosen_names
                    and only_ours and source.name in self.biases):
                hidden = scale.shape[0]
                float_weights[source.name][:, 2 * hidden:] /= scale[None, :]
                self.biases[source.name][2 * hidden:] /= scale
                record.smoothing_folded += 1
            elif only_ours and (value := value_projection(source, self.producers, self.consumers, weights)
                                ) is not None and value[0].name in float_weights:
                float_weights[value[0].name] = float_weights[value[0].name] / scale[None, :]
                if value[1] is not None:
                    bias = numpy_helper.to_array(weights[value[1]]).astype(np.float32)
                    weights[value[1]].CopyFrom(numpy_helper.from_array(bias / scale, value[1]))
                record.smoothing_folded += 1
            else:
                name = f"{tensor}/smooth"
                self.graph.initializer.append(numpy_helper.from_array(1 / scale, f"{name}/inverse"))
                self.smoothed_input[tensor] = name
                self.inverse_scales[tensor] = 1 / scale

    def calibrated(self, bounds: dict[str, Bounds] | None,
                   roles: frozenset[str]) -> dict[str, tuple[float, int]]:
        """input -> (scale, zero point) for the inputs of these roles that calibration saw."""
        calibrated: dict[str, tuple[float, int]] = {}
        for tensor, nodes in self.by_input.items():
            if bounds is not None and input_role(tensor, self.producers.get(tensor)) in roles and all(
                    n.name in bounds for n in nodes):
                calibrated[tensor] = calibrated_scale(bounds[nodes[0].name], self.divided.get(tensor))
        return calibrated

    def codes(self, weight_bits: int, rounding: CompensatedRounding | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each node's weight codes and column scales: compensated where the rounding has the input's rows."""
        codes = {}
        for node in self.chosen:
            tensor, weight = node.input[0], self.float_weights[node.name]
            if rounding is not None and rounding.covers(tensor):
                codes[node.name] = rounding.codes(tensor, weight, self.divided.get(tensor), weight_bits)
                self.record.compensated += 1
            else:
                codes[node.name] = quantize_weight(weight, weight_bits)
        return codes

    def quantize(self, calibrated: dict[str, tuple[float, int]], codes: dict[str, tuple[np.ndarray, np.ndarray]],
                 activation_bits: int) -> None:
        """Every chosen node replaced by its input's prologue (once per input) and its integer kernel."""
        graph, record = self.graph, self.record
        # A GELU output is bounded below: its codes spend GELU_ZERO on [floor, 0) and the other 239 on [0, row max],
        # nearly twice the resolution of symmetric codes
        one_sided_inputs = {tensor for tensor in self.by_input
                            if input_role(tensor, self.producers.get(tensor)) == "gelu"}
        bypassed: set[str] = set()  # bias Adds taken into a MatMul's kernel
        new_nodes: list[onnx.NodeProto] = []
        zero_points = _ZeroPoints(graph, new_nodes)
        # below ONNX's Attention (a graph the converter cannot lift): MultiHeadAttention
        mask = AttentionMask(graph, new_nodes) if self.opset >= ATTENTION_OPSET else None
        ranks = shared_leading(self.inferred, graph.input[0].name)
        prologue_done: set[str] = set()
        for node in graph.node:
            if node.name in bypassed:
                continue
            if node.name not in self.chosen_names:
                new_nodes.append(node)
                continue
            tensor = node.input[0]
            quantized, row_scale = f"{tensor}/q", f"{tensor}/row_scale"
            one_sided = tensor in one_sided_inputs
            zero = GELU_ZERO if one_sided else activation_levels(activation_bits)[1]
            one_scale = tensor in calibrated
            if one_scale:
                row_scale, zero = f"{tensor}/calibrated_scale", calibrated[tensor][1]
            if tensor not in prologue_done:
                source = tensor
                if tensor in self.smoothed_input:
                    smoothed = self.smoothed_input[tensor]
                    new_nodes.append(helper.make_node("Mul", [source, f"{smoothed}/inverse"], [smoothed],
                                                      name=f"{smoothed}/Mul"))
                    source = smoothed
                rows = self.float_weights[node.name].shape[0]
                if one_scale:
                    constant(graph, row_scale, np.array(calibrated[tensor][0], np.float32))
                    new_nodes.append(helper.make_node("QuantizeLinear", [source, row_scale, constant(
                        graph, f"{tensor}/calibrated_zero", np.array(zero, np.uint8))], [quantized],
                        name=f"{tensor}/q/QuantizeLinear"))
                    record.calibrated += 1
                else:
                    zero_point = zero_points.get(ranks[tensor], zero) if tensor in ranks else None
                    floor = gelu_floor(self.inverse_scales.get(tensor)) if one_sided else None
                    new_nodes.extend(_prologue(source, quantized, row_scale, zero_point, zero, rows, graph,
                                               activation_bits, floor))
                prologue_done.add(tensor)
            if node.op_type == "Attention":
                constant(graph, f"{node.name}/a_zero", np.array(zero, np.uint8))
                value_bias = ValueBias(node, self.consumers, self.weights, codes,
                                       self.inverse_scales.get(node.output[0]))
                new_nodes.extend(quantized_attention(node, quantized, row_scale, *codes[node.name],
                                                     self.biases.get(node.name), graph, mask, value_bias, one_scale))
            else:
                new_nodes.extend(_matmul(node, quantized, row_scale, codes[node.name], zero, graph, self.consumers,
                                         self.weights, bypassed if one_scale else None))
            record.quantized.append(node.name)
            record.one_sided += int(one_sided)
        del graph.node[:]
        graph.node.extend(new_nodes)

    def save(self, dst: Path) -> None:
        for init in list(self.graph.initializer):  # the float weights replaced above
            if init.name in self.replaced:
                self.graph.initializer.remove(init)
        if not any(o.domain == MS for o in self.model.opset_import):
            self.model.opset_import.append(helper.make_opsetid(MS, 1))
        save_model(self.model, dst)


def calibrated_scale(bounds: Bounds, divided: np.ndarray | None) -> tuple[float, int]:
    """(scale, u8 zero point) that spread the calibrated [min, max] of the (smoothed) input, widened to hold 0,
    over all 256 codes."""
    low, high = (b if divided is None else b * divided for b in bounds)
    low_end, high_end = min(float(low.min()), 0.0), max(float(high.max()), 0.0)
    scale = max(high_end - low_end, 1e-12) / 255
    return scale, int(np.clip(np.round(-low_end / scale), 0, 255))


def activation_levels(bits: int) -> tuple[int, int]:
    """(largest code, zero point) of symmetric u8 activations with `bits` of resolution."""
    return 2 ** (bits - 1) - 1, 2 ** (bits - 1)


def gelu_floor(divided: np.ndarray | None) -> float:
    """The lowest value a (smoothed) GELU output reaches."""
    return GELU_FLOOR * (1.0 if divided is None else float(divided.max()))


def gelu_step(peak: np.ndarray, floor: float) -> np.ndarray:
    """A GELU row's scale from its max: codes GELU_ZERO..255 for [0, max], and never so fine that the floor falls
    below code 0."""
    return np.maximum(peak / (255 - GELU_ZERO), floor / GELU_ZERO).astype(np.float32)


def _prologue(x: str, quantized: str, row_scale: str, zero_point: str | None, zero: int, width: int,
              graph: onnx.GraphProto, bits: int, floor: float | None = None) -> list[onnx.NodeProto]:
    """x -> (u8 codes, per-row scale): scale = max|x| / L, q = round(x / scale) + zero; a GELU output (`floor`: its
    lowest value) as gelu_step says, without Abs. Three passes over x (Abs, ReduceMax, QuantizeLinear), where
    DynamicQuantizeLinear makes two. An all-zero row needs no guard: its scale 0 makes codes QuantizeLinear
    saturates, and the MatMul multiplies their integer products by that 0.
    `zero_point`: the shared zero-point tensor of x's rank, or None to shape one from this row scale."""
    p = quantized
    shaped = []
    if zero_point is None:
        zero_point = f"{p}/zero_point"
        shaped = [helper.make_node("Shape", [row_scale], [f"{p}/scale_shape"], name=f"{p}/Shape"),
                  helper.make_node("Expand", [constant(graph, f"{p}/zero", np.array(zero, np.uint8)),
                                              f"{p}/scale_shape"], [zero_point], name=f"{p}/Expand")]
    one_sided = floor is not None
    levels = 255 - zero if one_sided else activation_levels(bits)[0]
    constant(graph, f"{p}/axes", np.array([-1], np.int64))
    constant(graph, f"{p}/step", np.array(1 / levels, np.float32))
    magnitude = [] if one_sided else [helper.make_node("Abs", [x], [f"{p}/abs"], name=f"{p}/Abs")]
    scaled = f"{p}/peak_step" if one_sided else row_scale
    least = [] if floor is None else [helper.make_node(
        "Max", [scaled, constant(graph, f"{p}/least_step", np.array(floor / zero, np.float32))], [row_scale],
        name=f"{p}/LeastStep")]
    return [
        *magnitude,
        helper.make_node("ReduceMax", [x if one_sided else f"{p}/abs", f"{p}/axes"], [f"{p}/peak"],
                         name=f"{p}/ReduceMax", keepdims=1),
        helper.make_node("Mul", [f"{p}/peak", f"{p}/step"], [scaled], name=f"{p}/RowScale"),
        *least,
        *shaped,
        helper.make_node("QuantizeLinear", [x, row_scale, zero_point], [quantized],
                         name=f"{p}/QuantizeLinear", axis=-1, block_size=width),
    ]


class _ZeroPoints:
    """The u8 zero-point tensors QuantizeLinear needs in the scale's shape (leading dims of the activation, then 1):
    one per activation rank and value, shaped once from the first graph input's leading [batch, sequence]."""

    def __init__(self, graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
        self.graph, self.nodes = graph, nodes
        self.made: dict[tuple[int, int], str] = {}

    def get(self, rank: int, zero: int) -> str:
        key = (rank, zero)
        if key not in self.made:
            name = f"per_token/zero_point/rank{rank}/{zero}"
            source = self.graph.input[0].name
            self.nodes += [
                helper.make_node("Shape", [source], [f"{name}/leading"], name=f"{name}/Shape", end=rank - 1),
                helper.make_node("Concat", [f"{name}/leading", constant(self.graph, f"{name}/one",
                                                                      np.array([1], np.int64))],
                                 [f"{name}/shape"], name=f"{name}/Concat", axis=0),
                helper.make_node("Expand", [constant(self.graph, f"{name}/value", np.array(zero, np.uint8)),
                                            f"{name}/shape"], [name], name=f"{name}/Expand"),
            ]
            self.made[key] = name
        return self.made[key]


_SHAPES: dict[tuple[str, int, int], dict[str, list[int | str | None]]] = {}


def _shapes_of(src: Path, model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    """activation_shapes of the graph file `src` (as loaded into `model`), inferred once per version of the file:
    the parity search quantizes the same graph trial after trial."""
    stat = src.stat()
    key = (str(src.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _SHAPES:
        if len(_SHAPES) >= 4:
            _SHAPES.clear()
        _SHAPES[key] = activation_shapes(model)
    return _SHAPES[key]


def shared_leading(shapes: dict[str, list[int | str | None]], first_input: str) -> dict[str, int]:
    """The rank of every tensor whose leading dimensions are the first input's ([batch, sequence]), so that one
    zero-point tensor shaped from that input fits its row scales; a tensor of other leading dimensions (DeBERTa's
    relative position embeddings, [1, 2 x buckets, hidden]) shapes its own from its scale."""
    leading = shapes.get(first_input, [])
    return {name: len(shape) for name, shape in shapes.items()
            if 1 < len(shape) <= len(leading) + 1 and None not in shape[:-1] and shape[:-1] == leading[:len(shape) - 1]}


def _at_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), OPSET)
    # `model` is not kept: the converted graph alone holds the weights (where the converter raises, `model` does)
    if current >= ATTENTION_OPSET or not any(n.op_type == "Attention" for n in model.graph.node):
        return model if current >= OPSET else converted(model, OPSET, restore=False)
    try:
        return converted(model, ATTENTION_OPSET, restore=False)
    except Exception:  # the converter raises bare errors for operators it has no adapter for
        return model if current >= OPSET else converted(model, OPSET, restore=False)


def _matmul(node: onnx.NodeProto, quantized: str, row_scale: str, weight_codes: tuple[np.ndarray, np.ndarray],
            zero: int, graph: onnx.GraphProto, consumers: dict[str, list[onnx.NodeProto]],
            weights: dict[str, onnx.TensorProto], bypassed: set[str] | None = None) -> list[onnx.NodeProto]:
    """`bypassed`: given when A's scale is one constant, so the kernel can add the bias; the bias Add taken in is
    added to it."""
    p = node.name
    codes, scale = weight_codes
    constant(graph, f"{p}/a_zero", np.array(zero, np.uint8))
    constant(graph, f"{p}/w_q", codes)
    constant(graph, f"{p}/w_scale", scale)
    rows_out = node.output[0]
    inputs = [quantized, f"{p}/w_q", row_scale, f"{p}/w_scale", f"{p}/a_zero"]
    if bypassed is not None:
        taken = _take_bias(node.output[0], consumers, weights, codes.shape[1])
        if taken is not None:
            bias, rows_out = taken[0], taken[1]
            inputs += ["", bias]
            if taken[2]:
                bypassed.add(taken[2])
    # A's scale: one calibrated constant, which the kernel applies before it adds the bias; or the row scale
    # [..., M, 1], which onnxruntime applies in a pass after the kernel (bias included), so the bias stays an Add
    return [helper.make_node("MatMulIntegerToFloat", inputs, [rows_out], name=f"{p}/MatMulInteger", domain=MS)]


def _take_bias(output: str, consumers: dict[str, list[onnx.NodeProto]], weights: dict[str, onnx.TensorProto],
               width: int) -> tuple[str, str, str] | None:
    """(bias, the output the MatMul now writes, the Add it replaces or "") where the one reader of `output` adds a
    constant [width] bias only it uses: an Add is bypassed, a BiasGelu becomes a Gelu."""
    users = consumers.get(output, [])
    if len(users) != 1:
        return None
    user = users[0]
    if user.op_type == "Add" and user.domain in ("", "ai.onnx"):
        bias = next((name for name in user.input if name != output), "")
    elif user.op_type == "BiasGelu" and user.input[0] == output:
        bias = user.input[1]
    else:
        return None
    if bias not in weights or len(consumers.get(bias, [])) != 1 or tuple(weights[bias].dims) != (width,):
        return None
    if user.op_type == "BiasGelu":
        user.op_type = "Gelu"
        del user.input[1:]
        return bias, output, ""
    return bias, user.output[0], user.name
