"""Text -> token ids with the artifact's own tokenizer.json (no transformers)."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

TextInput = str | tuple[str, str]


class InputTooLong(ValueError):
    """Input `index` has `length` tokens, more than `max_length`, and is not to be cut."""

    def __init__(self, index: int, length: int, max_length: int) -> None:
        super().__init__(f"input {index} has {length} tokens, more than the maximum of {max_length}")
        self.index = index
        self.length = length
        self.max_length = max_length


@dataclass
class Encoded:
    ids: list[int]
    type_ids: list[int]
    offsets: list[tuple[int, int]]
    special: list[int]
    attended: int | None = None  # the model reads only this many tokens from the start (None: all of them)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Batch:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray


class TextTokenizer:
    """Views of one tokenizer.json: truncating to max_length (or a shorter length a request names) from either
    side, and never truncating.

    `frame` (prefix, suffix): every text is encoded between the two, which are never cut (a causal reranker's
    prompt); the text's own tokens are cut to what they leave of max_length."""

    def __init__(self, path: Path | str, max_length: int, pad_id: int, frame: tuple[str, str] | None = None) -> None:
        self.max_length = max_length
        self.pad_id = pad_id
        self._full = Tokenizer.from_file(str(path))
        self._full.no_padding()
        self._full.no_truncation()
        self.vocab_size = self._full.get_vocab_size(with_added_tokens=True)
        self._frame = ([], []) if frame is None else tuple(
            self._full.encode(text, add_special_tokens=False).ids for text in frame)
        room = max_length - len(self._frame[0]) - len(self._frame[1])
        if room < 1:
            raise ValueError(f"the prompt around each text takes {max_length - room} tokens, the whole maximum length")
        self._path = str(path)
        self._lock = threading.Lock()
        self._truncating: dict[tuple[str, int, int], Tokenizer] = {}  # (direction or "windows", length, overlap)
        self._cutter("right", max_length)  # the default; any other is built on its first use (~30 ms)

    def _truncator(self, key: tuple[str, int, int], max_length: int, **truncation: Any) -> Tokenizer:
        """A tokenizer that cuts at `max_length` tokens, the frame included, as `truncation` says; built once."""
        found = self._truncating.get(key)
        if found is None:
            with self._lock:
                found = self._truncating.get(key)
                if found is None:
                    found = Tokenizer.from_file(self._path)
                    found.no_padding()
                    found.enable_truncation(max_length - len(self._frame[0]) - len(self._frame[1]), **truncation)
                    self._truncating[key] = found
        return found

    def _cutter(self, direction: str, max_length: int) -> Tokenizer:
        """A tokenizer that cuts to `max_length` tokens from `direction`."""
        return self._truncator((direction, max_length, 0), max_length, strategy="longest_first", direction=direction)

    def encode(self, texts: list[TextInput], truncate: bool = True, direction: str = "right",
               max_length: int | None = None) -> list[Encoded]:
        """`max_length`: at most this many tokens (never more than the model's own maximum)."""
        limit = self.max_length if max_length is None else min(max_length, self.max_length)
        tokenizer = self._cutter(direction, limit) if truncate else self._full
        encodings = tokenizer.encode_batch(_inputs(texts))
        result = [self._framed(_to_encoded(e)) for e in encodings]
        if not truncate:
            for index, item in enumerate(result):
                if len(item) > limit:
                    raise InputTooLong(index, len(item), limit)
        return result

    def _framed(self, item: Encoded) -> Encoded:
        prefix, suffix = self._frame
        if not prefix and not suffix:
            return item
        return Encoded(ids=[*prefix, *item.ids, *suffix], type_ids=[0] * (len(prefix) + len(item) + len(suffix)),
                       offsets=[(0, 0)] * len(prefix) + item.offsets + [(0, 0)] * len(suffix),
                       special=[1] * len(prefix) + item.special + [1] * len(suffix))

    def _specials(self, pair: bool) -> int:
        """The special tokens the tokenizer adds around a text or a pair."""
        processor = self._full.post_processor
        return processor.num_special_tokens_to_add(pair) if processor is not None else 0

    def window_tokens(self, max_length: int | None = None) -> int:
        """How many of a text's own tokens one window holds: the maximum length (or a shorter one) less the special
        tokens and frame."""
        length = self.max_length if max_length is None else min(max_length, self.max_length)
        return length - len(self._frame[0]) - len(self._frame[1]) - self._specials(False)

    def windows(self, texts: list[TextInput], overlap: int = 0, max_length: int | None = None,
                prompt: str = "") -> list[list[Encoded]]:
        """Each text whole, as consecutive windows of the model's maximum length (or a shorter `max_length`) with
        the special tokens around each, the next repeating the last `overlap` tokens of the one before; a text that
        fits is one window, the encoding `encode` gives it.

        `prompt`: what every text begins with (a multi-vector role's marker); each window of a longer text
        begins with its tokens too, after the leading special tokens."""
        length = self.max_length if max_length is None else min(max_length, self.max_length)
        pairs = any(isinstance(text, tuple) for text in texts)
        marker = self._full.encode(prompt, add_special_tokens=False).ids if prompt else []
        room = (self.window_tokens(length) - len(marker) if not pairs
                else self._document_room(texts, length))  # type: ignore[arg-type]
        if not 0 <= overlap < room:
            raise ValueError(f"a window has room for {max(room, 0)} of a text's tokens"
                             + (" beside the query" if pairs else "") + f", not more than the overlap of {overlap}"
                             + ("; send a shorter query" if pairs else ""))
        tokenizer = self._truncator(("pair windows" if pairs else "windows", length - len(marker), overlap),
                                    length - len(marker), stride=overlap,
                                    strategy="only_second" if pairs else "longest_first", direction="right")
        if not marker:
            return [[self._framed(_to_encoded(window)) for window in (encoding, *encoding.overflowing)]
                    for encoding in tokenizer.encode_batch(_inputs(texts))]
        result = []
        for text in texts:
            assert isinstance(text, str) and text.startswith(prompt)
            whole = self._framed(_to_encoded(self._full.encode(text)))
            if len(whole) <= length:
                result.append([whole])
                continue
            first = tokenizer.encode(text[len(prompt):])
            result.append([marked(self._framed(_to_encoded(window)), marker)
                           for window in (first, *first.overflowing)])
        return result

    def _document_room(self, pairs: list[tuple[str, str]], length: int) -> int:
        """How many of a document's tokens fit in one window of `length` beside the longest query of these pairs."""
        queries = self._full.encode_batch(list({query for query, _ in pairs}), add_special_tokens=False)
        return length - self._specials(True) - max(len(query.ids) for query in queries)

    def lengths(self, texts: list[TextInput]) -> list[int]:
        """Each text's tokens, never cut, the frame included."""
        frame = len(self._frame[0]) + len(self._frame[1])
        return [len(e.ids) + frame for e in self._full.encode_batch(_inputs(texts))]

    def text_windows(self, documents: list[str], rooms: list[int], overlap: int) -> list[list[str]]:
        """Each document as the texts of consecutive windows of its tokens, at most its `room` of them each, the
        next repeating the last `overlap` tokens of the one before: a window's text is the characters its tokens
        cover. A document that fits in its room is its one window, whole."""
        windows = []
        for text, encoding, room in zip(documents, self._full.encode_batch(documents, add_special_tokens=False),
                                        rooms):
            offsets, start, texts = encoding.offsets, 0, []
            if len(offsets) <= room:
                windows.append([text])
                continue
            if not 0 <= overlap < room:
                raise ValueError(f"a window has room for {max(room, 0)} of a text's tokens beside the query, not more "
                                 f"than the overlap of {overlap}; send a shorter query")
            while start + room < len(offsets):
                texts.append(text[offsets[start][0]:offsets[start + room - 1][1]])
                start += room - overlap
            windows.append([*texts, text[offsets[start][0]:]])
        return windows

    def cut_documents(self, pairs: list[TextInput], tokens: int) -> list[TextInput]:
        """Each pair's second text cut after its first `tokens` tokens (Cohere's max_tokens_per_doc)."""
        documents = [pair[1] for pair in pairs if isinstance(pair, tuple)]
        encodings = self._full.encode_batch(documents, add_special_tokens=False)
        cut = iter(text[:encoding.offsets[tokens - 1][1]] if len(encoding.ids) > tokens else text
                   for text, encoding in zip(documents, encodings))
        return [(pair[0], next(cut)) if isinstance(pair, tuple) else pair for pair in pairs]

    def from_ids(self, token_ids: list[list[int]]) -> list[Encoded]:
        """Token ids run exactly as given (no special tokens added), after checking the model can take them."""
        result = []
        for index, ids in enumerate(token_ids):
            if len(ids) > self.max_length:
                raise InputTooLong(index, len(ids), self.max_length)
            if min(ids) < 0 or max(ids) >= self.vocab_size:
                raise ValueError(f"input {index} has a token id outside the vocabulary (0 to {self.vocab_size - 1})")
            result.append(Encoded(ids=list(ids), type_ids=[0] * len(ids), offsets=[(0, 0)] * len(ids),
                                  special=[0] * len(ids)))
        return result

    def tokens(self, texts: list[str], add_special_tokens: bool) -> list[Encoding]:
        """Whole encodings for /tokenize: never truncated, so a client sees what it sent."""
        return self._full.encode_batch(texts, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: list[list[int]], skip_special_tokens: bool) -> list[str]:
        return self._full.decode_batch(token_ids, skip_special_tokens=skip_special_tokens)


