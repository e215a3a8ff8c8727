"""The optimizer's stages in order (stages/s1..s7): load, export, fuse, reference, quantize, validate, package."""
from __future__ import annotations

import dataclasses
import gc
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from infinity.artifact import sha256_file, staging_beside, write_atomically
from infinity.engine import openvino
from infinity.engine.hostinfo import cpu_flags, cpu_name
from infinity.engine.model import artifact_tokenizer
from infinity.engine.tokenization import TextInput, TextTokenizer
from infinity.manifest import (
    Activations,
    Manifest,
    Optimization,
    Parity,
    Precision,
    Quantization,
    Source,
    Target,
    TaskFacts,
    TokenizerFile,
)
from optimize.graph.onnxio import copy_model, model_bytes, save_model, weights_beside
from optimize.measure.agreement import Outputs, ParityResult
from optimize.measure.texts import HELDOUT_DESCRIPTION
from optimize.presets import TargetPreset, resolve_target, tensorrt_profiles
from optimize.stages.s1_load import load_source
from optimize.stages.s2_export import export_onnx
from optimize.stages.s3_fuse import FusionResult, fuse
from optimize.stages.s4_reference import torch_reference
from optimize.stages.s5_quantize.calibrate import Feeder
from optimize.stages.s5_quantize.embeddings import quantize_embedding_tables
from optimize.stages.s5_quantize.int8 import quantize_int8
from optimize.stages.s6_validate.latency import latency_table, median_latency_ms
from optimize.stages.s6_validate.served import (
    CPU,
    ServedParity,
    embedding_ranges,
    load_as_served,
    load_candidate,
    served_parity,
)
from optimize.stages.s7_package import describe_model, library_versions, now
from optimize.tasks import task_for
from optimize.tasks.base import OptimizerTask, SourceModel

Log = Callable[[str], None]


class ParityFailed(RuntimeError):
    def __init__(self, result: ParityResult, report: str) -> None:
        super().__init__(report)
        self.result = result


@dataclass
class OptimizeOptions:
    model: str
    task: str
    out: Path
    target: str = "auto"
    precision: str | None = None
    allow_failed_parity: bool = False
    threads: int = 0
    thresholds: dict[str, float] | None = None
    keep_float_like: Path | None = None  # reuse another artifact's float-kept layer roles instead of searching
    activations: str | None = None  # INT8: "per_token" or "per_tensor" instead of the target's own
    calibrated_scales: bool = True  # per-token INT8: False gives every input a scale per row, whatever the target
    pooling: str | None = None  # feature-extraction without a sentence-transformers Pooling config
    model_id: str | None = None  # the hub id clients see (default: found from the model's cache path or card)
    # Weights past this many bytes go to model.onnx.data beside the graph (None: 1 GiB, under protobuf's 2 GiB).
    external_data_bytes: int | None = None
    trust_remote_code: bool = False
    reranker_template: str | None = None  # ranking with a causal LM: its prompt, by name or JSON file


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
        # (the options but target and out, precision, GPU or not) -> what prepare made for them
        self.prepared: list[tuple[tuple[OptimizeOptions, Precision, bool], Prepared]] = []

    def __enter__(self) -> Builds:
        return self

    def __exit__(self, *_: object) -> None:
        self.prepared.clear()
        shutil.rmtree(self.work, ignore_errors=True)

    def optimize(self, options: OptimizeOptions) -> Manifest:
        """One artifact, written to `options.out` whole or not at all."""
        preset = resolve_target(options.target)
        precision = Precision(options.precision or preset.default_precision)
        if precision not in preset.precisions:
            raise ValueError(f"target {preset.name} offers precisions {', '.join(preset.precisions)}, not {precision}")
        if preset.providers_for(precision)[0] == openvino.PROVIDER and not openvino.installed():
            raise ValueError(f"{preset.name}'s {precision} runs on OpenVINO, and its parity is checked there: "
                             f"{openvino.EXTRA}")
        task = task_for(options.task)
        task.check_thresholds(options.thresholds or {})
        out = Path(options.out).resolve()
        staging = staging_beside(out)
        scratch = Path(tempfile.mkdtemp(dir=self.work))  # the target's own: gone once it is written
        try:
            self.log(f"multiverse: {options.model} -> {task.name} for {preset.name} ({precision})")
            build = Build(options, preset, precision, task, Stages(self.log), staging, scratch, self.log)
            key = (dataclasses.replace(options, target="", out=Path()), precision, preset.is_gpu)
            prepared = next((made for made_for, made in self.prepared if made_for == key), None)
            if prepared is None:
                prepared = build.prepare(Path(tempfile.mkdtemp(dir=self.work)))
                self.prepared.append((key, prepared))
            else:
                self.log(f"  {', '.join(prepared.seconds)}: shared with {prepared.target}'s build")
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
    fused: Path
    fusion: FusionResult
    search_inputs: list[TextInput]
    reference: Outputs
    heldout: list[TextInput]
    heldout_reference: Outputs
    seconds: dict[str, float]
    target: str  # the build that made it


