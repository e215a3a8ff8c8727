"""PyTorch -> ONNX, one graph per task with dynamic batch and sequence axes."""
from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any

from optimize.source import SourceModel

OPSET = 17


def load_torch_model(source: SourceModel) -> Any:
    from transformers import (AutoModel, AutoModelForSequenceClassification,
                              AutoModelForTokenClassification)

    cls = {
        "feature-extraction": AutoModel,
        "sequence-classification": AutoModelForSequenceClassification,
        "ranking": AutoModelForSequenceClassification,
        "token-classification": AutoModelForTokenClassification,
    }[source.task]
    # Eager attention traces to the plain MatMul/Softmax pattern that onnxruntime's fusions recognize.
    return cls.from_pretrained(source.path, attn_implementation="eager").eval()


def input_names(model: Any) -> list[str]:
    accepted = inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in accepted and getattr(model.config, "type_vocab_size", 0):
        names.append("token_type_ids")
    return names


def export_onnx(source: SourceModel, path: Path) -> tuple[list[str], str]:
    """Writes the graph to `path`; returns its input names and its one output name."""
    import torch

    model = load_torch_model(source)
    names = input_names(model)
    output = "last_hidden_state" if source.task == "feature-extraction" else "logits"

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return getattr(self.model(**dict(zip(names, tensors))), output)

    sample = source.tokenizer(["a short probe", "a somewhat longer probe sentence for tracing"],
                              padding=True, return_tensors="pt")
    args = tuple(sample[name] for name in names)
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, output]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        # .eval() on the wrapper too: export restores the wrapper's mode onto the model afterwards.
        torch.onnx.export(Wrapped().eval(), args, str(path), input_names=names, output_names=[output],
                          dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    return names, output
