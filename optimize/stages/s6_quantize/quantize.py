"""The quantize stage's body: the target's INT8 recipe judged on the search texts as served, with what it costs and
gains in speed, or the float graph as fp16 or as it is."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from infinity.engine.hostinfo import cpu_name
from infinity.engine.tokenization import TextTokenizer
from infinity.manifest import Activations, Manifest, Precision, Quantization
from optimize.graph.onnxio import copy_model, save_model, weights_beside
from optimize.measure.agreement import ParityResult
from optimize.options import Plan
from optimize.stages.s4_reference import References
from optimize.stages.s5_draft.served import load_candidate, served_parity
from optimize.stages.s6_quantize.calibrate import Feeder
from optimize.stages.s6_quantize.embeddings import quantize_embedding_tables
from optimize.stages.s6_quantize.int8 import quantize_int8
from optimize.stages.s6_quantize.latency import latency_table, median_latency_ms


@dataclass
class Quantized:
    """What the quantize stage did: the INT8 record (None for a float graph), the nodes kept float, the notes."""
    record: Quantization | None = None
    kept_float: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def quantize(plan: Plan, draft: Manifest, tokenizer: TextTokenizer, graph: Path, final: Path,
             references: References, work: Path) -> Quantized:
    """`graph` (the fused one) quantized or converted into `final`, its weights beside it past the size limit;
    `work` holds the candidate graphs."""
    if plan.precision == Precision.INT8:
        quantized = int8(plan, draft, tokenizer, graph, final, references, work)
    else:
        if plan.precision == Precision.FP16:
            _to_fp16(graph, final)
        else:
            copy_model(graph, final, plan.options.external_data_bytes)
            plan.log("  float model: no quantization")
        quantized = Quantized()
    weights_beside(final)
    return quantized


def int8(plan: Plan, draft: Manifest, tokenizer: TextTokenizer, graph: Path, final: Path, references: References,
         work: Path) -> Quantized:
    options, task = plan.options, plan.task
    assert plan.preset.quantization is not None
    config = plan.preset.quantization
    search_inputs, reference, thresholds = references.search_inputs, references.search, draft.parity.thresholds
    # a per-token graph answers alike alone and batched (validate checks it): its trials run batched only
    activations = Activations(options.activations or config.activations)
    invariant = config.batch_invariant and activations == Activations.PER_TOKEN

    def evaluate(path: Path, only: list[int] | None = None) -> ParityResult:
        inputs, expected = search_inputs, reference
        if only is not None:
            inputs, expected = [search_inputs[i] for i in only], [reference[i] for i in only]
        model = load_candidate(final.parent, draft, path, options.threads, tokenizer)
        return served_parity(task, model, inputs, expected, thresholds, alone=not invariant).result

    if options.activations:
        config = dataclasses.replace(config, activations=activations)
    if not options.calibrated_scales:
        config = dataclasses.replace(config, calibrated_roles=())
    result = quantize_int8(graph, final, config, task, evaluate, Feeder(tokenizer), work, plan.log, options.threads,
                           options.keep_float_like)
    quantization, kept_float, full_int8 = result.record, result.kept_float, result.full_int8_model
    notes = []
    if kept_float and full_int8 is not None:
        notes.append(f"{len(kept_float)} of {quantization.candidates} quantizable nodes kept in float for parity")
        # What parity costs in speed: one sequence of 128 tokens, fp32 vs full INT8 vs what was kept.
        sequence = min(128, draft.tokenizer.max_length)
        quantization.latency_ms_seq128 = {
            "fp32": median_latency_ms(graph, sequence, options.threads),
            "full_int8": median_latency_ms(full_int8, sequence, options.threads),
            "final": median_latency_ms(final, sequence, options.threads)}
        plan.log(f"  latency at seq 128 (ms): {quantization.latency_ms_seq128}")
    # What the recipe costs and gains in speed on this host, beside its parity in the manifest.
    quantization.why = plan.preset.why
    quantization.latency_ms = latency_table({"fp32": graph, "final": final}, options.threads,
                                            max_length=draft.tokenizer.max_length)
    quantization.latency_host = cpu_name()
    tables = quantize_embedding_tables(final, final)
    if tables:
        quantization.embedding_tables_int8 = tables
        notes.append(f"word embeddings stored as INT8 rows with a scale per row: {', '.join(tables)}")
    if len(kept_float) == quantization.candidates:
        notes.append("no node could be quantized within the parity thresholds: this INT8 artifact runs in float")
        plan.log("  WARNING: every quantized node broke parity; the artifact is effectively float")
    return Quantized(quantization, kept_float, notes)


def _to_fp16(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    model.convert_float_to_float16(keep_io_types=True)
    save_model(model.model, dst)
