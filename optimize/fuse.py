"""Graph fusion with onnxruntime's transformer optimizer, with its statistics kept."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

# Hugging Face model types -> the onnxruntime optimizer's model type (encoder-only families share "bert").
FUSIBLE = {"bert": "bert", "distilbert": "bert", "roberta": "bert", "xlm-roberta": "bert",
           "camembert": "bert", "electra": "bert", "mpnet": "bert", "deberta-v2": "bert", "albert": "bert"}
EXPECTED = ("Attention", "SkipLayerNormalization")


@dataclass
class FusionResult:
    stats: dict[str, int]
    gaps: list[str] = field(default_factory=list)


def _heads_and_hidden(config: Any) -> tuple[int, int]:
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_heads")
    hidden = getattr(config, "hidden_size", None) or getattr(config, "dim")
    return int(heads), int(hidden)


def fuse(src: Path, dst: Path, config: Any, for_gpu: bool = False) -> FusionResult:
    from onnxruntime.quantization.onnx_model import ONNXModel
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = FUSIBLE.get(config.model_type)
    if model_type is None:
        onnx.save(onnx.load(str(src)), str(dst))
        return FusionResult({}, [f"model type {config.model_type!r} has no fusion recipe; graph left as exported "
                                 "(onnxruntime's own graph optimizations still apply at load)"])
    heads, hidden = _heads_and_hidden(config)
    optimized = optimize_model(str(src), model_type=model_type, num_heads=heads, hidden_size=hidden,
                               opt_level=0, use_gpu=for_gpu)
    stats = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", 0)
    gaps = [f"expected {name} fusions for {layers} layers, found {stats.get(name, 0)}"
            for name in EXPECTED if layers and stats.get(name, 0) < layers]
    # Quantization rewrites Gemm as MatMul + Add under new names; do it here so node names stay stable.
    rewritten = ONNXModel(optimized.model)
    rewritten.replace_gemm_with_matmul()
    rewritten.remove_unused_constant()
    rewritten.clean_initializers()
    optimized.save_model_to_file(str(dst))
    return FusionResult(stats, gaps)
