"""The parity search: every candidate INT8 if that passes, else the fewest most harmful nodes kept in float."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from optimize.graph.onnxio import copy_model
from optimize.measure.agreement import ParityResult
from optimize.stages.s6_quantize.config import QuantizationConfig
from optimize.stages.s6_quantize.per_tensor import quantizable_nodes, quantize

# Nodes are ranked by their harm on this many of the search texts: those full INT8 answers worst.
RANKING_INPUTS = 8


class Evaluate(Protocol):
    """Parity of a graph on the search texts; `only`: on these of them (for ranking)."""

    def __call__(self, path: Path, only: list[int] | None = None) -> ParityResult: ...


@dataclass
class QuantizationResult:
    candidates: int
    kept_float: list[str] = field(default_factory=list)
    sensitivity: dict[str, float] = field(default_factory=dict)
    trials: int = 0
    full_int8: dict[str, float] = field(default_factory=dict)
    full_int8_model: Path | None = None  # every candidate quantized, kept to weigh what the fallback costs


def accuracy_aware_quantize(src: Path, dst: Path, config: QuantizationConfig, evaluate: Evaluate,
                            scratch: Path, log: Callable[[str], None] = print,
                            float_nodes: list[str] | None = None, full_model: Path | None = None) -> QuantizationResult:
    """Per-tensor dynamic INT8 searched for parity. `float_nodes` are never quantized nor counted as candidates
    (the outlier side paths); `full_model` is the all-INT8 graph when the caller has already made it."""
    always_float = list(float_nodes or [])
    skipped = set(always_float)
    nodes = [name for name in quantizable_nodes(src, config) if name not in skipped]

    def write(path: Path, keep: list[str]) -> None:
        quantize(src, path, config, exclude=[*always_float, *keep])

    return keep_fewest_float(nodes, write, dst, evaluate, scratch, log, full_model)


Write = Callable[[Path, list[str]], None]  # (output path, nodes to keep in float)


def keep_fewest_float(nodes: list[str], write: Write, dst: Path, evaluate: Evaluate, scratch: Path,
                      log: Callable[[str], None] = print, full_model: Path | None = None) -> QuantizationResult:
    """All of `nodes` INT8 if that passes; else the fewest most harmful kept in float until parity passes. A
    node's harm is measured with it alone quantized, on the texts full INT8 answers worst where its evaluation names
    them (else on all); the bisection over how many to keep checks every search text."""
    if not nodes:
        raise ValueError("no quantizable MatMul/Attention nodes with constant weights: the graph cannot be INT8")
    result = QuantizationResult(candidates=len(nodes))
    if full_model is None:
        full_model = scratch / "full_int8.onnx"
        write(full_model, [])
    full = evaluate(full_model)
    result.trials += 1
    result.full_int8, result.full_int8_model = full.metrics, full_model
    if full.passed:
        copy_model(full_model, dst)  # with its weights file, if it has one
        return result
    ranking = full.hardest[:RANKING_INPUTS] or None
    on = f" on the {len(ranking)} texts it answers worst" if ranking else ""
    log(f"  full INT8 misses parity ({'; '.join(full.failures)}); measuring {len(nodes)} nodes{on}")
    trial = scratch / "trial.onnx"
    for node in nodes:
        write(trial, [n for n in nodes if n != node])
        result.sensitivity[node] = evaluate(trial, ranking).score
        result.trials += 1
    order = sorted(nodes, key=lambda n: result.sensitivity[n])

    def passes(k: int) -> bool:
        write(trial, order[:k])
        result.trials += 1
        return evaluate(trial).passed

    # Smallest k (most harmful first) that passes: doubling, then bisection between the last two probes.
    low, high = 0, 1
    while high < len(nodes) and not passes(high):
        low, high = high, min(2 * high, len(nodes))
    while high - low > 1:
        mid = (low + high) // 2
        if passes(mid):
            high = mid
        else:
            low = mid
    result.kept_float = order[:high]
    write(dst, result.kept_float)
    log(f"  kept {high} of {len(nodes)} nodes in float after {result.trials} trials")
    return result
