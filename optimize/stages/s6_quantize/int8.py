"""The INT8 recipes, searched for parity or carried from another artifact: per-token (batch-invariant), or
per-tensor dynamic, plain or with outlier channels split off."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infinity.engine.hostinfo import cpu_flags
from infinity.manifest import Activations, Manifest, Outliers, Quantization
from optimize.graph.onnxio import copy_model
from optimize.stages.s6_quantize.calibrate import Calibration, Feeder, activation_ranges, calibrate
from optimize.stages.s6_quantize.carry import OutlierLimits, kept_roles, nodes_for_roles, outlier_limits
from optimize.stages.s6_quantize.config import VNNI_WIDE_WEIGHTS, QuantizationConfig
from optimize.stages.s6_quantize.outliers import split_outliers
from optimize.stages.s6_quantize.per_tensor import quantizable_nodes, quantize
from optimize.stages.s6_quantize.per_token import PerTokenRecord, per_token_candidates, quantize_per_token
from optimize.stages.s6_quantize.rounding import CompensatedRounding
from optimize.stages.s6_quantize.search import Evaluate, accuracy_aware_quantize, keep_fewest_float
from optimize.stages.s6_quantize.smoothing import Strengths, choose_strengths
from optimize.tasks.base import OptimizerTask

Log = Callable[[str], None]


@dataclass
class Int8Result:
    record: Quantization
    kept_float: list[str]
    full_int8_model: Path | None  # every candidate quantized, when some node was kept float


@dataclass
class _Graph:
    path: Path
    float_nodes: list[str]  # outlier side paths, never quantized
    outliers: Outliers


def float_weight_params(model_path: Path, nodes: list[str]) -> int:
    """Weights the given nodes multiply by: what stays float (and is read at fp32 width) when they are kept."""
    graph = onnx.load(str(model_path), load_external_data=False).graph
    sizes = {init.name: int(np.prod(init.dims)) for init in graph.initializer}
    wanted = set(nodes)
    return sum(sizes.get(node.input[1], 0) for node in graph.node if node.name in wanted and len(node.input) > 1)


def quantize_int8(src: Path, dst: Path, config: QuantizationConfig, task: OptimizerTask, evaluate: Evaluate,
                  feeder: Feeder, work: Path, log: Log, threads: int = 0,
                  keep_float_like: Path | None = None) -> Int8Result:
    """Plain full INT8 if it passes; else the parity search on the graph with outliers split off and, unless that
    quantizes everything, on the plain graph too, keeping whichever leaves fewer weights in float."""
    if config.activations == Activations.PER_TOKEN:
        return _per_token(src, dst, config, task, evaluate, feeder, work, log, threads, keep_float_like)
    if keep_float_like is not None:
        return _carry(src, dst, config, task, feeder, work, log, threads, keep_float_like)
    if not config.split_outliers:
        return _search(_Graph(src, [], Outliers(reason="disabled in the preset")), dst, config,
                       evaluate, work / "plain", log)
    plain_int8 = work / "plain_int8.onnx"
    quantize(src, plain_int8, config)
    if evaluate(plain_int8).passed:
        return _search(_Graph(src, [], Outliers(reason="full INT8 passed without it")), dst, config,
                       evaluate, work / "plain", log, plain_int8)
    split = _split(src, work / "split.onnx", config, task, feeder, log, threads)
    with_split = _search(split, work / "split" / "final.onnx", config, evaluate, work / "split", log)
    chosen = with_split
    if with_split.kept_float:
        log("  searching again without the outlier split, to keep whichever leaves fewer weights in float")
        without = _search(_Graph(src, [], replace(split.outliers, applied=False,
                                                  reason="the search without it kept fewer weights in float")),
                          work / "plain" / "final.onnx", config, evaluate, work / "plain", log, plain_int8)
        costs = {"split": float_weight_params(split.path, [*with_split.kept_float, *split.float_nodes]),
                 "plain": float_weight_params(src, without.kept_float)}
        if costs["plain"] < costs["split"]:
            chosen = without
        chosen.record.float_weight_params = costs
        log(f"  weights kept in float: {costs['split']:,} with the split, {costs['plain']:,} without")
    copy_model(work / ("split" if chosen is with_split else "plain") / "final.onnx", dst)
    return chosen


def _split(src: Path, dst: Path, config: QuantizationConfig, task: OptimizerTask, feeder: Feeder, log: Log,
           threads: int, limits: OutlierLimits | None = None) -> _Graph:
    calibration = task.calibration()
    nodes = quantizable_nodes(src, config)
    ranges = activation_ranges(src, nodes, (feeds for _, feeds in feeder.batches(calibration)), threads)
    split = split_outliers(src, dst, ranges, None if limits is None else limits.for_nodes(nodes))
    record = replace(split.record(), calibration_inputs=len(calibration), applied=True)
    log(f"  outliers: {record.channels} input channels of {record.nodes} MatMuls kept in float, "
        f"{len(split.smoothed)} Attention inputs smoothed (calibrated on {len(calibration)} inputs apart from the "
        "probes)")
    return _Graph(dst, split.float_nodes, record)


def _search(graph: _Graph, dst: Path, config: QuantizationConfig, evaluate: Evaluate, scratch: Path,
            log: Log, full_model: Path | None = None) -> Int8Result:
    scratch.mkdir(exist_ok=True)
    result = accuracy_aware_quantize(graph.path, dst, config, evaluate, scratch, log, graph.float_nodes, full_model)
    record = replace(config.record(), candidates=result.candidates, kept_float=len(result.kept_float),
                     trials=result.trials, full_int8_metrics=result.full_int8, outliers=graph.outliers)
    return Int8Result(record, result.kept_float, result.full_int8_model if result.kept_float else None)


def _carry(src: Path, dst: Path, config: QuantizationConfig, task: OptimizerTask, feeder: Feeder, work: Path,
           log: Log, threads: int, artifact: Path) -> Int8Result:
    """Another artifact's recipe on this model: its outlier channel counts and float-kept roles, no search."""
    graph = _Graph(src, [], Outliers(reason=f"not applied in {artifact}"))
    limits = outlier_limits(artifact)
    if limits is not None:
        graph = _split(src, work / "split.onnx", config, task, feeder, log, threads, limits)
    side_paths = set(graph.float_nodes)
    candidates = [name for name in quantizable_nodes(graph.path, config) if name not in side_paths]
    kept_float = nodes_for_roles(candidates, kept_roles(artifact))
    quantize(graph.path, dst, config, exclude=[*graph.float_nodes, *kept_float])
    full_int8 = None
    if kept_float:
        full_int8 = work / "full_int8.onnx"
        quantize(graph.path, full_int8, config, exclude=graph.float_nodes)
    log(f"  recipe from {artifact}: {len(kept_float)} of {len(candidates)} nodes kept in float")
    record = replace(config.record(), candidates=len(candidates), kept_float=len(kept_float),
                     recipe_from=str(artifact), outliers=graph.outliers)
    return Int8Result(record, kept_float, full_int8)


