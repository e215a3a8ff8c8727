"""Graph fusion with onnxruntime's transformer optimizer, with its statistics kept."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from optimize.onnxio import save_model

# Hugging Face model types -> the onnxruntime optimizer's model type. Every encoder family fuses most under
# "bert": measured on tiny models of each family against every model type onnxruntime 1.32 offers (docs/models.md);
# no other type fused an attention "bert" missed.
FUSIBLE = {family: "bert" for family in (
    "bert", "distilbert", "roberta", "xlm-roberta", "camembert", "electra", "albert", "mpnet", "deberta-v2",
    "modernbert", "nomic_bert", "gte", "jina_embeddings_v3")}
EXPECTED = ("Attention", "SkipLayerNormalization")
# Why onnxruntime's Attention fusion does not match a family's attention: the graph keeps it as MatMul/Softmax.
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


def _heads_and_hidden(config: Any) -> tuple[int, int]:
    heads = getattr(config, "num_attention_heads", None) or config.n_heads
    hidden = getattr(config, "hidden_size", None) or config.dim
    return int(heads), int(hidden)


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
    optimized = optimize_model(str(src), model_type=model_type, num_heads=heads, hidden_size=hidden,
                               opt_level=0, use_gpu=for_gpu)
    stats = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", 0)
    gaps = [f"expected {name} fusions for {layers} layers, found {stats.get(name, 0)}"
            for name in EXPECTED if layers and stats.get(name, 0) < layers]
    if layers and stats.get("Attention", 0) < layers and config.model_type in ATTENTION_GAPS:
        gaps.append(f"attention not fused ({config.model_type}): {ATTENTION_GAPS[config.model_type]}")
    # Quantization rewrites Gemm as MatMul + Add under new names; do it here so node names stay stable.
    rewritten = ONNXModel(optimized.model)
    rewritten.replace_gemm_with_matmul()
    rewritten.remove_unused_constant()
    rewritten.clean_initializers()
    domains = {o.domain for o in optimized.model.opset_import}
    for domain in sorted({node.domain for node in optimized.model.graph.node} - domains - {"", "ai.onnx"}):
        # onnxruntime's own save adds the contrib domains its fusions use; this save must as well
        optimized.model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    save_model(optimized.model, dst, external_data_bytes)
    return FusionResult(stats, gaps, model_type)