def _inputs(texts: list[TextInput]) -> list[str | list[str]]:
    """Texts and pairs as tokenizers takes them (a pair as a list of two)."""
    return [list(text) if isinstance(text, tuple) else text for text in texts]


def _to_encoded(encoding: Encoding) -> Encoded:
    return Encoded(
        ids=encoding.ids,
        type_ids=encoding.type_ids,
        offsets=encoding.offsets,
        special=encoding.special_tokens_mask,
    )


def marked(window: Encoded, marker: list[int]) -> Encoded:
    """A window with the marker's tokens after its leading special tokens, as they follow them in a short text."""
    at = window.special.index(0) if 0 in window.special else len(window.special)
    return Encoded(ids=[*window.ids[:at], *marker, *window.ids[at:]],
                   type_ids=[*window.type_ids[:at], *[0] * len(marker), *window.type_ids[at:]],
                   offsets=[*window.offsets[:at], *[(0, 0)] * len(marker), *window.offsets[at:]],
                   special=[*window.special[:at], *[0] * len(marker), *window.special[at:]])


def concatenated(encodings: list[Encoded]) -> Encoded:
    """One text's windows as one sequence of their tokens, one window after another."""
    return Encoded(ids=[i for e in encodings for i in e.ids], type_ids=[t for e in encodings for t in e.type_ids],
                   offsets=[o for e in encodings for o in e.offsets], special=[s for e in encodings for s in e.special])


def pad_batch(items: list[Encoded], pad_id: int) -> Batch:
    """Pad to the longest sequence in this batch only."""
    length = max(len(item) for item in items)
    input_ids = np.full((len(items), length), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(items), length), dtype=np.int64)
    token_type_ids = np.zeros((len(items), length), dtype=np.int64)
    for row, item in enumerate(items):
        n = len(item)
        input_ids[row, :n] = item.ids
        attention_mask[row, :n if item.attended is None else item.attended] = 1
        token_type_ids[row, :n] = item.type_ids
    return Batch(input_ids, attention_mask, token_type_ids)
