"""infinity: the server (`infinity serve`) and, for Python, the same engine in-process (`infinity.Model`)."""
from __future__ import annotations

from typing import Any

_LIBRARY = ("Model", "SparseVector", "HybridVectors", "Ranked", "Classified")


def __getattr__(name: str) -> Any:
    """The library's names, imported on first use: `import infinity.cli` loads nothing of it."""
    if name in _LIBRARY:
        from infinity import library

        return getattr(library, name)
    raise AttributeError(f"module 'infinity' has no attribute {name!r}")


__all__ = list(_LIBRARY)
