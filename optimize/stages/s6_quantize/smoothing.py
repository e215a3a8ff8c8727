"""How strongly each input is smoothed, chosen per input from its calibration rows.

SmoothQuant moves an input's outlier channels into the weights with s = range_x^alpha / range_w^(1 - alpha). One
alpha for a whole model is a poor fit for a trained one: on all-mpnet-base-v2, alpha 0.5 left the FFN's
down-projection inputs (GELU outputs) of layers 1-4 at 3-9x the error they have unsmoothed, while the inputs read
from a LayerNorm wanted 0.65-0.8. So each input's strength is the one (or none at all) whose INT8 product,
simulated in numpy exactly as the graph will compute it (smoothing, the input's scales, the weights' codes), is
closest to the float product on calibration rows its scales were not fitted to. No graph is built or run for the
choice.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from optimize.stages.s6_quantize.calibrate import Bounds, Calibration
from optimize.stages.s6_quantize.per_token import (
    GELU_ZERO,
    activation_levels,
    calibrated_scale,
    gelu_floor,
    gelu_step,
    input_role,
    rewritable,
    smoothing_scales,
)
from optimize.stages.s6_quantize.rounding import quantize_weight

Strengths = dict[str, float | None]  # input tensor -> alpha, None: not smoothed


def choose_strengths(model_path: Path, calibration: Calibration, alphas: tuple[float, ...], weight_bits: int,
                     calibrated_roles: frozenset[str]) -> Strengths:
    """Per input read by quantized MatMuls: the alpha of `alphas`, or None, with the least simulated error summed
    over its readers (relative Frobenius norm of the product's error, two-fold over the calibration rows)."""
    # the MatMuls' weights alone are read: a model past 1 GiB keeps its embedding table on disk
    graph = onnx.load(str(model_path), load_external_data=False).graph
    producers = {out: node for node in graph.node for out in node.output}
    weights = {init.name: init for init in graph.initializer}
    readers: dict[str, list[tuple[str, np.ndarray]]] = defaultdict(list)
    for node in rewritable(graph):
        weight = numpy_helper.to_array(weights[node.input[1]], base_dir=str(Path(model_path).parent))
        readers[node.input[0]].append((node.name, weight))
    chosen: Strengths = {}
    for tensor, nodes in readers.items():
        rows = calibration.samples.get(tensor)
        if rows is None or len(rows) < 2 or any(name not in calibration.bounds for name, _ in nodes):
            continue
        role = input_role(tensor, producers.get(tensor))
        scheme = "calibrated" if role in calibrated_roles else "gelu" if role == "gelu" else "row"
        rows, matrices = rows.astype(np.float32), [w for _, w in nodes]
        errors = {alpha: folded_error(rows, matrices, alpha, scheme, weight_bits) for alpha in (None, *alphas)}
        chosen[tensor] = min(errors, key=lambda alpha: errors[alpha])
    return chosen


def folded_error(rows: np.ndarray, weights: list[np.ndarray], alpha: float | None, scheme: str,
                 weight_bits: int) -> float:
    """Two-fold: scales from one half of the rows, error on the other, both ways. Rows past the calibrated range
    saturate in the graph, so a strength is judged on rows its range was not fitted to."""
    half = len(rows) // 2
    first, second = rows[:half], rows[half:]
    return (simulated_error(first, second, weights, alpha, scheme, weight_bits)
            + simulated_error(second, first, weights, alpha, scheme, weight_bits))


def simulated_error(fit: np.ndarray, rows: np.ndarray, weights: list[np.ndarray], alpha: float | None,
                    scheme: str, weight_bits: int) -> float:
    """Sum over `weights` of ||INT8 product - float product|| / ||float product|| for `rows`, with the smoothing
    and calibrated range made from `fit`."""
    products = simulated_products(rows, (fit.min(axis=0), fit.max(axis=0)), weights, alpha, scheme, weight_bits)
    total = 0.0
    for weight, approximate in zip(weights, products):
        exact = rows @ weight
        total += float(np.linalg.norm(approximate - exact) / max(float(np.linalg.norm(exact)), 1e-12))
    return total


def simulated_products(rows: np.ndarray, bounds: Bounds, weights: list[np.ndarray], alpha: float | None,
                       scheme: str, weight_bits: int) -> list[np.ndarray]:
    """rows @ weight for each weight as the per-token INT8 graph computes it, with smoothing of strength `alpha`
    and scales made from the calibrated `bounds` of the rows' channels."""
    if alpha is None:
        scale = np.ones(rows.shape[1], np.float32)
    else:
        weight_peak = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
        scale = smoothing_scales(np.maximum(-bounds[0], bounds[1]), weight_peak, alpha)
    quantized = quantize_rows(rows, scheme, bounds, 1 / scale)
    products = []
    for weight in weights:
        codes, column_scale = quantize_weight(weight.astype(np.float32) * scale[:, None], weight_bits)
        products.append(quantized @ (codes.astype(np.float32) * column_scale))
    return products


def quantize_rows(rows: np.ndarray, scheme: str, bounds: Bounds, divided: np.ndarray) -> np.ndarray:
    """The smoothed rows (rows * divided) as the graph's prologue quantizes and the kernel dequantizes them:
    "calibrated" one scale and zero point, "gelu" per row with GELU_ZERO codes below zero, "row" symmetric per
    row."""
    smoothed = rows * divided
    if scheme == "calibrated":
        step, zero = calibrated_scale(bounds, divided)
        return (np.clip(np.round(smoothed / step) + zero, 0, 255) - zero) * step
    if scheme == "gelu":
        row_step = gelu_step(smoothed.max(axis=1, keepdims=True), gelu_floor(divided))
        return (np.clip(np.round(smoothed / row_step) + GELU_ZERO, 0, 255) - GELU_ZERO) * row_step
    levels = activation_levels(8)[0]
    step = np.maximum(np.abs(smoothed).max(axis=1, keepdims=True), 1e-12) / levels
    return np.clip(np.round(smoothed / step), -levels, levels) * step
