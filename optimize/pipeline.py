"""The optimizer's stages: export -> fuse -> quantize -> validate -> package."""
from __future__ import annotations

import dataclasses
import gc
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from infinity.engine.hostinfo import cpu_flags, cpu_name
from infinity.engine.model import artifact_tokenizer
from infinity.engine.tokenization import TextInput
from infinity.manifest import (
    Manifest,
    Optimization,
    Parity,
    Quantization,
    Source,
    Target,
    TokenizerFile,
    sha256_file,
    write_atomically,
)
from optimize import package
from optimize.calibrate import Feeder, calibration_inputs
from optimize.export import export_onnx
from optimize.fuse import fuse
from optimize.onnxio import copy_model, model_bytes, save_model
from optimize.presets import TargetPreset, resolve_target, tensorrt_profiles
from optimize.quantize.embeddings import quantize_embedding_tables
from optimize.quantize.int8 import quantize_int8
from optimize.source import M3_HEADS, SourceModel, load_source
from optimize.validate.heldout import HELDOUT_DESCRIPTION, heldout_inputs, tuning_inputs
from optimize.validate.latency import latency_table, median_latency_ms
from optimize.validate.parity import THRESHOLDS, ParityResult, check_thresholds
from optimize.validate.probes import probe_inputs
from optimize.validate.reference import Outputs, torch_reference
from optimize.validate.served import (
    CPU,
    ServedParity,
    embedding_ranges,
    load_as_served,
    load_candidate,
    served_parity,
)

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
    preset = resolve_target(options.target)
    precision = options.precision or preset.default_precision
    if precision not in preset.precisions:
        raise ValueError(f"target {preset.name} offers precisions {', '.join(preset.precisions)}, not {precision}")
    check_thresholds(options.task, options.thresholds or {})
    stages = Stages(log)
    out = Path(options.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    staging.chmod(0o755)  # readable by the unprivileged user the server runs as
    work = Path(tempfile.mkdtemp(prefix="multiverse-"))
    try:
        manifest = _run(options, preset, precision, stages, staging, work, log)
        write_atomically(staging, out)
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)


