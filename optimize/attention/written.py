"""Attention the fusion left written out (MatMul, Softmax, MatMul), found by its shape and written as ONNX's
Attention."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from optimize.attention.padding_mask import MASK, padding_mask, padding_terms
from optimize.graph.onnxio import ATTENTION_OPSET, activation_shapes, converted


def written_attention(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Attention the fusion left written out, softmax(Q K^T x scale + terms) V over [batch, heads, sequence, head
    size] (a relative position bias, rotary Q and K), as ONNX's Attention: one kernel instead of two MatMuls, the
    scale, the Adds and the Softmax. Terms every layer adds alike (a position bias and the padding mask) are summed
    once; the answers are bit-identical where the scale is a power of two and the terms past the first are such a
    mask (0 or the lowest float); transformers' padding mask is made in seven operators instead of its export's
    30-odd (optimize/attention/padding_mask.py). Where Q, K and V are projections split into heads (a rotary
    embedding after the split is moved before its transpose) and the output is merged back, Attention takes and
    answers the merged [batch, sequence, heads x size] tensors, and the Reshapes and Transposes go. The model as it
    was, and 0, where no attention is written out so, or the graph cannot be lifted to opset 23."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    if not _written_cores(model.graph, None):
        return model, 0
    shapes = activation_shapes(model)  # the converter keeps every tensor's name
    if not _written_cores(model.graph, shapes):
        return model, 0
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), ATTENTION_OPSET)
    try:  # `model` gives its weights up to the lifted graph, so they are held once
        lifted = model if current >= ATTENTION_OPSET else converted(model, ATTENTION_OPSET, restore=False)
    except Exception:  # the converter raises bare errors for operators it has no adapter for
        return model, 0
    cores = _written_cores(lifted.graph, shapes)
    replaced = {id(node) for core in cores for node in core.nodes + (core.merged.nodes if core.merged else [])}
    added: dict[str, onnx.NodeProto] = {}  # by output: a cos/sin both Q and K of a layer read is turned once
    for merged in (core.merged for core in cores if core.merged is not None):
        for node, index, name in merged.edits:
            node.input[index] = name
        added.update((node.output[0], node) for node in merged.added)
    by_output = {id(core.output): core for core in cores}
    padding = padding_terms(lifted, [term for core in cores for term in core.terms], shapes)
    sums: dict[tuple[str, ...], str] = {}
    nodes: list[onnx.NodeProto] = []
    if len(set(padding.values())) == 1:
        nodes += padding_mask(lifted.graph, MASK, next(iter(padding.values())))
    else:
        padding = {}
    producers = {out: node for node in lifted.graph.node for out in node.output}

    def summed(term: str) -> str:
        """The term as it is added beside the padding mask, [batch, 1, sequence, sequence]: a rank-4 tensor
        Expanded to the scores' shape goes in as it is (the sum broadcasts it, Attention broadcasts the heads)."""
        if term in padding:
            return MASK
        node = producers.get(term)
        if node is not None and node.op_type == "Expand" and len(shapes.get(node.input[0], ())) == 4:
            return str(node.input[0])
        return term

    for node in lifted.graph.node:
        core = by_output.get(id(node))
        if core is None:
            if id(node) not in replaced:
                nodes.append(node)
            continue
        inputs = [core.query, core.key, core.value]
        if core.terms:
            key = tuple(map(summed, core.terms)) if padding.keys() & set(core.terms) else tuple(core.terms)
            if key not in sums:
                total = key[0]
                for index, term in enumerate(key[1:]):
                    name = f"written_attention/terms{len(sums)}/{index}"
                    nodes.append(helper.make_node("Add", [total, term], [name], name=name))
                    total = name
                sums[key] = total
            inputs.append(sums[key])
        name = f"{node.name or node.output[0]}/Attention"
        if core.merged is None:
            nodes += core.making_key
            nodes.append(helper.make_node("Attention", inputs, [node.output[0]], name=name, scale=core.scale))
        else:
            merged = core.merged
            nodes.append(helper.make_node("Attention", [merged.query, merged.key, merged.value, *inputs[3:]],
                                          [merged.output], name=name, scale=core.scale, q_num_heads=merged.heads,
                                          kv_num_heads=merged.heads))
    del lifted.graph.node[:]
    lifted.graph.node.extend([*nodes, *added.values()])
    OnnxModel(lifted).prune_graph(allow_remove_graph_inputs=False)  # what computed the Reshapes' target shapes
    # the shared sums go where the first layer needs them, before other layers' own inputs exist
    OnnxModel.graph_topological_sort(lifted.graph)
    return lifted, len(cores)


