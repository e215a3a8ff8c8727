"""The server's engine in-process: an artifact (or a bundle) loaded once, then embeddings, rankings and labels
from Python, through the same task operations, tokenizer, batcher and engine thread as /predict, so each answer
equals /predict's bit for bit. A list of any length is sorted by length and cut into requests of
max_inputs_per_request, a few in flight at once, each batched as the server batches it; the answers come back in
the order sent.

    from infinity import Model

    with Model("artifacts/minilm") as model:
        vectors = model.embed(["first text", "second text"])  # numpy, one row per text
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from infinity.api import operation_for
from infinity.api.operations.base import Operation, Parsed, Ranked, pairs
from infinity.api.operations.feature_extraction import FeatureExtractionOperation
from infinity.api.operations.hybrid_embedding import HybridEmbeddingOperation
from infinity.api.operations.ranking import rank
from infinity.api.operations.sequence_classification import Classified
from infinity.engine.hostinfo import physical_cores
from infinity.engine.preflight import check, choose, open_checked
from infinity.engine.service import Service
from infinity.engine.tokenization import TextInput
from infinity.errors import EmptyInput, StartupError, ValidationError
from infinity.manifest import Manifest, TaskName
from infinity.schema import blank
from infinity.settings import Settings
from infinity.tasks.prompts import PromptedTask

T = TypeVar("T")
Texts = str | Sequence[str]


@dataclass(frozen=True)
class SparseVector:
    """A sparse embedding: vocabulary ids in increasing order and their weights."""
    indices: np.ndarray  # int64
    values: np.ndarray  # float32

    @classmethod
    def of(cls, entries: list[dict[str, Any]]) -> SparseVector:
        return cls(np.asarray([e["index"] for e in entries], dtype=np.int64),
                   np.asarray([e["value"] for e in entries], dtype=np.float32))


@dataclass(frozen=True)
class HybridVectors:
    """bge-m3's three embeddings of one text; a head `outputs` left out is None."""
    dense: np.ndarray | None
    sparse: SparseVector | None
    colbert: np.ndarray | None


@dataclass
class Usage:
    """What the model has run since it was loaded: texts (or pairs) and the real tokens the engine read."""
    inputs: int = 0
    tokens: int = 0


def _chars(item: TextInput) -> int:
    return len(item) if isinstance(item, str) else len(item[0]) + len(item[1])