def _run(options: OptimizeOptions, preset: TargetPreset, precision: str, stages: Stages, staging: Path,
         work: Path, log: Log) -> Manifest:
    log(f"multiverse: {options.model} -> {options.task} for {preset.name} ({precision})")
    with stages.stage("load"):
        source = load_source(options.model, options.task, options.pooling, options.model_id,
                             options.trust_remote_code, options.reranker_template)
        if source.facts.reranker is not None and precision == "int8":
            raise ValueError("INT8 is not built for causal rerankers yet: pass --precision fp32")
        source.tokenizer.backend_tokenizer.save(str(staging / "tokenizer.json"))
        source.tokenizer.save_pretrained(str(work / "tokenizer"))
        extra = [name for name in ("tokenizer_config.json", "special_tokens_map.json")
                 if (work / "tokenizer" / name).is_file()]
        for name in extra:
            shutil.copy(work / "tokenizer" / name, staging / name)
    exported, fused, final = work / "exported.onnx", work / "fused.onnx", staging / "model.onnx"
    with stages.stage("export"):
        input_names, _ = export_onnx(source, exported, options.external_data_bytes)
    with stages.stage("fuse"):
        fusion = fuse(exported, fused, source.config, for_gpu=preset.is_gpu,
                      external_data_bytes=options.external_data_bytes)
        log(f"  fused ({fusion.model_type or 'no recipe'}): {fusion.stats or 'nothing'}"
            + (f"; gaps: {fusion.gaps}" if fusion.gaps else ""))

    # what the INT8 recipe and its fallback search tune on; a float graph tunes nothing
    search_inputs = [*probe_inputs(options.task), *tuning_inputs(options.task)] if precision == "int8" else []
    heldout = heldout_inputs(options.task)       # what the manifest's parity is measured on, and nothing else
    thresholds = {**THRESHOLDS[options.task], **(options.thresholds or {})}
    with stages.stage("reference"):
        reference = torch_reference(source, search_inputs) if search_inputs else []
        heldout_reference = torch_reference(source, heldout)
    provider_options = {name: dict(opts) for name, opts in preset.provider_options.items()}
    if "TensorrtExecutionProvider" in provider_options:
        provider_options["TensorrtExecutionProvider"].update(tensorrt_profiles(input_names, source.max_length))
    draft = Manifest(
        source=Source(model=str(options.model), task=options.task, revision=_revision(source.path),
                      model_type=source.model_type, library_versions=package.library_versions(),
                      model_id=source.model_id, trust_remote_code=source.trust_remote_code),
        target=Target(name=preset.name, providers=list(preset.providers),
                      # Only the INT8 recipe depends on the instruction set; a float graph runs on any CPU.
                      required_cpu_flags=list(preset.required_cpu_flags) if precision == "int8" else [],
                      provider_options=provider_options),
        model=package.describe_model(fused, precision),
        tokenizer=TokenizerFile(file="tokenizer.json", sha256=sha256_file(staging / "tokenizer.json"),
                                max_length=source.max_length, pad_id=source.tokenizer.pad_token_id or 0,
                                extra_files=extra),
        task=source.facts, optimization=Optimization(),
        parity=Parity(reference=_reference_name(source), probe_size=len(heldout), metrics={}, thresholds=thresholds,
                      passed=False))

    tokenizer = artifact_tokenizer(staging, draft)  # as served: calibration and every graph the search tries
    feeder = Feeder(tokenizer)

    def served(path: Path, inputs: list[TextInput], expected: Outputs, alone: bool = True) -> ServedParity:
        return served_parity(load_candidate(staging, draft, path, options.threads, tokenizer), inputs, expected,
                             thresholds, alone=alone)

    # a per-token graph answers alike alone and batched (validate checks it): its trials run batched only
    invariant = precision == "int8" and preset.quantization is not None and preset.quantization.batch_invariant and (
        options.activations in (None, "per_token"))

    def evaluate(path: Path, only: list[int] | None = None) -> ParityResult:
        inputs, expected = search_inputs, reference
        if only is not None:
            inputs, expected = [search_inputs[i] for i in only], [reference[i] for i in only]
        return served(path, inputs, expected, alone=not invariant).result

    quantization: Quantization | None = None
    kept_float: list[str] = []
    notes = [*fusion.gaps, *source_notes(source)]
    if fusion.split_layer_norms:
        notes.append(f"{fusion.split_layer_norms} SkipLayerNormalization nodes written as Add + LayerNormalization: "
                     "onnxruntime's CPU kernels run that faster")
    if fusion.padding_mask:
        notes.append("the attention's padding mask made from attention_mask in seven operators, where the export's "
                     "took 30-odd (same values)")
    with stages.stage("quantize"):
        if precision == "int8":
            assert preset.quantization is not None
            config = preset.quantization
            if options.activations:
                config = dataclasses.replace(config, activations=options.activations)
            if not options.calibrated_scales:
                config = dataclasses.replace(config, calibrated_roles=())
            int8 = quantize_int8(fused, final, config, options.task, evaluate, feeder, work, log,
                                 options.threads, options.keep_float_like)
            quantization, kept_float, full_int8 = int8.record, int8.kept_float, int8.full_int8_model
            if kept_float and full_int8 is not None:
                notes.append(f"{len(kept_float)} of {quantization.candidates} quantizable nodes kept in float "
                             "for parity")
                # What parity costs in speed: one sequence of 128 tokens, fp32 vs full INT8 vs what was kept.
                sequence = min(128, source.max_length)
                quantization.latency_ms_seq128 = {
                    "fp32": median_latency_ms(fused, sequence, options.threads),
                    "full_int8": median_latency_ms(full_int8, sequence, options.threads),
                    "final": median_latency_ms(final, sequence, options.threads)}
                log(f"  latency at seq 128 (ms): {quantization.latency_ms_seq128}")
            # What the recipe costs and gains in speed on this host, beside its parity in the manifest.
            quantization.why = preset.why
            quantization.latency_ms = latency_table({"fp32": fused, "final": final}, options.threads,
                                                       max_length=source.max_length)
            quantization.latency_host = cpu_name()
            tables = quantize_embedding_tables(final, final)
            if tables:
                quantization.embedding_tables_int8 = tables
                notes.append(f"word embeddings stored as INT8 rows with a scale per row: {', '.join(tables)}")
            if len(kept_float) == quantization.candidates:
                notes.append("no node could be quantized within the parity thresholds: "
                             "this INT8 artifact runs in float")
                log("  WARNING: every quantized node broke parity; the artifact is effectively float")
        elif precision == "fp16":
            _to_fp16(fused, final)
        else:
            copy_model(fused, final, options.external_data_bytes)
            log("  float model: no quantization")
        if options.external_data_bytes is not None:  # a threshold below the default also splits a smaller model
            copy_model(final, final, options.external_data_bytes)
    with stages.stage("validate"):
        artifact_model = load_as_served(staging, draft, final, options.threads, tokenizer)
        checked = served_parity(artifact_model, heldout, heldout_reference, thresholds)
        parity = checked.result
        log(f"  validated on {checked.provider}")
        if precision == "fp16":
            notes.append(f"FP16 validated on {checked.provider} (the GPU's fp16 arithmetic, as served)"
                         if checked.provider != CPU
                         else "FP16 validated on this host's CPU provider (fp16 weights, fp32 arithmetic); fp16 "
                              "arithmetic itself runs only on the GPU")
        log("  held-out, worst of alone and batched: " + ", ".join(f"{k}={v:.4f}" for k, v in parity.metrics.items()))
        log("  batch invariance: " + ", ".join(f"{k}={v:.4g}" for k, v in checked.batch_invariance.items()))
        facts = draft.task
        if options.task in ("feature-extraction", "hybrid-embedding"):
            # int8/uint8 answers: ranges from the texts the recipe saw, never the held-out ones
            seen = [*calibration_inputs(options.task), *tuning_inputs(options.task), *probe_inputs(options.task)]
            facts = dataclasses.replace(facts, embedding_ranges=embedding_ranges(artifact_model, seen))
        del artifact_model  # its session holds the whole graph: not kept through packaging
    if not parity.passed:
        report = "parity failed:\n" + "\n".join(f"  - {f}" for f in parity.failures)
        if not options.allow_failed_parity:
            raise ParityFailed(parity, report)
        log(report + "\n  (kept because --allow-failed-parity was given; the manifest records passed=false)")

    with stages.stage("package"):
        manifest = dataclasses.replace(
            draft,
            model=package.describe_model(final, precision),
            task=facts,
            optimization=Optimization(fusion=fusion.stats, fusion_gaps=fusion.gaps, quantization=quantization,
                                      kept_float=kept_float, stage_seconds=stages.seconds, notes=notes,
                                      exported_bytes=model_bytes(exported), fusion_model_type=fusion.model_type),
            parity=dataclasses.replace(
                draft.parity, metrics=parity.metrics, passed=parity.passed, failures=parity.failures,
                host_cpu_flags=sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma"))),
                overridden=not parity.passed, probe_set=HELDOUT_DESCRIPTION, modes=checked.modes,
                batch_invariance=checked.batch_invariance, provider=checked.provider),
            created_at=package.now(),
        )
        manifest.save(staging)
    return manifest


