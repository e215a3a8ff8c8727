"""Outlier channels kept in float, so the rest of a MatMul's input quantizes finely.

Transformer activations carry a few channels (and the first token) whose values are 10x the rest.
Dynamic INT8 quantizes a whole input tensor with one scale, so those few values set the step for all
others. Each MatMul whose input has such channels is split: the outlier channels go through a small
float MatMul, the others (outliers masked to zero) through the INT8 one, and the two are added.
A fused Attention computes its projection inside one operator, so it cannot be split; its input is
smoothed instead (SmoothQuant): divided per channel by s, with the weight rows multiplied by s, which
moves part of the outliers' range from the activations into the per-channel quantized weights.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from infinity.manifest import Outliers
from optimize.graph.onnxio import save_model

RATIO = 3.0         # a channel is an outlier when its calibrated range exceeds RATIO x the median channel's
MAX_CHANNELS = 16   # at most this many per MatMul: the float side path stays small
ALPHA = 0.5         # smoothing strength: s = range_x^ALPHA / range_w^(1 - ALPHA)


@dataclass
class OutlierSplit:
    channels: dict[str, int] = field(default_factory=dict)  # split MatMul -> outlier channels moved to float
    float_nodes: list[str] = field(default_factory=list)    # the float side paths, never to be quantized
    smoothed: list[str] = field(default_factory=list)       # Attention nodes whose input was smoothed

    def record(self) -> Outliers:
        """The manifest's record of this split."""
        return Outliers(applied=True, ratio=RATIO, max_channels=MAX_CHANNELS, nodes=len(self.channels),
                        channels=sum(self.channels.values()), per_node=dict(self.channels), smoothing_alpha=ALPHA,
                        smoothed=list(self.smoothed))


def side_path_name(node: str) -> str:
    return f"{node}/outliers/MatMul"


def outlier_channels(peak: np.ndarray, limit: int = MAX_CHANNELS, ratio: float = RATIO) -> np.ndarray:
    """The up to `limit` channels whose range exceeds `ratio` x the median; ratio 0 takes the top `limit`."""
    order = np.argsort(peak)[::-1][:limit]
    if ratio > 0:
        order = order[peak[order] > ratio * np.median(peak)]
    return np.sort(order)


def split_outliers(src: Path, dst: Path, ranges: dict[str, np.ndarray],
                   limits: dict[str, int] | None = None) -> OutlierSplit:
    """Rewrites each MatMul in `ranges` with a constant weight; `limits` fixes the channel count per node
    (the top channels, whatever their ratio) instead of choosing them by RATIO."""
    model = onnx.load(str(src))
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    uses = Counter(name for node in graph.node for name in node.input)
    split = OutlierSplit()
    nodes = []
    for node in graph.node:
        if (node.name not in ranges or len(node.input) < 2 or node.input[1] not in weights
                or uses[node.input[1]] > 1):  # a shared weight cannot be rewritten for one of its users
            nodes.append(node)
            continue
        if node.op_type == "Attention":
            nodes.extend(_smooth(node, weights[node.input[1]], ranges[node.name], graph))
            split.smoothed.append(node.name)
            continue
        if node.op_type != "MatMul":
            nodes.append(node)
            continue
        if limits is None:
            channels = outlier_channels(ranges[node.name])
        else:
            channels = outlier_channels(ranges[node.name], limits.get(node.name, 0), ratio=0)
        if not len(channels):
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(weights[node.input[1]])
        if weight.ndim != 2:
            nodes.append(node)
            continue
        prefix, x, y = node.name, node.input[0], node.output[0]
        keep = np.ones(weight.shape[0], dtype=np.float32)
        keep[channels] = 0
        inlier_weight = weight * keep[:, None]  # rows of the outliers are served by the side path
        graph.initializer.extend([
            numpy_helper.from_array(keep, f"{prefix}/outliers/keep"),
            numpy_helper.from_array(channels.astype(np.int64), f"{prefix}/outliers/index"),
            numpy_helper.from_array(weight[channels].astype(np.float32), f"{prefix}/outliers/weight"),
        ])
        weights[node.input[1]].CopyFrom(numpy_helper.from_array(inlier_weight.astype(weight.dtype), node.input[1]))
        node.input[0], node.output[0] = f"{prefix}/outliers/inliers", f"{prefix}/outliers/inlier_product"
        nodes.extend([
            helper.make_node("Mul", [x, f"{prefix}/outliers/keep"], [node.input[0]], name=f"{prefix}/outliers/Mul"),
            node,
            helper.make_node("Gather", [x, f"{prefix}/outliers/index"], [f"{prefix}/outliers/values"],
                             name=f"{prefix}/outliers/Gather", axis=-1),
            helper.make_node("MatMul", [f"{prefix}/outliers/values", f"{prefix}/outliers/weight"],
                             [f"{prefix}/outliers/product"], name=side_path_name(prefix)),
            helper.make_node("Add", [node.output[0], f"{prefix}/outliers/product"], [y],
                             name=f"{prefix}/outliers/Add"),
        ])
        split.channels[node.name] = len(channels)
        split.float_nodes.append(side_path_name(prefix))
    del graph.node[:]
    graph.node.extend(nodes)
    save_model(model, dst)
    return split


def _smooth(node: onnx.NodeProto, weight_init: onnx.TensorProto, peak: np.ndarray,
            graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    weight = numpy_helper.to_array(weight_init)
    scale = np.maximum(peak, 1e-5) ** ALPHA / np.maximum(np.abs(weight).max(axis=1), 1e-5) ** (1 - ALPHA)
    scale = scale / np.exp(np.log(scale).mean())  # no overall gain, only the balance between channels
    weight_init.CopyFrom(numpy_helper.from_array((weight * scale[:, None]).astype(weight.dtype), weight_init.name))
    prefix = node.name
    graph.initializer.append(numpy_helper.from_array((1 / scale).astype(np.float32), f"{prefix}/smooth/scale"))
    smoothed = helper.make_node("Mul", [node.input[0], f"{prefix}/smooth/scale"], [f"{prefix}/smooth/input"],
                                name=f"{prefix}/smooth/Mul")
    node.input[0] = f"{prefix}/smooth/input"
    return [smoothed, node]
