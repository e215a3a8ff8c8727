"""Inputs with an exact token count for a WordPiece tokenizer."""
from __future__ import annotations

from tokenizers import Tokenizer

WORD = "hello"  # one token in the uncased BERT vocabulary


def text_with_tokens(tokenizer_json: str, tokens: int) -> str:
    text = " ".join([WORD] * max(tokens - 2, 1))
    tokenizer = Tokenizer.from_file(tokenizer_json)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    count = len(tokenizer.encode(text).ids)
    if count != tokens:
        raise ValueError(f"built a text of {count} tokens, wanted {tokens}")
    return text
