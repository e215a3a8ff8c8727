"""The optimizer's stages in run order (stages/s1..s8): load, export, fuse, reference, draft, quantize, validate,
package; each stage's body is its module's, and this only runs them in turn and passes their outputs on."""
from __future__ import annotations

import dataclasses
import gc
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from infinity.artifact import staging_beside, write_atomically
from infinity.engine import openvino
from infinity.manifest import Manifest, Precision
from optimize.options import Log, OptimizeOptions, Plan
from optimize.presets import resolve_target
from optimize.stages.s1_load import load
from optimize.stages.s2_export import export_onnx
from optimize.stages.s3_fuse import FusionResult, fuse_for
from optimize.stages.s4_reference import References, references
from optimize.stages.s5_draft.draft import draft
from optimize.stages.s6_quantize.quantize import quantize
from optimize.stages.s7_validate.validate import validate
from optimize.stages.s8_package import package
from optimize.tasks import task_for
from optimize.tasks.base import SourceModel

# The stages that leave their models in reference cycles, collected before the next stage starts (a collection
# costs 0.15-0.35 s after PyTorch is imported): for XLM-R large, the exported PyTorch model held 2.1 GB until a
# collection came by itself, onnxruntime's fusion objects 1.6 GB, the reference's model 2.4 GB.
CYCLIC = ("export", "fuse", "reference")


class Stages:
    def __init__(self, log: Log) -> None:
        self.log = log
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.log(f"[{name}] ...")
        start = time.perf_counter()
        yield
        if name in CYCLIC:
            gc.collect()
        self.seconds[name] = round(time.perf_counter() - start, 2)
        self.log(f"[{name}] done in {self.seconds[name]:.1f}s")


def optimize(options: OptimizeOptions, log: Log = print) -> Manifest:
    with Builds(log) as builds:
        return builds.optimize(options)


class Builds:
    """Artifacts of one model built in turn (a bundle's targets): builds whose options differ only in their CPU
    target and `out` share one run of the stages before quantize (load, export, fuse, reference), since neither
    the graphs nor PyTorch's answers depend on the instruction set."""

    def __init__(self, log: Log = print) -> None:
        self.log = log
        self.work = Path(tempfile.mkdtemp(prefix="multiverse-"))
        # what prepare made last, for (the options but target and out, precision, GPU or not): a bundle's targets
        # come in turn, and one slot bounds what a long-lived Builds holds
        self.prepared: tuple[tuple[OptimizeOptions, Precision, bool], Path, Prepared] | None = None

    def __enter__(self) -> Builds:
        return self

    def __exit__(self, *_: object) -> None:
        self.prepared = None
        shutil.rmtree(self.work, ignore_errors=True)

    def optimize(self, options: OptimizeOptions) -> Manifest:
        """One artifact, written to `options.out` whole or not at all."""
        preset = resolve_target(options.target)
        precision = Precision(options.precision or preset.default_precision)
        if precision not in preset.precisions:
            raise ValueError(f"target {preset.name} offers precisions {', '.join(preset.precisions)}, not {precision}")
        if preset.providers_for(precision)[0] == openvino.PROVIDER and (reason := openvino.unavailable()):
            raise ValueError(f"{preset.name}'s {precision} runs (and its parity is checked) on OpenVINO, {reason}")
        task = task_for(options.task)
        task.check_thresholds(options.thresholds or {})
        out = Path(options.out).resolve()
        staging = staging_beside(out)
        scratch = Path(tempfile.mkdtemp(dir=self.work))  # the target's own: gone once it is written
        try:
            self.log(f"multiverse: {options.model} -> {task.name} for {preset.name} ({precision})")
            build = Build(Plan(options, preset, precision, task, self.log), Stages(self.log), staging, scratch)
            key = (dataclasses.replace(options, target="", out=Path()), precision, preset.is_gpu)
            if self.prepared is not None and self.prepared[0] == key:
                prepared = self.prepared[2]
                self.log(f"  {', '.join(prepared.seconds)}: shared with {prepared.target}'s build")
            else:
                if self.prepared is not None:
                    shutil.rmtree(self.prepared[1], ignore_errors=True)
                    self.prepared = None
                into = Path(tempfile.mkdtemp(dir=self.work))
                prepared = build.prepare(into)
                self.prepared = (key, into, prepared)
            manifest = build.run(prepared)
            write_atomically(staging, out)
            return manifest
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)


@dataclass
class Prepared:
    """What every CPU target of one model and precision builds from, made once: the source, its tokenizer files,
    the exported and fused graphs, PyTorch's answers on the search and held-out texts, and what those stages took."""
    source: SourceModel
    tokenizer: Path  # tokenizer.json and the `extra` files the artifact carries beside it
    extra: list[str]
    input_names: list[str]
    exported: Path
    graph: Path  # what quantize starts from: the fused graph, or the export where the target fuses it itself
    fusion: FusionResult
    references: References
    seconds: dict[str, float]
    target: str  # the build that made it


@dataclass
class Build:
    """One run of the stages, in order, each given what the ones before it made."""
    plan: Plan
    stages: Stages
    staging: Path  # the artifact directory being written
    work: Path     # scratch graphs of the target's own stages

    def prepare(self, into: Path) -> Prepared:
        """The stages before the target's own: load, export, fuse, reference; their files in `into`."""
        plan, stage, tokenizer, exported = self.plan, self.stages.stage, into / "tokenizer", into / "exported.onnx"
        with stage("load"):
            source, extra = load(plan, tokenizer)
        with stage("export"):
            input_names, _ = export_onnx(source, exported, plan.options.external_data_bytes)
        with stage("fuse"):
            graph, fusion = fuse_for(plan, exported, into / "fused.onnx", source)
        with stage("reference"):
            made = references(plan, source)
        return Prepared(source, tokenizer, extra, input_names, exported, graph, fusion, made,
                        dict(self.stages.seconds), plan.preset.name)

    def run(self, prepared: Prepared) -> Manifest:
        """The target's own stages on what `prepare` made: draft, quantize, validate, package."""
        plan, stage, final = self.plan, self.stages.stage, self.staging / "model.onnx"
        self.stages.seconds = {**prepared.seconds, **self.stages.seconds}
        with stage("draft"):
            drafted, tokenizer = draft(plan, prepared.source, prepared.tokenizer, prepared.extra,
                                       prepared.input_names, prepared.graph, self.staging)
        with stage("quantize"):
            quantized = quantize(plan, drafted, tokenizer, prepared.graph, final, prepared.references, self.work)
        with stage("validate"):
            validated = validate(plan, drafted, tokenizer, final, prepared.references)
        with stage("package"):
            return package(plan, drafted, prepared.source, prepared.exported, prepared.fusion, quantized, final,
                           validated, self.stages.seconds)
