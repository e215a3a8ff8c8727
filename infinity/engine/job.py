"""The core request: what the engine runs for one client request, whichever route it came in on."""
from __future__ import annotations

from dataclasses import dataclass, field

from infinity.engine.tokenization import TextInput

DIRECTIONS = ("right", "left")


@dataclass
class Job:
    """What the core runs: texts (or text pairs) or token ids, and how to cut them to the model's length."""
    texts: list[TextInput] = field(default_factory=list)
    token_ids: list[list[int]] | None = None
    truncate: bool = True
    direction: str = "right"
    tokens: bool = False  # answer every token's vector, not the task's reduction of them
    max_length: int | None = None  # cut (or refuse) texts past this many tokens, where shorter than the model's
    role: str | None = None  # multi-vector: "query" or "document"
    prompt: str = ""  # what each text begins with that every window of it begins with too (a role's marker)
    chunk: bool | None = None  # run a text past the maximum length whole, in windows (None: the server's default)
    document_tokens: int | None = None  # ranking: each document's tokens past this many are dropped first
    instruction: str | None = None  # ranking: a causal reranker's task description (None: the manifest's)

    @property
    def size(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else len(self.texts)

    @property
    def chars(self) -> int:
        if self.token_ids is not None:
            return sum(len(ids) for ids in self.token_ids)
        return sum(len(t) if isinstance(t, str) else len(t[0]) + len(t[1]) for t in self.texts)
