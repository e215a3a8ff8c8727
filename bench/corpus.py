"""A corpus of real prose with its natural spread of lengths: the docstrings of Python's standard library.

    python -m bench corpus --out corpus.json [--count 600] [--min-tokens 256 --tokenizer TOKENIZER.json]

A docstring of 30 words or more is a passage as an indexing job sends it: a paragraph to several pages. Every
host has the same texts for the same Python version; write the corpus once and carry the file to compare hosts
whose Pythons differ.
"""
from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import inspect
import sysconfig
from pathlib import Path

import orjson

SKIP = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "ensurepip"})
MIN_WORDS = 30  # a passage, as an indexing job sends it: median 89 MiniLM tokens, 10 % over 256
COUNT = 600


def docstrings(root: Path) -> list[str]:
    """Every module, class and function docstring under root, cleaned of indentation, in file order."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if SKIP & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node, clean=False)
                if text:
                    found.append(inspect.cleandoc(text))
    return found



@functools.cache
def passages(root: Path) -> list[str]:
    """The distinct docstrings of MIN_WORDS+ words under root in hash order; parsed once per process (seconds for
    the standard library), since tests and benchmarks ask for the corpus again and again."""
    texts = {text for text in docstrings(root) if len(text.split()) >= MIN_WORDS}
    return sorted(texts, key=lambda text: hashlib.sha256(text.encode()).digest())


def build(root: Path | None = None, count: int = COUNT, min_tokens: int = 0,
          tokenizer: Path | None = None) -> list[str]:
    """`count` distinct docstrings of at least MIN_WORDS words (and `min_tokens` of `tokenizer`'s tokens, uncut),
    picked by a hash of their text: the same corpus for the same library on every host, in an order unrelated to
    length or module."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    ordered = passages(root)
    if min_tokens:
        if tokenizer is None:
            raise ValueError("--min-tokens counts a tokenizer's tokens: give --tokenizer")
        from tokenizers import Tokenizer

        counter = Tokenizer.from_file(str(tokenizer))
        counter.no_truncation()
        ordered = [text for text in ordered if len(counter.encode(text).ids) >= min_tokens]
    if len(ordered) < count:
        raise ValueError(f"{root} holds {len(ordered)} docstrings of {MIN_WORDS}+ words"
                         f"{f' and {min_tokens}+ tokens' if min_tokens else ''}, fewer than {count}")
    return ordered[:count]


def load(path: Path) -> list[str]:
    texts = orjson.loads(path.read_bytes())
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise ValueError(f"{path}: expected a JSON list of non-empty strings")
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=COUNT)
    parser.add_argument("--root", type=Path, default=None, help="a folder of Python sources (default: the stdlib)")
    parser.add_argument("--min-tokens", type=int, default=0, help="only texts of this many tokens or more")
    parser.add_argument("--tokenizer", type=Path, default=None, help="the tokenizer.json --min-tokens counts with")
    args = parser.parse_args()
    texts = build(args.root, args.count, args.min_tokens, args.tokenizer)
    args.out.write_bytes(orjson.dumps(texts))
    words = sorted(len(text.split()) for text in texts)
    print(f"{len(texts)} texts, {words[0]}-{words[-1]} words (median {words[len(words) // 2]}) -> {args.out}")
