"""The padding mask an export adds to the attention scores, found by what it computes and written in seven operators.

transformers builds it from attention_mask with 30-odd shape, index and logic operators (MPNet's export: Range,
Unsqueeze, GreaterOrEqual, And, Expand, Where and their shapes), which onnxruntime runs on every call: about 2 % of
all-mpnet-base-v2's INT8 time at 8 tokens. A term qualifies when it reads attention_mask's values and other tensors'
shapes only, and evaluates, at several sizes with padded and holed rows, to where(attention_mask, 0, lowest) over
[batch, 1, sequence, sequence] (or, as older exports wrote it, over [batch, 1, 1, sequence]); its replacement
computes exactly that, so the answers stay bit-identical. Anything else (a sliding window, a mask read from the
token ids) keeps its own operators.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

SOURCE = "attention_mask"
MASK = "written_attention/padding"
# (batch, sequence) the term is evaluated at: one token, short, and long enough to show a window of up to 299
SIZES = ((1, 1), (2, 9), (3, 64), (2, 300))
SMALL = 4096  # a mask's constants are scalars and short vectors; a larger one (a table) disqualifies the term

Shapes = dict[str, list[int | str | None]]


def padding_terms(model: onnx.ModelProto, terms: Iterable[str], shapes: Shapes) -> dict[str, float]:
    """term -> its lowest value, for each of `terms` that is the padding mask (see the module's doc)."""
    source = next((i for i in model.graph.input if i.name == SOURCE), None)
    if source is None:
        return {}
    producers = {out: node for node in model.graph.node for out in node.output}
    initializers = {init.name: init for init in model.graph.initializer}
    found = {}
    for term in dict.fromkeys(terms):
        cone = _cone(model.graph, term, shapes, producers, initializers)
        lowest = None if cone is None else _evaluated(model, source, term, initializers, *cone)
        if lowest is not None:
            found[term] = lowest
    return found


def padding_mask(graph: onnx.GraphProto, name: str, lowest: float | None = None) -> list[onnx.NodeProto]:
    """The nodes that answer `name`: attention_mask as ONNX's Attention takes it, [batch, 1, sequence, sequence],
    True where a key is kept; with `lowest`, 0 there and `lowest` elsewhere."""
    p = name

    def const(part: str, value: np.ndarray) -> str:
        graph.initializer.append(numpy_helper.from_array(value, f"{p}/{part}"))
        return f"{p}/{part}"

    keys = f"{p}/keys"
    nodes = [helper.make_node("Cast", [SOURCE], [f"{p}/bool"], name=f"{p}/Cast", to=onnx.TensorProto.BOOL),
             helper.make_node("Unsqueeze", [f"{p}/bool", const("axes", np.array([1, 2], np.int64))], [keys],
                              name=f"{p}/Unsqueeze")]
    if lowest is not None:
        nodes.append(helper.make_node("Where", [keys, const("zero", np.array(0, np.float32)),
                                                const("lowest", np.array(lowest, np.float32))], [f"{p}/row"],
                                      name=f"{p}/Where"))
        keys = f"{p}/row"
    return [*nodes,
            helper.make_node("Shape", [SOURCE], [f"{p}/batch"], name=f"{p}/ShapeBatch", end=1),
            helper.make_node("Shape", [SOURCE], [f"{p}/sequence"], name=f"{p}/ShapeSequence", start=1, end=2),
            helper.make_node("Concat", [f"{p}/batch", const("one", np.array([1], np.int64)), f"{p}/sequence",
                                        f"{p}/sequence"], [f"{p}/shape"], name=f"{p}/Concat", axis=0),
            helper.make_node("Expand", [keys, f"{p}/shape"], [p], name=f"{p}/Expand")]


def _cone(graph: onnx.GraphProto, term: str, shapes: Shapes, producers: dict[str, onnx.NodeProto],
          initializers: dict[str, onnx.TensorProto]) -> tuple[list[onnx.NodeProto], dict[str, list[int | str]]] | None:
    """(the nodes that compute `term` from attention_mask, in graph order, Shapes left out; the shape each left-out
    Shape reads, by its output), or None where the term reads any other value, a large constant or a subgraph."""
    inputs = {i.name for i in graph.input}
    cone: dict[int, onnx.NodeProto] = {}
    read_shapes: dict[str, list[int | str]] = {}
    pending = [term]
    while pending:
        name = pending.pop()
        if not name or name == SOURCE:
            continue
        if name in initializers:
            if int(np.prod(initializers[name].dims)) > SMALL:
                return None
            continue
        node = producers.get(name)
        if node is None or name in inputs or node.domain not in ("", "ai.onnx") or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None
        if id(node) in cone or name in read_shapes:
            continue
        if node.op_type == "Shape":
            shape = shapes.get(node.input[0])
            if shape is None or None in shape:
                return None
            attributes = {a.name: a.i for a in node.attribute}
            read_shapes[node.output[0]] = [d for d in shape if d is not None][
                attributes.get("start", 0):attributes.get("end", len(shape))]
            continue
        if node.op_type == "Constant" and any(a.t.dims and int(np.prod(a.t.dims)) > SMALL for a in node.attribute):
            return None
        cone[id(node)] = node
        pending.extend(node.input)
    if not cone:
        return None
    return [node for node in graph.node if id(node) in cone], read_shapes


def _evaluated(model: onnx.ModelProto, source: onnx.ValueInfoProto, term: str,
               initializers: dict[str, onnx.TensorProto], nodes: list[onnx.NodeProto],
               read_shapes: dict[str, list[int | str]]) -> float | None:
    """The term's lowest value where it equals where(attention_mask, 0, lowest) at every size of SIZES, else None."""
    import onnxruntime as ort

    dims = [d.dim_param or d.dim_value for d in source.type.tensor_type.shape.dim]
    if len(dims) != 2:
        return None
    sizes = {dims[0]: 0, dims[1]: 1}
    if any(d not in sizes and not isinstance(d, int) for shape in read_shapes.values() for d in shape):
        return None  # a shape in another size than the batch or the sequence
    kind = helper.tensor_dtype_to_np_dtype(source.type.tensor_type.elem_type)
    read = {name for node in nodes for name in node.input}
    graph = helper.make_graph(
        nodes, "padding", [source, *(helper.make_tensor_value_info(name, onnx.TensorProto.INT64, [len(shape)])
                                     for name, shape in read_shapes.items())],
        [helper.make_tensor_value_info(term, onnx.TensorProto.FLOAT, None)],
        [initializers[name] for name in read if name in initializers])
    probe = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    rng = np.random.default_rng(0)
    lowest: set[float] = set()
    try:
        session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        for size in SIZES:
            mask = np.ones(size, kind)
            for row in range(1, size[0]):
                mask[row, rng.integers(1, size[1] + 1):] = 0  # padded
                mask[row, rng.integers(1, size[1], size[1] // 4)] = 0  # and holed: a mask, not a length
            feeds = {name: np.array([size[sizes[d]] if d in sizes else d for d in shape], np.int64)
                     for name, shape in read_shapes.items()}
            (value,) = session.run(None, {SOURCE: mask, **feeds})
            if value.shape not in ((size[0], 1, size[1], size[1]), (size[0], 1, 1, size[1])):
                return None  # a mask per head, or of another layout
            keep = np.broadcast_to(mask.astype(bool)[:, None, None, :], value.shape)
            if value.dtype != np.float32 or np.any(value[keep] != 0):
                return None
            lowest.update(np.unique(value[~keep]).tolist())
    except Exception:  # noqa: BLE001  a cone onnxruntime cannot run alone is not rewritten
        return None
    return lowest.pop() if len(lowest) == 1 else None
