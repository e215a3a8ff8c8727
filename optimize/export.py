"""PyTorch -> ONNX, one graph per task with dynamic batch and sequence axes."""
from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any

from optimize.onnxio import copy_model, external_files
from optimize.source import SourceModel

OPSET = 17


class UnsupportedModel(ValueError):
    """The model cannot be exported for this task; the message is the one line the user sees."""


def load_torch_model(source: SourceModel) -> Any:
    from transformers import (AutoModel, AutoModelForSequenceClassification,
                              AutoModelForTokenClassification)

    cls = {
        "feature-extraction": AutoModel,
        "sequence-classification": AutoModelForSequenceClassification,
        "ranking": AutoModelForSequenceClassification,
        "token-classification": AutoModelForTokenClassification,
    }[source.task]
    if getattr(source.config, "is_encoder_decoder", False):
        raise UnsupportedModel(f"model type {source.model_type!r} is an encoder-decoder; multiverse exports encoder "
                               "models (see docs/models.md for the supported families)")
    try:
        # Eager attention traces to the plain MatMul/Softmax pattern that onnxruntime's fusions recognize.
        return cls.from_pretrained(source.path, attn_implementation="eager",
                                   trust_remote_code=source.trust_remote_code).eval()
    except ValueError as exc:  # transformers' "Unrecognized configuration class ..." runs over many lines
        if "Unrecognized configuration class" not in str(exc):
            raise
        raise UnsupportedModel(f"transformers has no {cls.__name__} for model type {source.model_type!r}, so "
                               f"multiverse cannot build a {source.task} model from it") from None


def input_names(model: Any) -> list[str]:
    """The inputs the graph takes. Segment ids only where the model has more than one segment embedding: with
    one (RoBERTa, XLM-R, GTE), the only valid id is 0, which is what the model assumes when given none, and a
    tokenizer that numbers a pair's second text 1 would index past the table."""
    accepted = inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in accepted and (getattr(model.config, "type_vocab_size", 0) or 0) >= 2:
        names.append("token_type_ids")
    return names


def export_onnx(source: SourceModel, path: Path, external_data_bytes: int | None = None) -> tuple[list[str], str]:
    """Writes the graph to `path` (weights past `external_data_bytes` to `path`.data); returns its input names and
    its one output name."""
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
        try:
            # .eval() on the wrapper too: export restores the wrapper's mode onto the model afterwards.
            torch.onnx.export(Wrapped().eval(), args, str(path), input_names=names, output_names=[output],
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False)
        except Exception as exc:  # the tracer and the exporter raise many unrelated types
            first = (str(exc) or type(exc).__name__).strip().splitlines()[0][:200]
            raise UnsupportedModel(f"model type {source.model_type!r} could not be exported to ONNX: {first}") from exc
    if external_files(path) or external_data_bytes is not None:
        copy_model(path, path, external_data_bytes)  # over 2 GiB the exporter writes a file per tensor: one file
    return names, output