def source_notes(source: SourceModel) -> list[str]:
    """What the artifact does for this model that a reader of the manifest should know."""
    notes = []
    if source.head and source.task == "feature-extraction":
        notes.append("the graph ends with the model's pooling and " + ", ".join(m.kind for m in source.head)
                     + " modules: it answers sentence embeddings")
    if source.task == "feature-extraction" and all((source.path / f"{name}.pt").is_file() for name in M3_HEADS):
        notes.append("the model also has bge-m3's sparse and ColBERT heads (colbert_linear.pt, sparse_linear.pt): "
                     "--task hybrid-embedding serves all three embeddings from one pass")
    if "lasttoken" in (source.facts.pooling or "").split("+"):
        eos = source.tokenizer.eos_token
        ends = source.tokenizer("probe")["input_ids"][-1:] == [source.tokenizer.eos_token_id]
        notes.append(f"last-token pooling reads the {eos} its tokenizer appends to every input" if ends and eos else
                     "last-token pooling reads each input's last token; this tokenizer appends no end-of-sequence "
                     "token")
    return notes


def _to_fp16(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    model.convert_float_to_float16(keep_io_types=True)
    save_model(model.model, dst)


def _reference_name(source: SourceModel) -> str:
    if source.task == "feature-extraction":
        return "sentence-transformers SentenceTransformer, PyTorch FP32" + (
            "" if source.sentence_transformers else f" (transformers model + {source.facts.pooling} pooling)")
    if source.facts.reranker is not None:
        return ("transformers causal LM: P(true token) against the false one at the last token, as its model card "
                "computes it, PyTorch FP32")
    if source.task == "multi-vector":
        return "sentence-transformers MultiVectorEncoder.encode_document, PyTorch FP32"
    if source.task == "hybrid-embedding":
        return ("bge-m3's formulas over the transformers encoder (dense: first token normalized; sparse: relu of "
                "sparse_linear, each token id's largest; ColBERT: colbert_linear normalized), PyTorch FP32")
    if source.task == "sparse-embedding":
        return "sentence-transformers SparseEncoder, PyTorch FP32" + (
            "" if source.sentence_transformers else " (transformers masked-LM + SpladePooling)")
    if source.task == "ranking":
        return "sentence-transformers CrossEncoder, PyTorch FP32"
    return "transformers, PyTorch FP32"


def _revision(path: Path) -> str | None:
    # A hub snapshot directory is named after its commit.
    return path.name if path.parent.name == "snapshots" else None

