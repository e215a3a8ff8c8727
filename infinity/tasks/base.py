"""What every task knows: the tokens the model reads of it, and its batch reduction.
The API families (infinity/api/) turn their bodies into a Job and the rows into their answers."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from infinity.engine.job import Job
from infinity.engine.tokenization import Encoded, TextInput, concatenated
from infinity.errors import ValidationError
from infinity.manifest import Manifest

# the tasks that run a long text whole, in windows: every message about chunking names them so
WINDOWED = ("embeddings pooled in the server, max-pooled sparse embeddings, bge-m3's heads, multi-vector documents "
            "and rankers")


class Task:
    name: str = ""
    windowed = False  # runs a long text whole, in windows (joined_windows)
    window_rule = ""  # how the windows' rows become the text's, as the chunking field describes it
    rows_per_token = False  # its answer holds numbers for every token (multi-vector, hybrid), so grows with them

    def __init__(self, manifest: Manifest, directory: Path | None = None) -> None:
        self.manifest = manifest
        self.directory = directory

    def templated(self, request: Job, texts: Sequence[TextInput]) -> list[TextInput]:
        """What the tokenizer reads of the request's texts: as sent, unless the task puts them in a template."""
        return list(texts)

    def encoded(self, request: Job, items: list[Encoded]) -> list[Encoded]:
        """The request's tokens as the model reads them: as tokenized, unless the task adds to them."""
        return items

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Batch-level numeric work on the padded engine output; rows stay aligned with the batch."""
        return output

    def label_names(self, count: int) -> tuple[str, ...]:
        """The name of each of `count` labels, by id: the manifest's, else LABEL_i as transformers names it."""
        labels = self.manifest.task.id2label or {}
        return tuple(labels.get(i, f"LABEL_{i}") for i in range(count))

    def in_windows(self, request: Job) -> bool:
        """Whether the request's long texts run whole in windows, where chunking is asked for."""
        return self.windowed

    @staticmethod
    def spans(windows: list[list[Encoded]]) -> list[tuple[int, int]]:
        """Each text's (start, end) among the rows of its windows, which run in order."""
        ends = np.cumsum([len(text) for text in windows]).tolist()
        return list(zip([0, *ends[:-1]], ends))

    def largest(self, rows: np.ndarray, windows: list[list[Encoded]]) -> np.ndarray:
        """Each text's row: the largest of its windows' rows, entry by entry."""
        return np.stack([rows[start:end].max(axis=0) for start, end in self.spans(windows)])

    def joined(self, rows: np.ndarray, windows: list[list[Encoded]],
               tokens: bool = False) -> tuple[np.ndarray, list[Encoded]]:
        """Each text's row and encoding from its windows' (see --chunk-long-inputs): with `tokens`, every token's
        vector of every window, one window after another; else the task's own rule."""
        joined = token_rows(rows, windows) if tokens else self.joined_windows(rows, windows)
        return joined, [concatenated(text) for text in windows]

    def joined_windows(self, rows: np.ndarray, windows: list[list[Encoded]]) -> np.ndarray:
        """One row per text from the rows of its windows, where the task defines it."""
        raise ValidationError(f"{self.name} does not run long texts in windows; chunking serves {WINDOWED}")

    def token_vectors(self, output: np.ndarray) -> np.ndarray:
        """Every token's vector of the padded engine output (batch x tokens x dim), where the graph answers them."""
        raise NotImplementedError(f"{self.name} answers no token vectors")


def token_rows(rows: np.ndarray, windows: list[list[Encoded]], first: int = 0) -> np.ndarray:
    """Each text's token rows, its windows' one after another (from each window but the text's first, its tokens
    from `first` on), as an object array of one array per text: padding every text to the longest would take the
    longest text's memory once per text."""
    joined = np.empty(len(windows), dtype=object)
    for index, (text, (start, _)) in enumerate(zip(windows, Task.spans(windows))):
        joined[index] = np.concatenate([rows[start, :len(text[0])],
                                        *(rows[start + k, first:len(window)] for k, window in enumerate(text[1:], 1))])
    return joined


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