@dataclass
class Quantized:
    """What the quantize stage did: the INT8 record (None for a float graph), the nodes kept float, the notes."""
    record: Quantization | None = None
    kept_float: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Build:
    """One run of the stages, in order; each step reads what the ones before it left here."""
    options: OptimizeOptions
    preset: TargetPreset
    precision: Precision
    task: OptimizerTask
    stages: Stages
    staging: Path  # the artifact directory being written
    work: Path     # scratch graphs of the target's own stages
    log: Log

    def prepare(self, into: Path) -> Prepared:
        """The stages before quantize: load, export, fuse, reference; their files in `into`."""
        source, extra = self.load(into / "tokenizer")
        exported, fused = into / "exported.onnx", into / "fused.onnx"
        with self.stages.stage("export"):
            input_names, _ = export_onnx(source, exported, self.options.external_data_bytes)
        if self.precision == Precision.BF16:
            # OpenVINO fuses the plain export itself; onnxruntime's fused graph would keep contrib ops it does not
            # take (mpnet's attention), which then run apart in fp32 (infinity/engine/openvino.py)
            fused, fusion = exported, FusionResult({}, [])
        else:
            with self.stages.stage("fuse"):
                fusion = fuse(exported, fused, source.config, for_gpu=self.preset.is_gpu,
                              external_data_bytes=self.options.external_data_bytes)
                self.log(f"  fused ({fusion.model_type or 'no recipe'}): {fusion.stats or 'nothing'}"
                         + (f"; gaps: {fusion.gaps}" if fusion.gaps else ""))
        # what the INT8 recipe and its fallback search tune on; a float graph tunes nothing
        search_inputs = [*self.task.probes(), *self.task.tuning()] if self.precision == Precision.INT8 else []
        heldout = self.task.heldout()  # what the manifest's parity is measured on, and nothing else
        with self.stages.stage("reference"):
            reference = torch_reference(source, search_inputs) if search_inputs else []
            heldout_reference = torch_reference(source, heldout)
        return Prepared(source, into / "tokenizer", extra, input_names, exported, fused, fusion, search_inputs,
                        reference, heldout, heldout_reference, dict(self.stages.seconds), self.preset.name)

    def run(self, prepared: Prepared) -> Manifest:
        """The target's own stages on what `prepare` made: quantize, validate, package."""
        self.stages.seconds = {**prepared.seconds, **self.stages.seconds}
        source, fusion, fused, final = prepared.source, prepared.fusion, prepared.fused, self.staging / "model.onnx"
        for name in ("tokenizer.json", *prepared.extra):
            shutil.copy(prepared.tokenizer / name, self.staging / name)
        draft = self.draft(source, prepared.input_names, prepared.extra, fused)
        tokenizer = artifact_tokenizer(self.staging, draft)  # as served: calibration and every graph tried
        with self.stages.stage("quantize"):
            quantized = self.quantize(draft, tokenizer, fused, final, prepared.search_inputs, prepared.reference)
            weights_beside(final)
        notes = [*fusion.gaps, *self.task.notes(source), *fusion.notes, *quantized.notes]
        with self.stages.stage("validate"):
            checked, facts = self.validate(draft, tokenizer, final, prepared.heldout, prepared.heldout_reference,
                                           notes)
        if not checked.result.passed:
            report = "parity failed:\n" + "\n".join(f"  - {f}" for f in checked.result.failures)
            if not self.options.allow_failed_parity:
                raise ParityFailed(checked.result, report)
            self.log(report + "\n  (kept because --allow-failed-parity was given; the manifest records passed=false)")
        with self.stages.stage("package"):
            manifest = dataclasses.replace(
                draft, model=describe_model(final, self.precision), task=facts,
                optimization=Optimization(fusion=fusion.stats, fusion_gaps=fusion.gaps, quantization=quantized.record,
                                          kept_float=quantized.kept_float, stage_seconds=self.stages.seconds,
                                          notes=notes, exported_bytes=model_bytes(prepared.exported),
                                          fusion_model_type=fusion.model_type),
                parity=self.parity(draft.parity, checked), created_at=now())
            manifest.save(self.staging)
        return manifest

    def load(self, tokenizer: Path) -> tuple[SourceModel, list[str]]:
        """The source model, and its tokenizer written for the artifact into `tokenizer`, with the extra files it
        names."""
        options = self.options
        with self.stages.stage("load"):
            source = load_source(options.model, self.task.name, options.pooling, options.model_id,
                                 options.trust_remote_code, options.reranker_template)
            if source.facts.reranker is not None and self.precision == Precision.INT8:
                raise ValueError("INT8 is not built for causal rerankers yet: pass --precision fp32")
            source.tokenizer.save_pretrained(str(tokenizer))
            # the fast tokenizer's own file, as the server loads it (save_pretrained's may differ)
            source.tokenizer.backend_tokenizer.save(str(tokenizer / "tokenizer.json"))
            extra = [name for name in ("tokenizer_config.json", "special_tokens_map.json")
                     if (tokenizer / name).is_file()]
        return source, extra

    def draft(self, source: SourceModel, input_names: list[str], extra: list[str], fused: Path) -> Manifest:
        """The manifest before parity: what every candidate graph is loaded with, as the server loads it."""
        options, preset = self.options, self.preset
        provider_options = preset.options_for(self.precision)
        if "TensorrtExecutionProvider" in provider_options:
            provider_options["TensorrtExecutionProvider"].update(tensorrt_profiles(input_names, source.max_length))
        thresholds = {**self.task.thresholds, **(options.thresholds or {})}
        return Manifest(
            source=Source(model=str(options.model), task=self.task.name, revision=_revision(source.path),
                          model_type=source.model_type, library_versions=library_versions(),
                          model_id=source.model_id, trust_remote_code=source.trust_remote_code),
            target=Target(name=preset.name, providers=list(preset.providers_for(self.precision)),
                          # Only INT8 and BF16 depend on the instruction set; an fp32 or fp16 graph runs on any CPU.
                          required_cpu_flags=list(preset.required_cpu_flags)
                          if self.precision in (Precision.INT8, Precision.BF16) else [],
                          provider_options=provider_options),
            model=describe_model(fused, self.precision),
            tokenizer=TokenizerFile(file="tokenizer.json", sha256=sha256_file(self.staging / "tokenizer.json"),
                                    max_length=source.max_length, pad_id=source.tokenizer.pad_token_id or 0,
                                    extra_files=extra),
            task=source.facts, optimization=Optimization(),
            parity=Parity(reference=self.task.reference_name(source), probe_size=len(self.task.heldout()),
                          metrics={}, thresholds=thresholds, passed=False))

    def quantize(self, draft: Manifest, tokenizer: TextTokenizer, fused: Path, final: Path,
                 search_inputs: list[TextInput], reference: Outputs) -> Quantized:
        if self.precision == Precision.INT8:
            return self.int8(draft, tokenizer, fused, final, search_inputs, reference)
        if self.precision == Precision.FP16:
            _to_fp16(fused, final)
        else:
            copy_model(fused, final, self.options.external_data_bytes)
            self.log("  float model: no quantization")
        return Quantized()

    def int8(self, draft: Manifest, tokenizer: TextTokenizer, fused: Path, final: Path,
             search_inputs: list[TextInput], reference: Outputs) -> Quantized:
        """The target's INT8 recipe, judged on the search texts as served; what it costs and gains in speed."""
        options, preset = self.options, self.preset
        assert preset.quantization is not None
        config = preset.quantization
        thresholds = draft.parity.thresholds
        # a per-token graph answers alike alone and batched (validate checks it): its trials run batched only
        activations = Activations(options.activations or config.activations)
        invariant = config.batch_invariant and activations == Activations.PER_TOKEN

        def evaluate(path: Path, only: list[int] | None = None) -> ParityResult:
            inputs, expected = search_inputs, reference
            if only is not None:
                inputs, expected = [search_inputs[i] for i in only], [reference[i] for i in only]
            model = load_candidate(self.staging, draft, path, options.threads, tokenizer)
            return served_parity(self.task, model, inputs, expected, thresholds, alone=not invariant).result

        if options.activations:
            config = dataclasses.replace(config, activations=activations)
        if not options.calibrated_scales:
            config = dataclasses.replace(config, calibrated_roles=())
        int8 = quantize_int8(fused, final, config, self.task, evaluate, Feeder(tokenizer), self.work, self.log,
                             options.threads, options.keep_float_like)
        quantization, kept_float, full_int8 = int8.record, int8.kept_float, int8.full_int8_model
        notes = []
        if kept_float and full_int8 is not None:
            notes.append(f"{len(kept_float)} of {quantization.candidates} quantizable nodes kept in float for parity")
            # What parity costs in speed: one sequence of 128 tokens, fp32 vs full INT8 vs what was kept.
            sequence = min(128, draft.tokenizer.max_length)
            quantization.latency_ms_seq128 = {
                "fp32": median_latency_ms(fused, sequence, options.threads),
                "full_int8": median_latency_ms(full_int8, sequence, options.threads),
                "final": median_latency_ms(final, sequence, options.threads)}
            self.log(f"  latency at seq 128 (ms): {quantization.latency_ms_seq128}")
        # What the recipe costs and gains in speed on this host, beside its parity in the manifest.
        quantization.why = preset.why
        quantization.latency_ms = latency_table({"fp32": fused, "final": final}, options.threads,
                                                max_length=draft.tokenizer.max_length)
        quantization.latency_host = cpu_name()
        tables = quantize_embedding_tables(final, final)
        if tables:
            quantization.embedding_tables_int8 = tables
            notes.append(f"word embeddings stored as INT8 rows with a scale per row: {', '.join(tables)}")
        if len(kept_float) == quantization.candidates:
            notes.append("no node could be quantized within the parity thresholds: this INT8 artifact runs in float")
            self.log("  WARNING: every quantized node broke parity; the artifact is effectively float")
        return Quantized(quantization, kept_float, notes)

    def validate(self, draft: Manifest, tokenizer: TextTokenizer, final: Path, heldout: list[TextInput],
                 reference: Outputs, notes: list[str]) -> tuple[ServedParity, TaskFacts]:
        """Held-out parity as served, on the provider that serves the target where this host has it; and the
        answers' ranges for int8 and uint8 embeddings."""
        model = load_as_served(self.staging, draft, final, self.options.threads, tokenizer)
        checked = served_parity(self.task, model, heldout, reference, draft.parity.thresholds)
        self.log(f"  validated on {checked.provider}")
        self.log("  held-out, worst of alone and batched: "
                 + ", ".join(f"{k}={v:.4f}" for k, v in checked.result.metrics.items()))
        self.log("  batch invariance: " + ", ".join(f"{k}={v:.4g}" for k, v in checked.batch_invariance.items()))
        if self.precision == Precision.BF16:
            notes.append(f"BF16: the export as it is, which OpenVINO fuses itself, validated on {checked.provider} "
                         "(its bfloat16 arithmetic where the CPU has it, as served); answers alone and batched differ "
                         f"by up to {checked.batch_invariance['max_abs_diff']:.2g}")
        if self.precision == Precision.FP16:
            notes.append(f"FP16 validated on {checked.provider} (the GPU's fp16 arithmetic, as served)"
                         if checked.provider != CPU
                         else "FP16 validated on this host's CPU provider (fp16 weights, fp32 arithmetic); fp16 "
                              "arithmetic itself runs only on the GPU")
        facts = draft.task
        if self.task.ranges:
            # int8/uint8 answers: ranges from the texts the recipe saw, never the held-out ones
            seen = [*self.task.calibration(), *self.task.tuning(), *self.task.probes()]
            facts = dataclasses.replace(facts, embedding_ranges=embedding_ranges(self.task, model, seen))
        del model  # its session holds the whole graph: not kept through packaging
        return checked, facts

    def parity(self, draft: Parity, checked: ServedParity) -> Parity:
        result = checked.result
        return dataclasses.replace(
            draft, metrics=result.metrics, passed=result.passed, failures=result.failures,
            host_cpu_flags=sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma"))),
            overridden=not result.passed, probe_set=HELDOUT_DESCRIPTION, modes=checked.modes,
            batch_invariance=checked.batch_invariance, provider=checked.provider)


def _to_fp16(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    model.convert_float_to_float16(keep_io_types=True)
    save_model(model.model, dst)


def _revision(path: Path) -> str | None:
    # A hub snapshot directory is named after its commit.
    return path.name if path.parent.name == "snapshots" else None