class _PerTokenWriter:
    """Per-token graphs of `src` from one calibration, written on demand (the search writes many); `last` is the
    record of the one written last."""

    def __init__(self, src: Path, config: QuantizationConfig, calibrated: Calibration,
                 rounding: CompensatedRounding | None) -> None:
        self.src, self.config, self.calibrated, self.rounding = src, config, calibrated, rounding
        self.strengths: dict[tuple[int, tuple[str, ...]], Strengths] = {}
        self._last: PerTokenRecord | None = None

    @property
    def last(self) -> PerTokenRecord:
        assert self._last is not None, "no graph written yet"
        return self._last

    def __call__(self, path: Path, keep: list[str], bits: int | None = None, roles: tuple[str, ...] = ()) -> None:
        config = self.config
        bits = config.weight_bits if bits is None else bits
        # Strengths chosen per input for graphs with every node INT8. With nodes kept float, every input is smoothed
        # at smoothing_alpha: with chosen strengths, the search kept 7 of the tiny DistilBERT classifier's 10 nodes
        # float, passed its tuning texts and failed the held-out ones (top-1 0.9864; alpha 0.5: 9 kept, 0.9909).
        if config.smoothing_alphas and not keep and (bits, roles) not in self.strengths:
            self.strengths[bits, roles] = choose_strengths(self.src, self.calibrated, config.smoothing_alphas, bits,
                                                           frozenset(roles))
        self._last = quantize_per_token(self.src, path, self.calibrated.bounds, weight_bits=bits,
                                        alpha=config.smoothing_alpha, exclude=keep, calibrated_roles=frozenset(roles),
                                        alphas=None if keep else self.strengths.get((bits, roles)),
                                        rounding=self.rounding)


