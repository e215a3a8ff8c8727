"""Graph fusion with onnxruntime's transformer optimizer, with its statistics kept."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from infinity.manifest import Precision
from optimize.attention.padding_mask import MASK
from optimize.attention.written import written_attention
from optimize.graph.onnxio import save_model, weights_left_on_disk
from optimize.options import Plan
from optimize.tasks.base import SourceModel

# Hugging Face model types -> the onnxruntime optimizer's model type. Every encoder family fuses most under
# "bert": measured on tiny models of each family against every model type onnxruntime 1.32 offers (docs/models.md);
# no other type fused an attention "bert" missed.
FUSIBLE = {family: "bert" for family in (
    "bert", "distilbert", "roberta", "xlm-roberta", "camembert", "electra", "albert", "mpnet", "deberta-v2",
    "modernbert", "nomic_bert", "gte", "jina_embeddings_v3")}
EXPECTED = ("Attention", "SkipLayerNormalization")
# Why onnxruntime's Attention fusion does not match a family's attention; said where written_attention does not
# match it either, and the graph keeps it as MatMul/Softmax.
ATTENTION_GAPS = {
    "albert": "its layers share one set of weights, and the fusion turns only the first use into an Attention node",
    "mpnet": "a relative position bias is added to the attention scores, a pattern the fusion does not know",
    "deberta-v2": "disentangled attention (content-to-position and position-to-content terms) has no fused kernel",
    "modernbert": "rotary position embeddings (and sliding-window layers) have no pattern in the encoder fusion",
    "nomic_bert": "rotary position embeddings have no pattern in the encoder fusion",
    "gte": "rotary position embeddings have no pattern in the encoder fusion",
    "jina_embeddings_v3": "rotary position embeddings have no pattern in the encoder fusion",
}


@dataclass
class FusionResult:
    stats: dict[str, int]
    gaps: list[str] = field(default_factory=list)
    model_type: str | None = None  # the onnxruntime optimizer's model type used, None when nothing was fused
    split_layer_norms: int = 0  # SkipLayerNormalization nodes written back as Add + LayerNormalization (CPU)
    padding_mask: bool = False  # the export's padding mask made in seven operators (padding_mask.py)

    @property
    def notes(self) -> list[str]:
        """What the manifest's notes say of these rewrites."""
        notes = []
        if self.split_layer_norms:
            notes.append(f"{self.split_layer_norms} SkipLayerNormalization nodes written as Add + LayerNormalization: "
                         "onnxruntime's CPU kernels run that faster")
        if self.padding_mask:
            notes.append("the attention's padding mask made from attention_mask in seven operators, where the "
                         "export's took 30-odd (same values)")
        return notes


def split_skip_layer_norms(graph: onnx.GraphProto) -> int:
    """SkipLayerNormalization -> Add(input, bias), Add(skip), LayerNormalization: onnxruntime's CPU
    LayerNormalization kernel and two Adds take a third of its SkipLayerNormalization's time (docs/int8.md), and
    the bias Add is a constant the INT8 recipes can fold corrections into. Nodes whose mean or variance outputs
    are read stay fused."""
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    nodes, split = [], 0
    for node in graph.node:
        outputs = list(node.output)
        if (node.op_type != "SkipLayerNormalization" or node.domain != "com.microsoft"
                or any(name in read for name in outputs[1:3])):
            nodes.append(node)
            continue
        p = node.name or outputs[0]
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)
        total = outputs[3] if len(outputs) > 3 and outputs[3] else f"{p}/sum"
        first = node.input[0]
        if len(node.input) > 4 and node.input[4]:
            nodes.append(helper.make_node("Add", [first, node.input[4]], [f"{p}/biased"], name=f"{p}/AddBias"))
            first = f"{p}/biased"
        nodes += [helper.make_node("Add", [first, node.input[1]], [total], name=f"{p}/AddSkip"),
                  helper.make_node("LayerNormalization", [total, node.input[2], *node.input[3:4]], [outputs[0]],
                                   name=f"{p}/LayerNormalization", axis=-1, epsilon=epsilon)]
        split += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return split


def _heads_and_hidden(config: Any) -> tuple[int, int]:
    heads = getattr(config, "num_attention_heads", None) or config.n_heads
    hidden = getattr(config, "hidden_size", None) or config.dim
    return int(heads), int(hidden)


def fuse_for(plan: Plan, exported: Path, fused: Path, source: SourceModel) -> tuple[Path, FusionResult]:
    """The graph the target quantizes or serves, and what fusing it did."""
    if plan.precision == Precision.BF16:
        # OpenVINO fuses the plain export itself; onnxruntime's fused graph would keep contrib ops it does not take
        # (mpnet's attention), which then run apart in fp32 (infinity/engine/openvino.py)
        plan.log("  bf16: the export as it is, for OpenVINO to fuse")
        return exported, FusionResult({}, [])
    fusion = fuse(exported, fused, source.config, for_gpu=plan.preset.is_gpu,
                  external_data_bytes=plan.options.external_data_bytes)
    plan.log(f"  fused ({fusion.model_type or 'no recipe'}): {fusion.stats or 'nothing'}"
             + (f"; gaps: {fusion.gaps}" if fusion.gaps else ""))
    return fused, fusion


def fuse(src: Path, dst: Path, config: Any, for_gpu: bool = False,
         external_data_bytes: int | None = None) -> FusionResult:
    from onnxruntime.quantization.onnx_model import ONNXModel
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = FUSIBLE.get(config.model_type)
    if model_type is None:
        save_model(onnx.load(str(src)), dst, external_data_bytes)
        return FusionResult({}, [f"model type {config.model_type!r} has no fusion recipe; graph left as exported "
                                 "(onnxruntime's own graph optimizations still apply at load)"])
    heads, hidden = _heads_and_hidden(config)
    # The fusions copy the whole model for each shape inference they run: XLM-R large's 2.2 GB of weights, loaded,
    # peaked at 15.7 GB. Left in their file, they are read where a fusion needs their values (the Q, K, V weights
    # it concatenates) and when the fused graph is written.
    with weights_left_on_disk(src) as model:
        optimized = optimize_model(model, model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0,
                                   use_gpu=for_gpu)
        stats = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
        domains = {o.domain for o in optimized.model.opset_import}
        for domain in sorted({node.domain for node in optimized.model.graph.node} - domains - {"", "ai.onnx"}):
            # onnxruntime's own save adds the contrib domains its fusions use; this save (and the converter) must too
            optimized.model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
        if not for_gpu:
            optimized.model, written = written_attention(optimized.model)
            if written:
                stats["Attention"] = stats.get("Attention", 0) + written
        # Quantization rewrites Gemm as MatMul + Add under new names; do it here so node names stay stable.
        rewritten = ONNXModel(optimized.model)
        rewritten.replace_gemm_with_matmul()
        rewritten.remove_unused_constant()
        rewritten.clean_initializers()
        split = 0 if for_gpu else split_skip_layer_norms(optimized.model.graph)
        made_mask = any(node.output[0] == MASK for node in optimized.model.graph.node)
    save_model(optimized.model, dst, external_data_bytes, weights_from=src.parent)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", 0)
    gaps = [f"expected {name} fusions for {layers} layers, found {stats.get(name, 0)}"
            for name in EXPECTED if layers and stats.get(name, 0) < layers]
    if layers and stats.get("Attention", 0) < layers and config.model_type in ATTENTION_GAPS:
        gaps.append(f"attention not fused ({config.model_type}): {ATTENTION_GAPS[config.model_type]}")
    return FusionResult(stats, gaps, model_type, split, made_mask)
