"""ONNX models of any size on disk: one file up to a threshold, above it the graph plus one weights file.

Protobuf cannot serialize a message over 2 GiB, so a model past that (XLM-R large, 560M parameters in fp32)
must keep its weights beside the graph ("external data"); onnxruntime finds them next to the .onnx file.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from infinity.artifact import sha256_file
from infinity.manifest import ModelFile, Precision

# Well below protobuf's 2 GiB: the graph, names and attributes add to the weights.
EXTERNAL_DATA_BYTES = 1 << 30
INLINE_BYTES = 1024  # constants this small stay in the graph: shape inference reads shapes and split sizes there
_DETACHED = "detached"  # the location of an initializer whose bytes are held aside, never a file
ATTENTION_OPSET = 23  # the first opset with ONNX's own Attention operator


def data_file(path: Path) -> Path:
    return path.with_name(path.name + ".data")


def weight_bytes(model: onnx.ModelProto) -> int:
    return sum(_raw_bytes(t) for t in model.graph.initializer)


def save_model(model: onnx.ModelProto, path: Path, external_data_bytes: int | None = None,
               weights_from: Path | None = None) -> None:
    """Write `model` to `path`, its weights to `path`.data when they exceed the threshold (default 1 GiB).
    The in-memory model's weights move out to the file when they do: do not reuse it afterwards. Weights still in
    another model's weights file (weights_left_on_disk) are read from its folder, `weights_from`, first."""
    path = Path(path)
    if weights_from is not None:
        onnx.external_data_helper.load_external_data_for_model(model, str(weights_from))
    limit = EXTERNAL_DATA_BYTES if external_data_bytes is None else external_data_bytes
    data_file(path).unlink(missing_ok=True)  # onnx appends to an existing data file
    if weight_bytes(model) > limit:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_file(path).name, size_threshold=INLINE_BYTES)  # small constants stay inline:
        # onnxruntime's shape inference reads shapes and split sizes from the graph itself
        data_file(path).chmod(0o644)  # onnx writes it owner-only; the server may run as another user
    else:
        onnx.save_model(model, str(path))


def copy_model(src: Path, dst: Path, external_data_bytes: int | None = None) -> None:
    """A copy under another name: the weights file is renamed with it, and the graph points at the new name."""
    save_model(onnx.load(str(src)), dst, external_data_bytes)


def weights_beside(path: Path) -> None:
    """The graph and its weights as two files whatever their size, as the artifact keeps them: onnxruntime maps a
    weights file where it parses and copies weights held in the graph (MiniLM INT8 on a 2-vCPU Xeon: its session
    loads in 0.015 s instead of 0.09, and the server holds 50 MB less)."""
    if not external_files(path):
        copy_model(path, path, external_data_bytes=0)


def external_files(path: Path) -> list[str]:
    """The weights files the model at `path` reads, relative to its folder."""
    graph = onnx.load(str(path), load_external_data=False).graph
    names = {entry.value for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
             for entry in t.external_data if entry.key == "location"}
    return sorted(names)


def model_bytes(path: Path) -> int:
    """The model's size on disk, weights file included."""
    path = Path(path)
    return path.stat().st_size + sum((path.parent / name).stat().st_size for name in external_files(path))


def describe_model(path: Path, precision: Precision, checksums: bool = True) -> ModelFile:
    """A graph file as the manifest records it: checksums (its weights file's too; empty without `checksums`),
    opset, inputs and outputs."""
    def digest(file: Path) -> str:
        return sha256_file(file) if checksums else ""

    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)

    def shape(value: Any) -> list[str | int]:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    return ModelFile(
        file=path.name, sha256=digest(path), precision=precision, opset=int(opset),
        inputs={v.name: shape(v) for v in model.graph.input},
        outputs={v.name: shape(v) for v in model.graph.output},
        size_bytes=model_bytes(path),
        external_data={name: digest(path.parent / name) for name in external_files(path)},
    )


def session_source(model: onnx.ModelProto, scratch: Path) -> bytes | str:
    """What onnxruntime.InferenceSession takes for an in-memory model: its bytes, or a file when too large."""
    if weight_bytes(model) <= EXTERNAL_DATA_BYTES:
        serialized: bytes = model.SerializeToString()
        return serialized
    path = Path(scratch) / "session.onnx"
    save_model(model, path)
    return str(path)


@contextmanager
def weights_left_on_disk(path: Path) -> Iterator[onnx.ModelProto]:
    """The model at `path` with the weights of its weights file, if it has one, left in that file: onnx reads a
    weight from there when a routine asks for its values (the model's folder is the working directory while the
    block runs: onnx resolves a weights file's name against it) and copies only the graph otherwise. save_model
    with `weights_from` reads the rest in."""
    model = onnx.load(str(path), load_external_data=False)
    cwd = os.getcwd()
    os.chdir(Path(path).resolve().parent)
    try:
        yield model
    finally:
        os.chdir(cwd)


def needs_external_data(nbytes: int) -> bool:
    return nbytes > EXTERNAL_DATA_BYTES