def _per_token(src: Path, dst: Path, config: QuantizationConfig, task: OptimizerTask, evaluate: Evaluate,
               feeder: Feeder, work: Path, log: Log, threads: int, keep_float_like: Path | None) -> Int8Result:
    """Per-token INT8 with smoothing calibrated apart from the probes. With 8-bit weights (on a VNNI build host, or
    a target that asks for 8), the fastest whole graph that passes parity is kept: calibrated scales for the roles
    the target names, then a scale per row for every input; else the parity search keeps nodes float (or as the
    carried artifact kept them)."""
    calibration = task.calibration()
    nodes = per_token_candidates(src)
    calibrated = calibrate(src, nodes, (feeds for _, feeds in feeder.batches(calibration)), threads,
                           samples=bool(config.smoothing_alphas) or config.compensated)
    rounding = (CompensatedRounding(calibrated.samples, config.rounding_damping)
                if config.compensated else None)
    write = _PerTokenWriter(src, config, calibrated, rounding)

    scratch = work / "per_token"
    scratch.mkdir(exist_ok=True)
    # 8-bit weights only where the build host's kernels sum u8 x s8 in 32 bits, as the target's do
    wide = config.weight_bits < 8 and bool(set(config.wide_weights_flags) & cpu_flags())
    record = replace(config.record(), calibration_inputs=len(calibration),
                     outliers=Outliers(reason="per-token recipe: outlier channels are smoothed into the weights"))

    def chosen(bits: int, roles: tuple[str, ...], **counts: Any) -> Quantization:
        smoothing = write.last
        return replace(record, weight_bits=bits, reduce_range=bits == 7, calibrated_roles=list(roles),
                       weight_bits_why=VNNI_WIDE_WEIGHTS if bits > config.weight_bits else config.weight_bits_why,
                       smoothing=smoothing.to_dict(), smoothing_strengths=smoothing.strengths, **counts)

    if keep_float_like is not None:
        kept = nodes_for_roles(nodes, kept_roles(keep_float_like))
        carried = Manifest.load(keep_float_like).optimization.quantization
        bits = 8 if wide and carried is not None and carried.weight_bits == 8 else config.weight_bits
        roles = tuple(carried.calibrated_roles) if carried is not None and bits == 8 else ()
        full_int8 = None
        if kept:
            full_int8 = scratch / "full_int8.onnx"
            write(full_int8, [], bits, roles)
        write(dst, kept, bits, roles)
        log(f"  per-token recipe from {keep_float_like}: {len(kept)} of {len(nodes)} nodes kept in float")
        return Int8Result(chosen(bits, roles, candidates=len(nodes), kept_float=len(kept),
                                 recipe_from=str(keep_float_like)), kept, full_int8)
    # Whole graphs with 8-bit weights, fastest first. Calibrated scales only with 8 bits: with 7 they cost more
    # fidelity than their speed is worth (MiniLM held-out cosine_min 0.9916 against 0.9936 with a scale per row).
    whole_graphs: list[tuple[str, ...]] = []
    if wide or config.weight_bits == 8:
        whole_graphs = [roles for roles in dict.fromkeys([config.calibrated_roles, ()]) if roles or wide]
    trials = 0
    for roles in whole_graphs:
        candidate = scratch / f"full_int8_w8{'_calibrated' if roles else ''}.onnx"
        write(candidate, [], 8, roles)
        checked = evaluate(candidate)
        trials += 1
        what = "8-bit weights, " + (f"calibrated scales for {'/'.join(roles)} inputs" if roles
                                    else "a scale per row for every input")
        if checked.passed:
            copy_model(candidate, dst)
            log(f"  per-token INT8 ({what}): {len(nodes)} of {len(nodes)} nodes, "
                f"{write.last.smoothed_inputs} inputs smoothed")
            return Int8Result(chosen(8, roles, candidates=len(nodes), trials=trials,
                                     full_int8_metrics=checked.metrics), [], None)
        log(f"  {what}: misses parity with every node INT8 ({'; '.join(checked.failures)})")
    result = keep_fewest_float(nodes, write, dst, evaluate, scratch, log)
    log(f"  per-token INT8: {result.candidates - len(result.kept_float)} of {result.candidates} nodes, "
        f"{write.last.smoothed_inputs} inputs smoothed")
    return Int8Result(chosen(config.weight_bits, (), candidates=result.candidates, kept_float=len(result.kept_float),
                             trials=trials + result.trials, full_int8_metrics=result.full_int8),
                      result.kept_float, result.full_int8_model if result.kept_float else None)
