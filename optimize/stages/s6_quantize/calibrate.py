"""Calibration: the graph's inputs for the calibration texts (optimize/measure/texts.py) as the server builds them, and
the per-channel range of every quantizable node's input over their real tokens, which smoothing and calibrated scales
are made from."""
from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from infinity.engine.tokenization import TextInput, TextTokenizer, pad_batch
from optimize.graph.onnxio import session_source


class Feeder:
    """Feeds for a graph as the server builds them (its tokenizer.json, padded batches of 8): for calibration."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer

    def batches(self, inputs: list[TextInput]) -> Iterator[tuple[list[Any], dict[str, np.ndarray]]]:
        """(encodings, feeds for every model input) per padded batch of 8."""
        for start in range(0, len(inputs), 8):
            encoded = self.tokenizer.encode(inputs[start:start + 8])
            batch = pad_batch(encoded, self.tokenizer.pad_id)
            yield encoded, {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                            "token_type_ids": batch.token_type_ids}


Feeds = dict[str, np.ndarray]


Bounds = tuple[np.ndarray, np.ndarray]  # per channel (min, max)


def activation_ranges(model_path: Path, nodes: Iterable[str], batches: Iterable[Feeds],
                      threads: int = 0) -> dict[str, np.ndarray]:
    """Per-channel max |x| of each node's first input, over the real (unpadded) tokens of the batches."""
    return peaks(activation_bounds(model_path, nodes, batches, threads))


def peaks(bounds: dict[str, Bounds]) -> dict[str, np.ndarray]:
    return {node: np.maximum(-low, high) for node, (low, high) in bounds.items()}


def activation_bounds(model_path: Path, nodes: Iterable[str], batches: Iterable[Feeds],
                      threads: int = 0) -> dict[str, Bounds]:
    """Per-channel (min, max) of each node's first input, over the real (unpadded) tokens of the batches."""
    return calibrate(model_path, nodes, batches, threads).bounds


@dataclass
class Calibration:
    bounds: dict[str, Bounds]  # node -> per-channel (min, max) of its first input
    samples: dict[str, np.ndarray] = field(default_factory=dict)  # input tensor -> its real-token rows


def calibrate(model_path: Path, nodes: Iterable[str], batches: Iterable[Feeds], threads: int = 0,
              samples: bool = False) -> Calibration:
    """The bounds of each node's first input over the real (unpadded) tokens of the batches and, with `samples`,
    those tokens' rows themselves."""
    import onnxruntime as ort

    model = onnx.load(str(model_path))
    wanted = set(nodes)
    inputs = {n.name: n.input[0] for n in model.graph.node if n.name in wanted}
    outputs = {o.name for o in model.graph.output}
    for tensor in dict.fromkeys(inputs.values()):
        if tensor not in outputs:
            model.graph.output.append(helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory(prefix="ranges-") as scratch:  # a model over 1 GiB goes through a file
        session = ort.InferenceSession(session_source(model, Path(scratch)), options,
                                       providers=["CPUExecutionProvider"])
        del model
        names = [o.name for o in session.get_outputs()]
        feed_names = {i.name for i in session.get_inputs()}
        bounds: dict[str, Bounds] = {}
        rows: dict[str, list[np.ndarray]] = {tensor: [] for tensor in inputs.values()}
        for feeds in batches:
            values = dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in feed_names})))
            real = feeds["attention_mask"].astype(bool)
            for tensor in set(inputs.values()):
                value = values[tensor]
                # [batch, sequence, ...] activations: only the real tokens; anything else (DeBERTa's relative
                # position embeddings are [1, positions, hidden] whatever the batch) is taken whole
                token_rows = value.ndim == 3 and value.shape[:2] == real.shape
                value = value[real] if token_rows else value.reshape(-1, value.shape[-1])
                low, high = value.min(axis=0), value.max(axis=0)
                if tensor in bounds:
                    low, high = np.minimum(bounds[tensor][0], low), np.maximum(bounds[tensor][1], high)
                bounds[tensor] = (low, high)
                if samples:
                    rows[tensor].append(value)
    return Calibration({node: bounds[tensor] for node, tensor in inputs.items()},
                       {tensor: np.concatenate(parts) for tensor, parts in rows.items() if parts})
