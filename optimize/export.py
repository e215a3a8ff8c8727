"""PyTorch -> ONNX, one graph per task with dynamic batch and sequence axes."""
from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from optimize.onnxio import copy_model, external_files
from optimize.source import SourceModel

OPSET = 17


class UnsupportedModel(ValueError):
    """The model cannot be exported for this task; the message is the one line the user sees."""


def load_torch_model(source: SourceModel) -> Any:
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

    cls = {
        "feature-extraction": AutoModel,
        "sequence-classification": AutoModelForSequenceClassification,
        "ranking": AutoModelForSequenceClassification,
        "token-classification": AutoModelForTokenClassification,
    }[source.task]
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


@contextmanager
def broadcast_masks() -> Iterator[None]:
    """transformers builds a mask from custom functions (EmbeddingGemma's bidirectional and windowed attention)
    with vmap, which the ONNX exporter cannot trace; its own mask functions are index arithmetic that
    broadcasting computes alike, so the export builds them that way."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS as masks

    eager = masks["eager"]

    def broadcast(*args: Any, **kwargs: Any) -> Any:
        return eager(*args, **{**kwargs, "use_vmap": False})

    masks["eager"] = broadcast
    try:
        yield
    finally:
        masks["eager"] = eager


def embedding_head(source: SourceModel) -> Any:
    """The model's own sentence-transformers Pooling and the modules after it that the graph includes, as one
    torch module: (token vectors, attention mask) -> sentence embeddings."""
    import torch
    from sentence_transformers import SentenceTransformer

    modules = list(SentenceTransformer(str(source.path), device="cpu",
                                       trust_remote_code=source.trust_remote_code))[1:2 + len(source.head)]

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.steps = torch.nn.ModuleList(modules)

        def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            features = {"token_embeddings": hidden, "attention_mask": attention_mask}
            for step in self.steps:
                features = step(features)
            return features["sentence_embedding"]

    return Head().eval()


def export_onnx(source: SourceModel, path: Path, external_data_bytes: int | None = None) -> tuple[list[str], str]:
    """Writes the graph to `path` (weights past `external_data_bytes` to `path`.data); returns its input names and
    its one output name."""
    import torch

    model = load_torch_model(source)
    names = input_names(model)
    head = embedding_head(source) if source.facts.pooled_in_graph else None
    if head is not None:
        output = "sentence_embedding"
    else:
        output = "last_hidden_state" if source.task == "feature-extraction" else "logits"

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.head = head

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            if self.head is None:
                result: torch.Tensor = getattr(self.model(**dict(zip(names, tensors))), output)
                return result
            hidden = self.model(**dict(zip(names, tensors))).last_hidden_state
            pooled: torch.Tensor = self.head(hidden, tensors[names.index("attention_mask")])
            return pooled

    # Traced right-padded, as the server pads (a decoder's positions then count from each row's first token).
    padding_side, source.tokenizer.padding_side = source.tokenizer.padding_side, "right"
    try:
        sample = source.tokenizer(["a short probe", "a somewhat longer probe sentence for tracing"],
                                  padding=True, return_tensors="pt")
    finally:
        source.tokenizer.padding_side = padding_side
    args = tuple(sample[name] for name in names)
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, output]}
    if head is not None:
        axes[output] = {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad(), broadcast_masks():
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