@dataclass
class _Core:
    nodes: list[onnx.NodeProto]  # what the Attention replaces
    output: onnx.NodeProto  # MatMul(P, V)
    query: str
    key: str
    making_key: list[onnx.NodeProto]  # a Transpose to K, where the graph had only K^T
    value: str
    scale: float
    terms: list[str]
    merged: _Merged | None = None


@dataclass
class _Merged:
    """Q, K and V as the [batch, sequence, heads x size] projections they were split from, and the tensor the
    output is merged into: what Attention reads and writes in place of the 4-d ones."""
    query: str
    key: str
    value: str
    heads: int
    output: str
    nodes: list[onnx.NodeProto]  # the Reshapes and Transposes between them and the attention
    # a rotary embedding turned before the split instead of after: (node, input index, tensor it reads now), and
    # the nodes that transpose its cos/sin and merge its output
    edits: list[tuple[onnx.NodeProto, int, str]] = field(default_factory=list)
    added: list[onnx.NodeProto] = field(default_factory=list)


class _Scores:
    """Q K^T x scale + terms, read back from the tensor a Softmax takes."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.producers = {out: node for node in graph.node for out in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in graph.output}
        self.initializers = {init.name: init for init in graph.initializer}

    def constant(self, tensor: str) -> np.ndarray | None:
        """The value of an initializer or a Constant node's output, None for anything else."""
        value = self.initializers.get(tensor)
        node = self.producers.get(tensor)
        if value is None and node is not None and node.op_type == "Constant" and node.attribute and (
                node.attribute[0].name == "value"):
            value = node.attribute[0].t
        return None if value is None else numpy_helper.to_array(value)

    def scalar(self, tensor: str) -> float | None:
        """The value of a float scalar constant (a scale), None for anything else."""
        init = self.initializers.get(tensor)
        if init is not None and (init.dims or init.data_type != onnx.TensorProto.FLOAT):
            return None  # not a scalar: no weight is read here
        value = self.constant(tensor)
        return None if value is None or value.dtype != np.float32 or value.ndim else float(value)

    def ints(self, tensor: str) -> list[int] | None:
        """The values of an integer constant, None for anything else."""
        init = self.initializers.get(tensor)
        if init is not None and init.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            return None
        value = self.constant(tensor)
        if value is None or value.dtype not in (np.int64, np.int32):
            return None
        return [int(v) for v in value.reshape(-1)]

    def read_once(self, tensor: str) -> bool:
        """Only one node reads `tensor`, and the graph does not answer it."""
        return len(self.consumers.get(tensor, [])) == 1 and tensor not in self.outputs

    def read(self, tensor: str) -> tuple[list[onnx.NodeProto], list[str], float] | None:
        """(the nodes from the scores' MatMul on, the terms added in order, the scale)."""
        node = self.producers.get(tensor)
        if node is None or not self.read_once(tensor) or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "MatMul":
            return [node], [], 1.0
        divisor = self.scalar(node.input[1]) if node.op_type == "Div" else None
        if divisor is not None:
            inner = self.read(node.input[0])
            return None if inner is None else ([*inner[0], node], inner[1], inner[2] / divisor)
        if node.op_type == "Mul":
            for factor, other in ((node.input[1], node.input[0]), (node.input[0], node.input[1])):
                value = self.scalar(factor)
                inner = self.read(other) if value is not None else None
                if inner is not None and value is not None:
                    return [*inner[0], node], inner[1], inner[2] * value
        if node.op_type == "Add":
            for chain, term in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
                inner = self.read(chain)
                if inner is not None:
                    return [*inner[0], node], [*inner[1], term], inner[2]
        return None


