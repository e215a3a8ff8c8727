"""What every task's operation has: the parameters common to all, a request as parsed once, and the two doors,
request() (the core's Job) and answer() (the task's answer, in numbers and small typed objects); render() puts an
answer in the Hugging Face Inference API's shapes (transformers' pipelines) that /predict, /, SageMaker's
/invocations and Vertex AI take."""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from infinity.engine.job import DIRECTIONS, Job
from infinity.engine.tokenization import Encoded, TextInput
from infinity.errors import ValidationError
from infinity.manifest import TaskName
from infinity.schema import Array, Boolean, Choice, Integer, Number, Object, OneOf, Refused, Schema, Text
from infinity.settings import Settings
from infinity.tasks import Task
from infinity.tasks.feature_extraction import FeatureExtraction
from infinity.tasks.multi_vector import MultiVectorEmbedding
from infinity.tasks.prompts import PromptedTask
from infinity.tasks.ranking import Ranking

if TYPE_CHECKING:
    from infinity.api.endpoint import Endpoint, Family

T = TypeVar("T", bound=Task)
P = TypeVar("P", bound="Params")


@dataclass(frozen=True)
class Params:
    """What every task's request takes, named as /predict names it: how an input past the model's length is cut,
    and whether it runs whole in windows (None: the server's --chunk-long-inputs). A task's own parameters extend
    it; their defaults are its schema's (Operation.fields), filled in by Operation.params."""
    truncate: bool
    truncation_direction: str
    chunking: bool | None


@dataclass(frozen=True)
class Parsed(Generic[P]):
    """A request's inputs, as the model reads them before the task's prompt or template, and its parameters."""
    inputs: Sequence[TextInput]
    params: P
    single: bool = False  # one input, answered as itself rather than as a list of one
    similarity: bool = False  # feature-extraction: the cosine of each input but the first with the first
    tokens: bool = False  # every token's vector, not the task's reduction of them (TEI's /embed_all)
    token_ids: list[list[int]] | None = None  # token ids in place of texts (OpenAI's input)


@dataclass(frozen=True)
class Tensors:
    """What one task takes and gives as KServe tensors (Operation.tensors)."""
    inputs: tuple[str, ...]
    required: tuple[str, ...]
    output: str
    output_shape: list[int]  # -1: the batch (or an unknown size)
    read: Callable[[dict[str, list[str]]], list[TextInput]]  # the named tensors as /predict's inputs
    answer: Callable[[Any], np.ndarray]  # the operation's answer as the output tensor
    fixed: Mapping[str, Any] = field(default_factory=dict)  # parameters /infer always runs with


@dataclass(frozen=True)
class Ranked:
    """A ranking: each text's score in the order sent, and the texts best first (the top_n of them; equal scores
    keep the order they were sent in)."""
    scores: np.ndarray
    order: list[int]
    texts: list[str] | None = None  # each text, where the request asked for them back

    def best(self) -> list[tuple[int, float]]:
        return [(i, float(self.scores[i])) for i in self.order]


@dataclass(frozen=True)
class Served:
    """What a task's own routes are built with."""
    limit: int
    vocabulary: int
    name: str
    settings: Settings


def truncation() -> dict[str, Schema]:
    return {"truncate": Boolean(default=True, description="cut inputs at the model's maximum length; "
                                                          "false answers 422 for longer inputs"),
            "truncation_direction": Choice(DIRECTIONS, default="right", case_insensitive=True,
                                           description="which end of a long input is cut")}


def texts_schema(limit: int) -> Schema:
    return OneOf((Text(), Array(Text(), max_items=limit)), "a string or a list of strings")


def one_or_many(answer: dict[str, Any]) -> dict[str, Any]:
    """The schema of a single input's answer, or of a list of them."""
    return {"oneOf": [answer, {"type": "array", "items": answer, "minItems": 1}]}


def prompt_fields(task: PromptedTask) -> dict[str, Schema]:
    """`prompt_name`, one of the model's prompts; a model without prompts refuses every name (422)."""
    prompts = tuple(task.manifest.task.prompts)
    if not prompts:
        return {"prompt_name": Refused("this model has no prompts")}
    default = f" (default: {task.default_prompt_name!r})" if task.default_prompt_name else ""
    return {"prompt_name": Choice(prompts, description=f"the model's prompt put before each text{default}")}


def selection(vocabulary: int | None) -> dict[str, Schema]:
    """Which weights a sparse answer lists: shared by /predict and /embed_sparse."""
    return {"top_k": Integer(minimum=1, maximum=vocabulary,
                             description="keep only the k largest weights of each vector"),
            "threshold": Number(minimum=0.0, default=0.0, description="keep only weights above this")}


def sparse_vector_doc() -> dict[str, Any]:
    entry = {"type": "object", "required": ["index", "value"],
             "properties": {"index": {"type": "integer", "minimum": 0,
                                      "description": "the vocabulary id (a token of the model's tokenizer)"},
                            "value": {"type": "number", "minimum": 0, "exclusiveMinimum": True}}}
    return {"type": "array", "items": entry, "description": "the non-zero weights, in vocabulary order"}


def listed(inputs: str | list[Any]) -> list[Any]:
    """One input or a list of them, as a list."""
    return [inputs] if isinstance(inputs, str) else list(inputs)


def pairs(query: str, texts: list[str]) -> list[TextInput]:
    """A ranker's inputs: the query beside each text."""
    return [(query, text) for text in texts]


