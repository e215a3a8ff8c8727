"""Export: PyTorch -> ONNX, one graph per task (the task says which module), with dynamic batch and sequence axes."""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from optimize.graph.onnxio import copy_model, external_files
from optimize.tasks.base import SourceModel, UnsupportedModel, input_names

OPSET = 17


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


def export_onnx(source: SourceModel, path: Path, external_data_bytes: int | None = None) -> tuple[list[str], str]:
    """Writes the graph to `path` (weights past `external_data_bytes` to `path`.data); returns its input names and
    its one output name."""
    import torch

    task = source.task
    model = task.load_model(source)
    names = input_names(model)
    head, output = task.graph(model, source)

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.head = head

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            if self.head is None:
                result: torch.Tensor = getattr(self.model(**dict(zip(names, tensors))), output)
                return result
            headed: torch.Tensor = self.head(tensors[names.index("attention_mask")], dict(zip(names, tensors)))
            return headed

    # Traced right-padded, as the server pads (a decoder's positions then count from each row's first token).
    padding_side, source.tokenizer.padding_side = source.tokenizer.padding_side, "right"
    try:
        sample = source.tokenizer(["a short probe", "a somewhat longer probe sentence for tracing"],
                                  padding=True, return_tensors="pt")
    finally:
        source.tokenizer.padding_side = padding_side
    args = tuple(sample[name] for name in names)
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, output]}
    if head is not None and not task.per_token_output(source):
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
    per_tensor = external_files(path)  # over 2 GiB the exporter writes a file per tensor: one file
    if per_tensor or external_data_bytes is not None:
        copy_model(path, path, external_data_bytes)
        for name in set(per_tensor) - set(external_files(path)):
            (path.parent / name).unlink()
    return names, output