def _written_cores(graph: onnx.GraphProto, shapes: dict[str, list[int | str | None]] | None) -> list[_Core]:
    """Each Softmax between Q K^T and its product with V; `shapes`: only those whose Q, K and V are known to be
    of rank 4 (None: any, to see whether there are candidates at all)."""
    scores = _Scores(graph)
    cores = []
    for softmax in graph.node:
        if softmax.op_type != "Softmax" or softmax.domain not in ("", "ai.onnx"):
            continue
        axis = next((a.i for a in softmax.attribute if a.name == "axis"), -1)
        users = scores.consumers.get(softmax.output[0], [])
        if (axis not in (-1, 3) or not scores.read_once(softmax.output[0]) or users[0].op_type != "MatMul"
                or users[0].input[0] != softmax.output[0]):
            continue
        found = scores.read(softmax.input[0])
        if found is None:
            continue
        matmul = found[0][0]
        transpose = scores.producers.get(matmul.input[1])
        if transpose is None or transpose.op_type != "Transpose" or not scores.read_once(matmul.input[1]):
            continue
        perm = _perm(transpose)
        if perm == (0, 1, 3, 2):
            key, making = transpose.input[0], []
        elif perm == (0, 2, 3, 1):
            key = f"{transpose.output[0]}/key"
            making = [helper.make_node("Transpose", [transpose.input[0]], [key], name=key, perm=[0, 2, 1, 3])]
        else:
            continue
        query, value = matmul.input[0], users[0].input[1]
        if shapes is not None and any(len(shapes.get(name, ())) != 4 for name in (query, matmul.input[1], value)):
            continue
        core = _Core([softmax, users[0], *found[0], transpose], users[0], query, key, making, value, found[2],
                     found[1])
        if shapes is not None:
            core.merged = _merged(core, transpose, perm, scores, shapes)
        cores.append(core)
    return cores


def _merged(core: _Core, transpose: onnx.NodeProto, perm: tuple[int, ...], scores: _Scores,
          shapes: dict[str, list[int | str | None]]) -> _Merged | None:
    """The merged form of `core`, where each of Q, K and V is a [batch, sequence, heads, size] tensor transposed to
    heads first (maybe then rotated), and the output goes only through the inverse Transpose and a Reshape; None
    elsewhere."""
    edits: list[tuple[onnx.NodeProto, int, str]] = []
    added: list[onnx.NodeProto] = []

    def merge(tensor: str, heads: int, size: int) -> str:
        shape = f"written_attention/merged_shape/{heads * size}"
        added.append(helper.make_node("Constant", [], [shape], name=shape, value=numpy_helper.from_array(
            np.array([0, 0, heads * size], np.int64))))
        added.append(helper.make_node("Reshape", [tensor, shape], [f"{tensor}/merged"], name=f"{tensor}/merged"))
        return f"{tensor}/merged"

    def split(tensor: str, order: tuple[int, ...]) -> tuple[str, int, list[onnx.NodeProto]] | None:
        turn = scores.producers.get(tensor)
        if turn is None or turn.op_type != "Transpose" or _perm(turn) != order or not scores.read_once(tensor):
            return None
        heads = _heads(shapes.get(turn.input[0]))
        if heads is None:
            return None
        reshape = scores.producers.get(turn.input[0])
        if (reshape is not None and reshape.op_type == "Reshape" and scores.read_once(turn.input[0])
                and _heads_split(shapes.get(reshape.input[0]), shapes.get(reshape.output[0])) == heads[0]):
            return reshape.input[0], heads[0], [turn, reshape]  # the projection as it came
        return merge(turn.input[0], *heads), heads[0], [turn]

    def rotated(tensor: str) -> tuple[str, int, list[onnx.NodeProto]] | None:
        found = split(tensor, (0, 2, 1, 3))
        if found is not None or not scores.read_once(tensor):
            return found
        rotation = _rotation(tensor, scores, shapes)
        if rotation is None:
            return None
        turn, heads, rotation_edits, operands = rotation
        edits.extend(rotation_edits)
        added.extend(helper.make_node("Transpose", [operand], [f"{operand}/turned"], name=f"{operand}/turned",
                                      perm=[0, 2, 1, 3]) for operand in operands)
        return merge(tensor, *heads), heads[0], [turn]

    query = rotated(core.query)
    # K^T straight from the split projection, or K^T = Transpose(K) of a split (and maybe rotated) K
    key = (split(transpose.output[0], (0, 2, 3, 1)) if perm == (0, 2, 3, 1) else rotated(transpose.input[0]))
    value = split(core.value, (0, 2, 1, 3))
    if query is None or key is None or value is None or not scores.read_once(core.output.output[0]):
        return None
    (turn,) = scores.consumers[core.output.output[0]]
    if turn.op_type != "Transpose" or _perm(turn) != (0, 2, 1, 3) or not scores.read_once(turn.output[0]):
        return None
    (merge_back,) = scores.consumers[turn.output[0]]
    if merge_back.op_type != "Reshape":
        return None
    heads = {query[1], key[1], value[1], _heads_split(shapes.get(merge_back.output[0]), shapes.get(turn.output[0]))}
    if len(heads) != 1 or None in heads:
        return None
    return _Merged(query[0], key[0], value[0], query[1], merge_back.output[0],
                   [*query[2], *key[2], *value[2], turn, merge_back], edits, added)


