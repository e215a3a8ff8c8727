"""Dynamic INT8 quantization that keeps the fewest harmful nodes in float until parity passes."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx

from optimize.graph.onnxio import model_bytes, needs_external_data
from optimize.stages.s6_quantize.config import QuantizationConfig


def quantizable_nodes(model_path: Path, config: QuantizationConfig) -> list[str]:
    graph = onnx.load(str(model_path), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    return [n.name for n in graph.node if n.op_type in config.op_types and any(i in weights for i in n.input[1:])]


def quantize(src: Path, dst: Path, config: QuantizationConfig, include: list[str] | None = None,
             exclude: list[str] | None = None) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet_root_logger():  # the quantizer logs pre-processing advice through the root logger
        quantize_dynamic(src, dst, per_channel=config.per_channel, reduce_range=config.reduce_range,
                         weight_type=getattr(QuantType, config.weight_type),
                         op_types_to_quantize=list(config.op_types), nodes_to_quantize=include,
                         nodes_to_exclude=exclude, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
                         use_external_data_format=needs_external_data(model_bytes(src)))


@contextmanager
def quiet_root_logger() -> Iterator[None]:
    """The root logger at ERROR for the duration only: the caller's logging is left as it was."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


