"""What every task knows: its inputs in the HF Inference API shape, its batch reduction, and its answers."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from infinity.engine.tokenization import Encoded, TextInput
from infinity.manifest import Manifest
from infinity.schema import Array, OneOf, Schema, Text

DIRECTIONS = ("right", "left")


@dataclass
class Request:
    """What the core runs: texts (or text pairs) or token ids, and how to cut them to the model's length."""
    texts: list[TextInput] = field(default_factory=list)
    token_ids: list[list[int]] | None = None
    truncate: bool = True
    direction: str = "right"
    tokens: bool = False  # answer every token's vector, not the task's reduction of them
    max_length: int | None = None  # cut (or refuse) texts past this many tokens, where shorter than the model's
    role: str | None = None  # multi-vector: "query" or "document"
    truncate_with: str = ""  # how this request's API turns truncation on, for the error a too-long input gets

    @property
    def size(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else len(self.texts)

    @property
    def chars(self) -> int:
        if self.token_ids is not None:
            return sum(len(ids) for ids in self.token_ids)
        return sum(len(t) if isinstance(t, str) else len(t[0]) + len(t[1]) for t in self.texts)


@dataclass
class Parsed:
    """An HF Inference API body, checked: the core request plus what the answer needs."""
    request: Request
    params: dict[str, Any]
    single: bool


def texts_schema(limit: int) -> Schema:
    return OneOf((Text(), Array(Text(), max_items=limit)), "a string or a list of strings")


class Task:
    name: str = ""
    # body fields beside "parameters" that TEI and huggingface_hub send at the top level of /predict
    top_level: tuple[str, ...] = ()
    # the hosted Inference API (and so huggingface_hub) wraps a single input's answer in a list of one
    nests_single_answer: bool = False

    def __init__(self, manifest: Manifest, directory: Path | None = None) -> None:
        self.manifest = manifest
        self.directory = directory

    def inputs(self, limit: int) -> Schema:
        """The schema of `inputs`, at most `limit` of them per request."""
        raise NotImplementedError

    def parameters(self) -> dict[str, Schema]:
        """The task's own `parameters` (truncation is common to all and added by the route)."""
        return {}

    def answer_doc(self) -> dict[str, Any]:
        """The JSON schema of a 200 answer on /predict."""
        raise NotImplementedError

    def parse(self, inputs: Any, params: dict[str, Any]) -> Parsed:
        """Checked inputs and parameters -> the core request; params lack the keys the client left out."""
        raise NotImplementedError

    def encoded(self, request: Request, items: list[Encoded]) -> list[Encoded]:
        """The request's tokens as the model reads them: as tokenized, unless the task adds to them."""
        return items

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Batch-level numeric work on the padded engine output; rows stay aligned with the batch."""
        return output

    def respond(self, rows: np.ndarray, parsed: Parsed, encoded: list[Encoded]) -> Any:
        raise NotImplementedError

    def token_vectors(self, output: np.ndarray) -> np.ndarray:
        """Every token's vector of the padded engine output (batch x tokens x dim), where the graph answers them."""
        raise NotImplementedError(f"{self.name} answers no token vectors")


def softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def activate(logits: np.ndarray, function: str) -> np.ndarray:
    logits = logits.astype(np.float32)
    if function == "softmax":
        return softmax(logits)
    if function == "sigmoid":
        return sigmoid(logits)
    return logits