def _heads(split: list[int | str | None] | None) -> tuple[int, int] | None:
    """(heads, size) of a [batch, sequence, heads, size] tensor whose last two sizes are numbers."""
    if split is None or len(split) != 4 or not isinstance(split[2], int) or not isinstance(split[3], int):
        return None
    return split[2], split[3]


ROTATION_OPS = ("Add", "Sub", "Mul", "Neg", "Slice", "Concat")


def _rotation(tensor: str, scores: _Scores, shapes: dict[str, list[int | str | None]]
              ) -> tuple[onnx.NodeProto, tuple[int, int], list[tuple[onnx.NodeProto, int, str]], list[str]] | None:
    """A rotary embedding between t = Transpose(x, (0, 2, 1, 3)) of a [batch, sequence, heads, size] x and
    `tensor`: elementwise operators and Slices and Concats on the last axis, so it turns t's rows alike in either
    layout and can read x instead, its rank-4 cos and sin transposed the same way. (t's Transpose, (heads, size),
    the input edits that do it, the operands to transpose); None where anything else is in between."""
    region: dict[int, onnx.NodeProto] = {}
    found: list[onnx.NodeProto] = []  # the split's Transpose
    operands: dict[tuple[int, int], str] = {}  # (node, input index) -> an operand from outside, of rank 4

    def reaches(name: str) -> bool:
        node = scores.producers.get(name)
        if node is None or node.domain not in ("", "ai.onnx"):
            return False
        if node.op_type == "Transpose" and _perm(node) == (0, 2, 1, 3):
            found.append(node)
            return True
        if node.op_type not in ROTATION_OPS:
            return False
        if node.op_type == "Slice" and (len(node.input) < 4 or scores.ints(node.input[3]) not in ([3], [-1])):
            return False
        if node.op_type == "Concat" and next((a.i for a in node.attribute if a.name == "axis"), None) not in (3, -1):
            return False
        data = list(node.input[:1]) if node.op_type == "Slice" else list(node.input)
        inner = [reaches(name) for name in data]
        if not any(inner):
            return False
        for index, (name, inside) in enumerate(zip(data, inner)):
            if not inside:
                shape = shapes.get(name)
                if shape is not None and len(shape) == 4:
                    operands[(id(node), index)] = name
                elif shape is None or len(shape) > 1:  # a scalar or a vector broadcasts alike in either layout
                    return False
        region[id(node)] = node
        return True

    if not reaches(tensor) or len({id(node) for node in found}) != 1:
        return None
    turn = found[0]
    split = turn.input[0]
    heads = _heads(shapes.get(split))
    if heads is None:
        return None
    # every value inside is read only inside, but for `tensor`; t also by Shapes whose size is read at index 3
    edits: list[tuple[onnx.NodeProto, int, str]] = []
    for node in region.values():
        for out in node.output:
            if out != tensor and (out in scores.outputs or any(
                    id(user) not in region for user in scores.consumers.get(out, []))):
                return None
    for user in scores.consumers.get(turn.output[0], []):
        if id(user) in region:
            edits += [(user, index, split) for index, name in enumerate(user.input) if name == turn.output[0]]
        elif user.op_type == "Shape" and all(
                gather.op_type == "Gather" and scores.ints(gather.input[1]) in ([3], [-1])
                for gather in scores.consumers.get(user.output[0], [])):
            edits.append((user, 0, split))
        else:
            return None
    for (node_id, index), name in operands.items():
        edits.append((region[node_id], index, f"{name}/turned"))
    return turn, heads, edits, sorted(set(operands.values()))


def _heads_split(merged: list[int | str | None] | None, split: list[int | str | None] | None) -> int | None:
    """h, where `split` is [batch, sequence, h, size] and `merged` [batch, sequence, h x size]."""
    found = _heads(split)
    if merged is None or split is None or found is None or len(merged) != 3:
        return None
    heads, size = found
    if None in split[:2] or split[:2] != merged[:2] or merged[2] != heads * size:
        return None
    return heads


def _perm(node: onnx.NodeProto) -> tuple[int, ...]:
    return next((tuple(a.ints) for a in node.attribute if a.name == "perm"), ())