class Operation(Generic[T, P]):
    """One task's API face. Every family renames its body into /predict's inputs and parameters, parses them once
    (params, read), and goes through request() and answer(); only the rendering is its own."""
    name: ClassVar[TaskName]
    params_type: ClassVar[type[Params]] = Params
    # body fields beside "parameters" that TEI and huggingface_hub send at the top level of /predict
    top_level: ClassVar[tuple[str, ...]] = ()
    # the hosted Inference API (and so huggingface_hub) wraps a single input's answer in a list of one
    nests_single_answer: ClassVar[bool] = False
    # the task's routes beyond /predict's family and those every task has, each with its family: a server of
    # another task answers them 404 naming the task that serves them (the first task listed, where two do)
    paths: ClassVar[tuple[tuple[str, Family], ...]] = ()

    def __init__(self, task: T) -> None:
        self.task = task

    def inputs(self, limit: int) -> Schema:
        """The schema of `inputs`, at most `limit` of them per request."""
        return texts_schema(limit)

    def parameters(self) -> dict[str, Schema]:
        """The task's own parameters, with their defaults (truncation, common to all, is in fields())."""
        return {}

    def fields(self) -> dict[str, Schema]:
        """Every parameter /predict takes for this model: the schema its families check and document."""
        return {**self.parameters(), **truncation()}

    @functools.cached_property
    def schema(self) -> Object:
        """fields() as one object, with their defaults filled in."""
        return Object(self.fields())

    def chunking_fields(self) -> dict[str, Schema]:
        task = self.task
        if not task.windowed:
            return {}
        return {"chunking": Boolean(description=f"run a text longer than the model's maximum length whole: "
                                                f"{task.window_rule} (default: the server's --chunk-long-inputs)")}

    def answer_doc(self) -> dict[str, Any]:
        """The JSON schema of a 200 answer of /predict."""
        raise NotImplementedError

    def params(self, values: Mapping[str, Any] | None = None) -> P:
        """Parameters named as /predict names them, checked, with the schema's default for each one absent (null
        is absent); one this model has no value for (a cross-encoder's instruction) is None."""
        given = {name: value for name, value in (values or {}).items() if value is not None}
        clean = self.schema.check(given, "parameters")
        unset = dict.fromkeys(field.name for field in dataclasses.fields(self.params_type))
        return self.params_type(**{**unset, **{name: _frozen(value)  # type: ignore[return-value]
                                               for name, value in clean.items()}})

    def read(self, inputs: Any, params: P) -> Parsed[P]:
        """Checked inputs, in /predict's shapes, as the texts (or pairs) to run."""
        return Parsed(listed(inputs), params, single=isinstance(inputs, str))

    def parse(self, inputs: Any, values: Mapping[str, Any] | None = None) -> Parsed[P]:
        return self.read(inputs, self.params(values))

    def request(self, parsed: Parsed[P]) -> Job:
        """The core request: truncation, chunking, and what the task's own parameters set (prompt, role,
        instruction)."""
        params = parsed.params
        job = Job(list(parsed.inputs), token_ids=parsed.token_ids, tokens=parsed.tokens, chunk=params.chunking,
                  truncate=params.truncate, direction=params.truncation_direction)
        return self.specific(job, params)

    def specific(self, job: Job, params: P) -> Job:
        """The job with what the task's own parameters set."""
        return job

    def answer(self, rows: np.ndarray, encoded: list[Encoded], parsed: Parsed[P]) -> Any:
        """The task's answer to the request, for every input, from the core's rows."""
        raise NotImplementedError

    def render(self, answer: Any, parsed: Parsed[P]) -> Any:
        """The answer in /predict's shape: a single input's as itself."""
        return answer[0] if parsed.single else answer

    def routes(self, at: Served) -> list[Endpoint]:
        """The task's routes beyond /predict's family (those `paths` names)."""
        return []

    def tensors(self) -> Tensors | None:
        """What KServe's /infer takes and gives for this task, where it serves it."""
        return None


def same_length(values: list[str], texts: list[str], name: str) -> list[str]:
    """A tensor that pairs with `texts`, one element each."""
    if len(values) != len(texts):
        raise ValidationError(f"{name} has {len(values)} elements and text {len(texts)}; they go in pairs")
    return values


class Doors(Protocol):
    """What a family's route calls of its task's operation: the schema, the parameters, the two doors."""
    def fields(self) -> dict[str, Schema]: ...
    def chunking_fields(self) -> dict[str, Schema]: ...
    def params(self, values: Mapping[str, Any] | None = None) -> Any: ...
    def request(self, parsed: Any) -> Job: ...
    def answer(self, rows: np.ndarray, encoded: list[Encoded], parsed: Any) -> Any: ...
    def render(self, answer: Any, parsed: Any) -> Any: ...
    def answer_doc(self) -> dict[str, Any]: ...


class Embedder(Doors, Protocol):
    """An embedding operation, as the dense routes (OpenAI, TEI, Cohere) read it."""
    @property
    def task(self) -> FeatureExtraction: ...
    def dimensions_field(self) -> Integer: ...
    def precision_field(self) -> Choice: ...
    def vector_doc(self) -> dict[str, Any]: ...
    def token_doc(self) -> dict[str, Any]: ...


class SparseEmbedder(Doors, Protocol):
    """A sparse (or hybrid) embedding operation, as TEI's /embed_sparse reads it."""
    @property
    def task(self) -> PromptedTask: ...
    def selection(self) -> dict[str, Schema]: ...


class MultiVectors(Doors, Protocol):
    @property
    def task(self) -> MultiVectorEmbedding: ...
    def role_field(self) -> Schema: ...
    def matrix_doc(self) -> dict[str, Any]: ...


class Ranker(Doors, Protocol):
    """A ranking operation, as TEI's and Cohere's rerank routes read it; its answer is a Ranked."""
    @property
    def task(self) -> Ranking: ...
    def instruction_field(self) -> dict[str, Schema]: ...


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value