def on_graph_only(model: onnx.ModelProto, transform: Callable[[onnx.ModelProto], onnx.ModelProto],
                  restore: bool = True) -> onnx.ModelProto:
    """`transform(model)` with the weights held aside: routines that serialize the whole model (onnx's version
    converter, shape inference) then see the graph alone, which stays far under protobuf's 2 GiB whatever the
    weights weigh. Every initializer over INLINE_BYTES is marked as external data while it runs, and gets its
    bytes back after, in what `transform` returns and (`restore`, or where `transform` raises) in `model`: without
    it the weights are held once, not twice, and `model` is left without them."""
    detached: dict[str, bytes] = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL and _held_inline(tensor):
            detached[tensor.name] = tensor.raw_data
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            entry = tensor.external_data.add()
            entry.key, entry.value = "location", _DETACHED
    try:
        result = transform(model)
    except BaseException:
        _attach(model, detached)
        raise
    _attach(result, detached, last=not restore)
    if restore:
        _attach(model, detached, last=True)
    return result


def _attach(model: onnx.ModelProto, detached: dict[str, bytes], last: bool = False) -> None:
    """`last`: each weight's bytes are let go once attached, so that they are held once, not twice."""
    for tensor in model.graph.initializer:
        if tensor.name in detached and [(e.key, e.value) for e in tensor.external_data] == [("location", _DETACHED)]:
            tensor.ClearField("external_data")
            tensor.data_location = onnx.TensorProto.DEFAULT
            tensor.raw_data = detached.pop(tensor.name) if last else detached[tensor.name]


def shapes_inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnxruntime's symbolic shape inference (it knows onnxruntime's fused operators) on a copy of the graph
    whose weights (raw data over INLINE_BYTES, or in a weights file) are typed graph inputs: the tool reads the
    data of every initializer it is given, and a weight's shape is all it needs. `model` is left as it is: holding
    its weights aside and giving them back would grow its memory by their size (protobuf frees a message's bytes
    only with the whole message)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    copy = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, functions=model.functions)
    graph, source = copy.graph, model.graph
    graph.name = source.name
    for field in ("node", "input", "output", "value_info"):
        getattr(graph, field).extend(getattr(source, field))
    for tensor in source.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL or _held_inline(tensor):
            graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
        else:
            graph.initializer.append(tensor)
    for node in copy.graph.node:
        if node.op_type == "Attention" and node.domain in ("", "ai.onnx"):
            # the tool takes ONNX's Attention for onnxruntime's and stops at it; its answer has Q's shape (where V's
            # head size is Q's, as in every encoder here)
            node.CopyFrom(helper.make_node("Identity", node.input[:1], node.output[:1], name=node.name))
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)  # where the tool saves the graph it could not complete (sym_shape_infer_temp.onnx)
        try:
            inferred: onnx.ModelProto = SymbolicShapeInference.infer_shapes(copy, auto_merge=True)
        finally:
            os.chdir(cwd)
    return inferred


def _raw_bytes(tensor: onnx.TensorProto) -> int:
    """The size of a tensor's raw data (0 without), read from its shape and type rather than by copying the
    bytes out."""
    if not tensor.HasField("raw_data"):
        return 0
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError):  # a type numpy has no dtype for
        return len(tensor.raw_data)
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def _held_inline(tensor: onnx.TensorProto) -> bool:
    """A weight on_graph_only holds aside."""
    return _raw_bytes(tensor) > INLINE_BYTES


def converted(model: onnx.ModelProto, opset: int, restore: bool = True) -> onnx.ModelProto:
    """`model` at ONNX opset `opset`, by onnx's version converter on the graph alone (it serializes what it is
    given: past 2 GiB of weights it would fail). Raises what the converter raises for an operator it has no
    adapter for. `restore`: as on_graph_only's."""
    from onnx import version_converter

    return on_graph_only(model, lambda graph: version_converter.convert_version(graph, opset), restore)


def activation_shapes(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    """Shape of every tensor symbolic shape inference can name (it knows onnxruntime's fused operators): each
    dimension a number, a symbol (alike in every tensor of that size) or None; {} where the tool cannot run."""
    try:
        inferred = shapes_inferred(model)
    except Exception:  # the tool raises bare Exceptions on graphs it cannot follow
        return {}
    return {v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param or None
                     for d in v.type.tensor_type.shape.dim]
            for v in [*inferred.graph.input, *inferred.graph.value_info] if v.type.tensor_type.HasField("shape")}


def constant(graph: onnx.GraphProto, name: str, value: np.ndarray) -> str:
    """Adds `value` to the graph's initializers as `name`; returns the name."""
    graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def matmul_weight(node: onnx.NodeProto, weights: dict[str, onnx.TensorProto]) -> onnx.TensorProto | None:
    """The constant 2-D weight a MatMul or fused Attention multiplies by, or None."""
    if node.op_type not in ("MatMul", "Attention") or len(node.input) < 2 or node.input[1] not in weights:
        return None
    weight = weights[node.input[1]]
    # one output column stays float: a single dot product per row costs next to nothing, and INT8 rounding shows
    # most there (bge-m3's sparse weight of each token)
    return weight if len(weight.dims) == 2 and weight.dims[1] > 1 else None
