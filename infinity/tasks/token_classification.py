"""Per-token labels, grouped into entities the way transformers' token-classification pipeline groups them.

`word` is what the pipeline gives: for single tokens the vocabulary token (`##ing`), for groups the
tokenizer's decoder applied to those tokens (lower-cased text for an uncased WordPiece vocabulary).
`start`/`end` are character offsets into the text as sent, so `text[start:end]` is the original slice.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from infinity.engine.tokenization import Encoded
from infinity.manifest import Manifest
from infinity.tasks.base import Task, softmax

STRATEGIES = ("none", "simple", "first", "average", "max")


class Vocabulary:
    """The token strings and decoder of the artifact's tokenizer, as the pipeline sees them."""

    def __init__(self, path: Path | str) -> None:
        self._tokenizer = Tokenizer.from_file(str(path))
        model = self._tokenizer.model
        self.subword_prefix: str | None = getattr(model, "continuing_subword_prefix", None) or None
        unk = getattr(model, "unk_token", None)
        self.unk_id: int | None = self._tokenizer.token_to_id(unk) if unk else None

    def token(self, token_id: int) -> str:
        return self._tokenizer.id_to_token(token_id) or ""

    def join(self, tokens: list[str]) -> str:
        decoder = self._tokenizer.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)


@dataclass
class Token:
    word: str
    scores: np.ndarray
    start: int
    end: int
    index: int
    is_subword: bool


def gather(text: str, probs: np.ndarray, encoded: Encoded, vocabulary: Vocabulary) -> list[Token]:
    tokens = []
    for index, token_id in enumerate(encoded.ids):
        if encoded.special[index]:
            continue
        word = vocabulary.token(token_id)
        start, end = encoded.offsets[index]
        original = text[start:end]
        if vocabulary.subword_prefix:
            is_subword = len(word) != len(original)
        else:
            # no word boundaries in the vocabulary: the pipeline's whitespace heuristic
            is_subword = start > 0 and " " not in text[start - 1:start + 1]
        if token_id == vocabulary.unk_id:
            word, is_subword = original, False
        tokens.append(Token(word, probs[index], start, end, index, is_subword))
    return tokens


def label_tokens(tokens: list[Token], labels: dict[int, str]) -> list[dict[str, Any]]:
    entities = []
    for token in tokens:
        best = int(token.scores.argmax())
        entities.append({"entity": labels[best], "score": token.scores[best], "index": token.index,
                         "word": token.word, "start": token.start, "end": token.end})
    return entities


def label_words(tokens: list[Token], labels: dict[int, str], strategy: str,
                vocabulary: Vocabulary) -> list[dict[str, Any]]:
    """Force one label per word (first / average / max over its subword tokens)."""
    groups: list[list[Token]] = []
    for token in tokens:
        if groups and token.is_subword:
            groups[-1].append(token)
        else:
            groups.append([token])
    entities = []
    for group in groups:
        if strategy == "first":
            scores = group[0].scores
        elif strategy == "max":
            scores = max(group, key=lambda token: token.scores.max()).scores
        else:
            scores = np.nanmean(np.stack([token.scores for token in group]), axis=0)
        best = int(scores.argmax())
        entities.append({"entity": labels[best], "score": scores[best],
                         "word": vocabulary.join([token.word for token in group]),
                         "start": group[0].start, "end": group[-1].end})
    return entities


def split_tag(label: str) -> tuple[str, str]:
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def group_entities(entities: list[dict[str, Any]], vocabulary: Vocabulary) -> list[dict[str, Any]]:
    """Merge adjacent entities of one type; a B- tag always opens a new group."""
    runs: list[list[dict[str, Any]]] = []
    for entity in entities:
        if runs:
            bi, tag = split_tag(entity["entity"])
            _, last_tag = split_tag(runs[-1][-1]["entity"])
            if tag == last_tag and bi != "B":
                runs[-1].append(entity)
                continue
        runs.append([entity])
    return [{"entity_group": run[0]["entity"].split("-", 1)[-1],
             "score": np.mean(np.nanmean([entity["score"] for entity in run])),
             "word": vocabulary.join([entity["word"] for entity in run]),
             "start": run[0]["start"], "end": run[-1]["end"]} for run in runs]


def entities_for(text: str, probs: np.ndarray, encoded: Encoded, labels: dict[int, str], strategy: str,
                 ignore: list[str], vocabulary: Vocabulary) -> list[dict[str, Any]]:
    tokens = gather(text, probs, encoded, vocabulary)
    if strategy in ("none", "simple"):
        entities = label_tokens(tokens, labels)
    else:
        entities = label_words(tokens, labels, strategy, vocabulary)
    if strategy != "none":
        entities = group_entities(entities, vocabulary)
    kept = [e for e in entities if e.get("entity") not in ignore and e.get("entity_group") not in ignore]
    for entity in kept:
        entity["score"] = float(entity["score"])
    return kept


class TokenClassification(Task):
    name = "token-classification"

    def __init__(self, manifest: Manifest, directory: Path | None = None) -> None:
        super().__init__(manifest, directory)
        if directory is None:
            raise ValueError("token-classification needs the artifact directory for its vocabulary")
        self.vocabulary = Vocabulary(Path(directory) / manifest.tokenizer.file)
        self.labels = manifest.task.id2label or {}

    def reduce(self, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return softmax(output.astype(np.float32))
