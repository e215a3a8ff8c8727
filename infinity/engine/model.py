"""A loaded artifact: manifest, tokenizer, onnxruntime session and task."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infinity.artifact import verify_checksums
from infinity.bundle import Selection
from infinity.engine.job import Job
from infinity.engine.session import Engine
from infinity.engine.tokenization import Encoded, TextInput, TextTokenizer, pad_batch
from infinity.manifest import Manifest
from infinity.settings import SPIN_WAIT_US
from infinity.tasks import Task, make_task


def artifact_tokenizer(directory: Path, manifest: Manifest) -> TextTokenizer:
    """The artifact's tokenizer, with a causal reranker's prompt around every text."""
    reranker = manifest.task.reranker
    return TextTokenizer(directory / manifest.tokenizer.file, manifest.tokenizer.max_length, manifest.tokenizer.pad_id,
                         frame=(reranker.prefix, reranker.suffix) if reranker else None)


@dataclass
class LoadedModel:
    directory: Path
    manifest: Manifest
    tokenizer: TextTokenizer
    engine: Engine
    task: Task
    bundle: Selection | None = None  # served as a bundle's target: which, among which, and why

    @classmethod
    def load(cls, directory: Path | str, threads: int | None = None, providers: list[str] | None = None,
             verify: bool = True, spin_wait: bool = True, spin_wait_us: int = SPIN_WAIT_US) -> LoadedModel:
        """The session is created on a thread of its own (onnxruntime lets go of the GIL while it maps and
        prepares the graph) while the tokenizer loads here and then, with `verify`, the files' checksums are
        computed (hashlib lets go of it too; the tokenizer does not, so it goes first)."""
        directory = Path(directory)
        manifest = Manifest.load(directory)
        with ThreadPoolExecutor(1, thread_name_prefix="infinity-load") as pool:
            engine = pool.submit(Engine, directory, manifest, threads=threads, providers=providers,
                                 spin_wait=spin_wait, spin_wait_us=spin_wait_us)
            try:
                tokenizer = artifact_tokenizer(directory, manifest)
                task = make_task(manifest, directory)
            finally:
                if verify:
                    verify_checksums(directory, manifest)  # a changed file explains whatever else failed
            return cls(directory, manifest, tokenizer, engine.result(), task)

    def encode(self, request: Job) -> list[Encoded]:
        if request.token_ids is not None:
            return self.tokenizer.from_ids(request.token_ids)
        items = self.tokenizer.encode(self.task.templated(request, self._texts(request)), truncate=request.truncate,
                                      direction=request.direction, max_length=request.max_length)
        return self.task.encoded(request, items)

    def _texts(self, request: Job) -> list[TextInput]:
        if request.document_tokens is None:
            return request.texts
        return self.tokenizer.cut_documents(request.texts, request.document_tokens)

    def windows(self, request: Job, overlap: int) -> list[list[Encoded]]:
        """Each text of the request whole, in windows of the model's maximum length (or the request's shorter one),
        each window of a long text beginning with the request's prompt."""
        texts = self._texts(request)
        if self.manifest.task.reranker is not None:
            return self._template_windows(request, texts, overlap)  # type: ignore[arg-type]  # ranking: pairs
        return self.tokenizer.windows(texts, overlap, request.max_length, request.prompt)

    def _template_windows(self, request: Job, pairs: list[tuple[str, str]], overlap: int) -> list[list[Encoded]]:
        """A causal reranker's document read in windows of what its prompt, filled in with the query, leaves of
        the maximum length: each window's text (the characters its tokens cover) goes into the template as the
        document, and a document that fits is the one window it is without chunking."""
        limit = self.tokenizer.max_length
        whole = self.tokenizer.lengths(self.task.templated(request, pairs))
        frames = self.tokenizer.lengths(self.task.templated(request, [(query, "") for query, _ in pairs]))
        rooms = [limit - frame if length > limit else length for length, frame in zip(whole, frames)]
        documents = self.tokenizer.text_windows([document for _, document in pairs], rooms, overlap)
        flat = [(query, window) for (query, _), windows in zip(pairs, documents) for window in windows]
        items = iter(self.tokenizer.encode(self.task.templated(request, flat)))
        return [[next(items) for _ in windows] for windows in documents]

    def forward(self, encoded: list[Encoded], tokens: bool = False) -> np.ndarray:
        """Engine + batch-level reduction over one padded batch; `tokens`: every token's vector instead."""
        batch = pad_batch(encoded, self.tokenizer.pad_id)
        output = self.engine.run(batch)
        return self.task.token_vectors(output) if tokens else self.task.reduce(output, batch.attention_mask)
