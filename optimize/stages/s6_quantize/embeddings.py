"""INT8 word embeddings for large vocabularies.

A multilingual vocabulary's table is most of a model's bytes (XLM-R large: 250k x 1024 floats, 1 GB of 2.2 GB),
and MatMul quantization never touches it: the lookup reads only the rows a batch needs, so storing them as
INT8 with one scale per row costs a multiply per looked-up value and saves three quarters of the table.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from optimize.graph.onnxio import save_model

LARGE_TABLE_BYTES = 64 << 20  # below this (MiniLM's 47 MB table) the saving is not worth a changed graph


def quantize_embedding_tables(src: Path, dst: Path, min_bytes: int = LARGE_TABLE_BYTES) -> list[str]:
    """Rewrite each float table of at least `min_bytes` that only Gather nodes read (on axis 0) as INT8 rows
    times a per-row scale; returns the tables rewritten (none: `dst` is not written)."""
    model = onnx.load(str(src))
    graph = model.graph
    tables = {init.name: init for init in graph.initializer
              if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 2
              and int(np.prod(init.dims)) * 4 >= min_bytes}
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            if name in tables:
                readers[name].append(node)
    chosen = [name for name, nodes in readers.items()
              if all(n.op_type == "Gather" and n.input[0] == name and _axis(n) == 0 for n in nodes)]
    if not chosen:
        return []
    for name in chosen:
        tensor = tables.pop(name)
        table = numpy_helper.to_array(tensor).astype(np.float32)
        graph.initializer.remove(tensor)
        del tensor
        # in place: XLM-R's table is 1 GB in float, and each temporary copy another
        scale = np.maximum(np.abs(table).max(axis=1, keepdims=True), 1e-12) / 127.0
        np.divide(table, scale, out=table)
        np.clip(np.rint(table, out=table), -127, 127, out=table)
        quantized = table.astype(np.int8)
        del table
        graph.initializer.extend([numpy_helper.from_array(quantized, f"{name}/int8"),
                                  numpy_helper.from_array(scale.astype(np.float32), f"{name}/row_scale")])
        for gather in readers[name]:
            out, ids = gather.output[0], gather.input[1]
            gather.input[0] = f"{name}/int8"
            gather.output[0] = f"{out}/int8"
            index = list(graph.node).index(gather)
            extra = [helper.make_node("Cast", [f"{out}/int8"], [f"{out}/float"], to=onnx.TensorProto.FLOAT,
                                      name=f"{gather.name}/Cast"),
                     helper.make_node("Gather", [f"{name}/row_scale", ids], [f"{out}/row_scale"], axis=0,
                                      name=f"{gather.name}/RowScale"),
                     helper.make_node("Mul", [f"{out}/float", f"{out}/row_scale"], [out], name=f"{gather.name}/Mul")]
            for offset, node in enumerate(extra, start=1):
                graph.node.insert(index + offset, node)
    save_model(model, dst)
    return chosen


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)
