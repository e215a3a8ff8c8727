"""What every task does: parse a request body, reduce the padded batch, answer one request."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infinity.errors import EmptyInput, ValidationError
from infinity.manifest import Manifest
from infinity.tokenization import Encoded, TextInput


@dataclass
class Request:
    """A validated request: the texts to tokenize and the task's parsed parameters."""
    texts: list[TextInput]
    params: dict[str, Any]
    single: bool
    truncate: bool = True


class Task:
    name: str = ""
    parameters: tuple[str, ...] = ()

    def __init__(self, manifest: Manifest, directory: Path | None = None) -> None:
        self.manifest = manifest
        self.directory = directory

    def parse(self, inputs: Any, parameters: dict[str, Any]) -> Request:
        raise NotImplementedError

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Batch-level numeric work on the padded engine output; rows stay aligned with the batch."""
        return output

    def respond(self, rows: np.ndarray, request: Request, encoded: list[Encoded]) -> Any:
        raise NotImplementedError

    def check_parameters(self, parameters: Any) -> dict[str, Any]:
        if parameters is None:
            return {}
        if not isinstance(parameters, dict):
            raise ValidationError("parameters must be an object")
        unknown = sorted(set(parameters) - set(self.parameters) - {"truncate"})
        if unknown:
            raise ValidationError(f"unknown parameters for {self.name}: {', '.join(unknown)}; "
                                  f"allowed: {', '.join(sorted(self.parameters + ('truncate',)))}")
        return parameters


def text_list(inputs: Any, what: str = "inputs") -> tuple[list[str], bool]:
    """A str or a non-empty list of str; returns the list and whether a single str was sent."""
    if isinstance(inputs, str):
        texts, single = [inputs], True
    elif isinstance(inputs, list):
        if not all(isinstance(t, str) for t in inputs):
            raise ValidationError(f"{what} must be a string or a list of strings")
        texts, single = inputs, False
    else:
        raise ValidationError(f"{what} must be a string or a list of strings")
    if not texts:
        raise EmptyInput(f"{what} is empty")
    if any(not t.strip() for t in texts):
        raise EmptyInput(f"{what} contains an empty string")
    return texts, single


def flag(parameters: dict[str, Any], name: str, default: bool) -> bool:
    value = parameters.get(name, default)
    if not isinstance(value, bool):
        raise ValidationError(f"parameters.{name} must be true or false")
    return value


def positive_int(parameters: dict[str, Any], name: str) -> int | None:
    value = parameters.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(f"parameters.{name} must be a positive integer")
    return value


def choice(parameters: dict[str, Any], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = parameters.get(name, default)
    if value not in allowed:
        raise ValidationError(f"parameters.{name} must be one of {', '.join(allowed)}")
    return value


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