class Model:
    """An artifact loaded for answers in-process. Keyword settings are `infinity serve`'s (Settings: max_batch_size,
    max_batch_tokens, chunk_long_inputs, ...); threads default to the physical cores, as the server's do, and
    `engines=N` runs N batches at once on threads / N each: more throughput for a long list, more time for one text.
    Every call has a sync form and an async one (`a` + its name), which awaits on any event loop."""

    def __init__(self, artifact: str | Path, threads: int | None = None, **settings: Any) -> None:
        try:
            base = Settings(**settings)
            self.settings = dataclasses.replace(base, threads=threads or base.threads or physical_cores())
        except (TypeError, ValueError) as exc:
            raise ValueError(f"infinity.Model: {exc}") from None
        try:
            directory, selection = choose(Path(artifact), self.settings)
            check(directory, self.settings, selection)
            loaded = open_checked(directory, self.settings, self.settings.threads or 1)
        except StartupError as exc:
            raise ValueError(str(exc)) from None
        loaded.bundle = selection
        if isinstance(loaded.task, PromptedTask) and self.settings.default_prompt_name is not None:
            loaded.task.use_default_prompt(self.settings.default_prompt_name)
        self.manifest: Manifest = loaded.manifest
        self.directory = directory
        self.task = TaskName(loaded.task.name)
        self.operation: Operation[Any, Any] = operation_for(loaded.task)
        self.usage = Usage()
        self._service: Service | None = Service(loaded, self.settings)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="infinity-model", daemon=True)
        self._thread.start()
        self._call(self._service.start())
        # requests of max_inputs_per_request queued at once: enough to keep the engine busy while the next is
        # tokenized, within the batcher's queue
        parts = math.ceil(self.settings.max_inputs_per_request / self.settings.max_batch_size)
        self._in_flight = max(1, min(4, self.settings.max_queue // parts))

    # --- lifetime ----------------------------------------------------------------------------------------------

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the engine thread and free the session; the model answers nothing after."""
        service, self._service = self._service, None
        if service is None:
            return
        asyncio.run_coroutine_threadsafe(service.close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        service.workers.shutdown(wait=True)
        del service

    def __repr__(self) -> str:
        engines = f", {self.settings.engines} engines" if self.settings.engines > 1 else ""
        state = "closed" if self._service is None else f"{self.settings.threads} threads{engines}"
        return f"Model({str(self.directory)!r}, {self.task.value}, target {self.manifest.target.name}, {state})"

    # --- embeddings ----------------------------------------------------------------------------------------------

    def embed(self, texts: Texts, *, normalize: bool | None = None, dimensions: int | None = None,
              precision: str | None = None, prompt_name: str | None = None, chunking: bool | None = None,
              truncate: bool | None = None, truncation_direction: str | None = None) -> np.ndarray:
        """Dense vectors, one row per text (a single text: its vector), as /predict answers them."""
        return self._call(self._embed(texts, dict(
            normalize=normalize, dimensions=dimensions, precision=precision, prompt_name=prompt_name,
            chunking=chunking, truncate=truncate, truncation_direction=truncation_direction)))

    async def aembed(self, texts: Texts, **params: Any) -> np.ndarray:
        return await self._await(self._embed(texts, params))

    async def _embed(self, texts: Texts, values: dict[str, Any]) -> np.ndarray:
        self._serves(TaskName.FEATURE_EXTRACTION, TaskName.HYBRID_EMBEDDING, what="embed")
        operation = FeatureExtractionOperation(self.operation.task)  # a hybrid model's dense head
        vectors: np.ndarray = await self._answers(operation, texts, values, lambda answer: answer)
        return vectors

    def embed_sparse(self, texts: Texts, *, top_k: int | None = None, threshold: float | None = None,
                     prompt_name: str | None = None, chunking: bool | None = None, truncate: bool | None = None,
                     truncation_direction: str | None = None) -> Any:
        """Sparse vectors (SparseVector), one per text, as /predict (or a hybrid model's /embed_sparse) answers."""
        return self._call(self._sparse(texts, dict(
            top_k=top_k, threshold=threshold, prompt_name=prompt_name, chunking=chunking, truncate=truncate,
            truncation_direction=truncation_direction)))

    async def aembed_sparse(self, texts: Texts, **params: Any) -> Any:
        return await self._await(self._sparse(texts, params))

    async def _sparse(self, texts: Texts, values: dict[str, Any]) -> Any:
        self._serves(TaskName.SPARSE_EMBEDDING, TaskName.HYBRID_EMBEDDING, what="embed_sparse")
        if self.task is TaskName.HYBRID_EMBEDDING:
            values = {**values, "outputs": ["sparse"]}
            return await self._answers(self.operation, texts, values,
                                       lambda answer: [SparseVector.of(each["sparse"]) for each in answer])
        return await self._answers(self.operation, texts, values, lambda answer: [SparseVector.of(e) for e in answer])

    def embed_tokens(self, texts: Texts, *, input_type: str | None = None, chunking: bool | None = None,
                     truncate: bool | None = None, truncation_direction: str | None = None) -> Any:
        """A multi-vector model's token vectors (one array per text) for the role `input_type` names."""
        return self._call(self._tokens(texts, dict(input_type=input_type, chunking=chunking, truncate=truncate,
                                                     truncation_direction=truncation_direction)))

    async def aembed_tokens(self, texts: Texts, **params: Any) -> Any:
        return await self._await(self._tokens(texts, params))

    async def _tokens(self, texts: Texts, values: dict[str, Any]) -> Any:
        self._serves(TaskName.MULTI_VECTOR, what="embed_tokens")
        return await self._answers(self.operation, texts, values, lambda answer: list(answer))

    def embed_hybrid(self, texts: Texts, *, outputs: Sequence[str] | None = None, **params: Any) -> Any:
        """bge-m3's heads (HybridVectors), one per text; `params` are embed's and embed_sparse's."""
        return self._call(self._hybrid(texts, dict(outputs=list(outputs) if outputs else None, **params)))

    async def aembed_hybrid(self, texts: Texts, **params: Any) -> Any:
        return await self._await(self._hybrid(texts, params))

    async def _hybrid(self, texts: Texts, values: dict[str, Any]) -> Any:
        self._serves(TaskName.HYBRID_EMBEDDING, what="embed_hybrid")
        assert isinstance(self.operation, HybridEmbeddingOperation)

        def typed(answer: list[dict[str, Any]]) -> list[HybridVectors]:
            return [HybridVectors(each.get("dense"), SparseVector.of(each["sparse"]) if "sparse" in each else None,
                                  each.get("colbert")) for each in answer]

        return await self._answers(self.operation, texts, values, typed)

    # --- ranking and classification ------------------------------------------------------------------------------

    def rerank(self, query: str, texts: Sequence[str], *, top_n: int | None = None, return_text: bool | None = None,
               raw_scores: bool | None = None, instruction: str | None = None,
               max_tokens_per_doc: int | None = None, chunking: bool | None = None, truncate: bool | None = None,
               truncation_direction: str | None = None) -> Ranked:
        """Each text's score against the query (Ranked: scores in the order sent, `order` best first)."""
        return self._call(self._rerank(query, texts, dict(
            top_n=top_n, return_text=return_text, raw_scores=raw_scores, instruction=instruction,
            max_tokens_per_doc=max_tokens_per_doc, chunking=chunking, truncate=truncate,
            truncation_direction=truncation_direction)))

    async def arerank(self, query: str, texts: Sequence[str], **params: Any) -> Ranked:
        return await self._await(self._rerank(query, texts, params))

    async def _rerank(self, query: str, texts: Sequence[str], values: dict[str, Any]) -> Ranked:
        self._serves(TaskName.RANKING, what="rerank")
        if isinstance(texts, str) or not texts:
            raise ValidationError("rerank takes a query and a non-empty list of texts")
        params = self.operation.params(values)
        # every text's score first, then one ranking of them all: top_n and the order are the whole list's
        whole = dataclasses.replace(params, top_n=None, return_text=False)
        scores = await self._run(self.operation, pairs(query, list(texts)), whole, lambda answer: answer.scores)
        return rank(scores, params.top_n, list(texts) if params.return_text else None)

    def classify(self, texts: str | tuple[str, str] | Sequence[str | tuple[str, str]], *, top_k: int | None = None,
                 function_to_apply: str | None = None, raw_scores: bool | None = None, truncate: bool | None = None,
                 truncation_direction: str | None = None) -> Classified:
        """Each text's (or (text, text_pair)'s) score for every label (Classified: .scores, .labels, .best())."""
        return self._call(self._classify(texts, dict(
            top_k=top_k, function_to_apply=function_to_apply, raw_scores=raw_scores, truncate=truncate,
            truncation_direction=truncation_direction)))

    async def aclassify(self, texts: Any, **params: Any) -> Classified:
        return await self._await(self._classify(texts, params))

    async def _classify(self, texts: Any, values: dict[str, Any]) -> Classified:
        self._serves(TaskName.SEQUENCE_CLASSIFICATION, what="classify")
        single = isinstance(texts, (str, tuple))
        items = [texts] if single else list(texts)
        params = self.operation.params(values)
        scores = await self._run(self.operation, items, params, lambda answer: answer.scores)
        labels = self.operation.task.label_names(scores.shape[-1])
        return Classified(scores, labels, params.top_k)

    def tag(self, texts: Texts, *, aggregation_strategy: str | None = None,
            ignore_labels: Sequence[str] | None = None, truncate: bool | None = None,
            truncation_direction: str | None = None) -> Any:
        """A token classifier's entities of each text, as transformers' pipeline groups them."""
        return self._call(self._tag(texts, dict(
            aggregation_strategy=aggregation_strategy, truncate=truncate, truncation_direction=truncation_direction,
            ignore_labels=list(ignore_labels) if ignore_labels is not None else None)))

    async def atag(self, texts: Texts, **params: Any) -> Any:
        return await self._await(self._tag(texts, params))

    async def _tag(self, texts: Texts, values: dict[str, Any]) -> Any:
        self._serves(TaskName.TOKEN_CLASSIFICATION, what="tag")
        return await self._answers(self.operation, texts, values, lambda answer: list(answer))

    # --- the one path every call takes ---------------------------------------------------------------------------

    def _serves(self, *tasks: TaskName, what: str) -> None:
        if self._service is None:
            raise RuntimeError("this Model is closed")
        if self.task not in tasks:
            raise ValidationError(f"{what} needs a {' or '.join(t.value for t in tasks)} model; "
                                  f"this artifact serves {self.task.value}")

    async def _answers(self, operation: Operation[Any, Any], texts: Texts, values: dict[str, Any],
                       items: Callable[[Any], Any]) -> Any:
        """A call's answer: one for a single text, else one per text in the order sent."""
        single = isinstance(texts, str)
        listed: list[TextInput] = [texts] if isinstance(texts, str) else list(texts)
        answer = await self._run(operation, listed, operation.params(values), items)
        return answer[0] if single else answer

    async def _run(self, operation: Operation[Any, Any], inputs: list[TextInput], params: Any,
                   items: Callable[[Any], Any]) -> Any:
        """Every input's answer, in order: the inputs sorted by length, run as requests of max_inputs_per_request
        (each answered through the operation, then `items` gives its answers per input: an array's rows or a
        list's entries), a few in flight at once."""
        if not inputs:
            raise EmptyInput("no inputs")
        for index, item in enumerate(inputs):
            texts = item if isinstance(item, tuple) else (item,)
            if not all(isinstance(text, str) for text in texts) or len(texts) not in (1, 2):
                raise ValidationError(f"input {index} is not a text or a (text, text_pair) tuple: {item!r:.60}")
            if any(blank(text) for text in texts):
                raise EmptyInput(f"input {index} is empty")
        service = self._service
        assert service is not None
        order = sorted(range(len(inputs)), key=lambda i: _chars(inputs[i]))
        size = self.settings.max_inputs_per_request
        slots: list[Any] = [None] * len(inputs)
        dense: np.ndarray | None = None
        gate = asyncio.Semaphore(self._in_flight)

        async def one(indices: list[int]) -> None:
            nonlocal dense
            async with gate:
                parsed = Parsed([inputs[i] for i in indices], params)
                result = await service.run(operation.request(parsed))
                answer = items(await service.offload(operation.answer, result.rows, result.encoded, parsed,
                                                     small=False))
            self.usage.inputs += len(indices)
            self.usage.tokens += result.tokens
            if isinstance(answer, np.ndarray):
                if dense is None:
                    dense = np.empty((len(inputs), *answer.shape[1:]), dtype=answer.dtype)
                dense[indices] = answer
            else:
                for index, item in zip(indices, answer):
                    slots[index] = item

        await asyncio.gather(*(one(order[start:start + size]) for start in range(0, len(order), size)))
        return dense if dense is not None else slots

    def _call(self, work: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a Model's sync calls cannot run on its own event loop")
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    async def _await(self, work: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))


__all__ = ["Classified", "HybridVectors", "Model", "Ranked", "SparseVector", "Usage"]
