"""Calibration: the texts, the graph's inputs for them as the server builds them, and the per-channel range of
every quantizable node's input over their real tokens, which smoothing and calibrated scales are made from."""
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
from optimize.onnxio import session_source
from optimize.validate.probes import for_task

# Calibration texts choose which channels stay float; they are kept apart from the probes that judge parity.
CALIBRATION_SINGLES: tuple[str, ...] = (
    "b",
    "Thanks!",
    "Where can I buy fresh bread on Sunday mornings?",
    "The committee postponed the vote until next spring because of the budget dispute.",
    "Terrible customer support: I waited on hold for 45 minutes and nobody answered.",
    "Ibuprofen 200mg may be taken every 4-6 hours; do not exceed 1200mg in 24 hours.",
    "Invoice INV-2023-0042 totals $7,350.00, due 30 days after 01/09/2023.",
    "x = np.linspace(0, 1, 100); y = np.sin(2 * np.pi * x)",
    "Wir treffen uns morgen um 9 Uhr am Hauptbahnhof in München.",
    "Le chat dort sur le canapé pendant que la pluie tombe dehors.",
    "北京是中国的首都，也是一座历史悠久的城市。",
    "Great game last night 🏀🔥 can't wait for the finals!!!",
    "Marie Curie was the first woman to win a Nobel Prize, in physics in 1903.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Neural networks with residual connections train deeper models without vanishing gradients.",
    "<div class=\"header\"><a href=\"/home\">Home</a></div>",
    " ".join(["data"] * 60),
    "A detailed account. " + " ".join(
        "The train was delayed twice, yet the conductor kept everyone informed and calm throughout."
        for _ in range(10)),
)


CALIBRATION_PAIRS: tuple[tuple[str, str], ...] = (
    ("Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare around 1600."),
    ("Who wrote Hamlet?", "Macbeth is set in Scotland."),
    ("Who wrote Hamlet?", "The printing press was invented in the 15th century."),
    ("how to boil an egg", "Place the egg in boiling water for 7 to 9 minutes, then cool it in cold water."),
    ("how to boil an egg", "Chickens lay eggs of different colours depending on the breed."),
    ("how to boil an egg", "The stock market closed higher on Friday."),
    ("cheap flights to Rome", "Compare fares from 120 airlines and find deals to Rome Fiumicino."),
    ("cheap flights to Rome", "Rome is the capital city of Italy."),
    ("A dog runs in the park.", "An animal is running outside."),
    ("A dog runs in the park.", "A man reads a newspaper."),
)


def calibration_inputs(task: str) -> list[TextInput]:
    return for_task(task, CALIBRATION_SINGLES, CALIBRATION_PAIRS)


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
