"""Each task's operation, the API side of the task: the body fields every family shares, the one place its core
request is built, and its answer with the answer's schema, in the Hugging Face Inference API's shapes
(transformers' pipelines) that /predict, /, SageMaker's /invocations, Vertex AI's instances and KServe's parameters
take. The other families rename their bodies into these fields and render the answer in their own shapes."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from infinity.engine.tokenization import Encoded, TextInput
from infinity.manifest import ROLES
from infinity.schema import Array, Boolean, Choice, Integer, Number, Object, OneOf, Refused, Schema, Text
from infinity.tasks import Job, Task
from infinity.tasks.feature_extraction import PRECISIONS, FeatureExtraction
from infinity.tasks.hybrid_embedding import HEADS, HybridEmbedding
from infinity.tasks.multi_vector import DOCUMENT, MultiVectorEmbedding
from infinity.tasks.prompts import PromptedTask
from infinity.tasks.ranking import Ranking
from infinity.tasks.sequence_classification import SequenceClassification
from infinity.tasks.sparse_embedding import SparseEmbedding
from infinity.tasks.token_classification import STRATEGIES, TokenClassification, entities_for

T = TypeVar("T", bound=Task)


@dataclass
class Parsed:
    """A /predict body's inputs, as the model reads them before the task's prompt or template, and what the answer
    needs of its parameters."""
    inputs: list[TextInput]
    options: dict[str, Any]
    single: bool


def texts_schema(limit: int) -> Schema:
    return OneOf((Text(), Array(Text(), max_items=limit)), "a string or a list of strings")


def one_or_many(answer: dict[str, Any]) -> dict[str, Any]:
    """The schema of a single input's answer, or of a list of them."""
    return {"oneOf": [answer, {"type": "array", "items": answer, "minItems": 1}]}


PRECISION_HELP = ("float; int8 or uint8 (each dimension in 256 steps over the range the optimizer calibrated on the "
                  "full vectors; with dimensions, the first N steps); binary or ubinary (one sign bit per "
                  "dimension, packed 8 to a byte): sentence-transformers' quantize_embeddings. Sentence-similarity "
                  "answers cosines of the float vectors")


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


class Operation(Generic[T]):
    """One task's /predict, and the one place its core request is built: every API family renames its body into
    /predict's inputs and parameters and calls request()."""
    # body fields beside "parameters" that TEI and huggingface_hub send at the top level of /predict
    top_level: tuple[str, ...] = ()
    # the hosted Inference API (and so huggingface_hub) wraps a single input's answer in a list of one
    nests_single_answer: bool = False

    def __init__(self, task: T) -> None:
        self.task = task

    def inputs(self, limit: int) -> Schema:
        """The schema of `inputs`, at most `limit` of them per request."""
        return texts_schema(limit)

    def parameters(self) -> dict[str, Schema]:
        """The task's own `parameters` (truncation is common to all and added by the route)."""
        return {}

    def chunking_fields(self) -> dict[str, Schema]:
        task = self.task
        if not task.windowed:
            return {}
        return {"chunking": Boolean(description=f"run a text longer than the model's maximum length whole: "
                                                f"{task.window_rule} (default: the server's --chunk-long-inputs)")}

    def answer_doc(self) -> dict[str, Any]:
        """The JSON schema of a 200 answer."""
        raise NotImplementedError

    def parse(self, inputs: Any, params: dict[str, Any]) -> Parsed:
        """Checked inputs and parameters -> the texts (or pairs) to run and the answer's options; params lack the
        keys the client left out."""
        return Parsed(listed(inputs), {}, isinstance(inputs, str))

    def request(self, inputs: Sequence[TextInput], params: Mapping[str, Any], token_ids: list[list[int]] | None = None,
                tokens: bool = False) -> Job:
        """The core request for texts (or pairs, or token ids) under /predict's parameters, their defaults where
        params lack them: truncation, chunking, and the task's own (prompt, role, instruction)."""
        request = Job(list(inputs), token_ids=token_ids, tokens=tokens, chunk=params.get("chunking"),
                          truncate=params.get("truncate", True),
                          direction=params.get("truncation_direction", "right"))
        return self.specific(request, params)

    def specific(self, request: Job, params: Mapping[str, Any]) -> Job:
        """The request with what the task's own parameters set."""
        return request

    def respond(self, rows: np.ndarray, parsed: Parsed, encoded: list[Encoded]) -> Any:
        raise NotImplementedError


class FeatureExtractionOperation(Operation[FeatureExtraction]):
    top_level: tuple[str, ...] = ("normalize", "dimensions", "prompt_name", "precision", "chunking")

    def inputs(self, limit: int) -> Schema:
        similarity = Object({"source_sentence": Text(), "sentences": Array(Text(), max_items=limit - 1)},
                            required=("source_sentence", "sentences"),
                            description="sentence-similarity: cosine of each sentence with source_sentence")
        return OneOf((Text(), Array(Text(), max_items=limit), similarity),
                     'a string, a list of strings, or {"source_sentence": str, "sentences": [str, ...]}')

    def parameters(self) -> dict[str, Schema]:
        return {"normalize": Boolean(default=self.task.manifest.task.normalize,
                                     description="scale each vector to unit length"),
                "dimensions": self.dimensions_field(), "precision": self.precision_field(),
                **prompt_fields(self.task), **self.chunking_fields()}

    def dimensions_field(self) -> Integer:
        return Integer(minimum=1, maximum=self.task.dim,
                       description="keep the first N dimensions (Matryoshka), then normalize")

    def precision_field(self) -> Choice:
        return Choice(PRECISIONS, default="float", description=PRECISION_HELP)

    def vector_doc(self) -> dict[str, Any]:
        """One embedding: `dimensions` shortens it, so its length is a range."""
        vector: dict[str, Any] = {"type": "array", "items": {"type": "number"}, "minItems": 1}
        if self.task.dim:
            vector["maxItems"] = self.task.dim
        return vector

    def token_doc(self) -> dict[str, Any]:
        return {"type": "array", "items": {"type": "array", "items": {"type": "number"}, "minItems": 1},
                "description": "one vector per token, the special tokens included"}

    def answer_doc(self) -> dict[str, Any]:
        # A single text's vector and sentence-similarity's cosines are both lists of numbers, so they share one arm
        # (two arms that match the same answer fail oneOf).
        numbers = {"type": "array", "items": {"type": "number"}, "minItems": 1,
                   "description": "a single text's vector, or for sentence-similarity the cosine of each sentence "
                                  "with source_sentence"}
        return {"oneOf": [numbers, {"type": "array", "items": self.vector_doc(), "minItems": 1}]}

    def parse(self, inputs: Any, params: dict[str, Any]) -> Parsed:
        options = {"normalize": params.get("normalize", self.task.manifest.task.normalize),
                   "dimensions": params.get("dimensions"), "similarity": isinstance(inputs, dict),
                   "precision": params.get("precision", "float")}
        if options["similarity"]:
            return Parsed([inputs["source_sentence"], *inputs["sentences"]], options, single=False)
        return Parsed(listed(inputs), options, isinstance(inputs, str))

    def specific(self, request: Job, params: Mapping[str, Any]) -> Job:
        self.task.check_precision([params.get("precision", "float")])
        return self.task.prompted(request, params.get("prompt_name"))

    def vectors(self, rows: np.ndarray, params: Mapping[str, Any]) -> np.ndarray:
        """The vectors the parameters ask for: cut to `dimensions`, normalized (the model's default), at
        `precision`."""
        return self.task.answer_vectors(rows, params.get("precision", "float"),
                                        params.get("normalize", self.task.manifest.task.normalize),
                                        params.get("dimensions"))

    def respond(self, rows: np.ndarray, parsed: Parsed, encoded: list[Encoded]) -> Any:
        options = parsed.options
        if options["similarity"]:
            vectors = self.task.embed(rows, True, options["dimensions"])
            return vectors[1:] @ vectors[0]
        vectors = self.vectors(rows, options)
        return vectors[0] if parsed.single else vectors


class HybridEmbeddingOperation(FeatureExtractionOperation):
    """The dense answer as feature-extraction gives it, beside the sparse and ColBERT ones `outputs` names."""
    task: HybridEmbedding
    top_level = (*FeatureExtractionOperation.top_level, "outputs", "top_k", "threshold")

    def inputs(self, limit: int) -> Schema:
        return texts_schema(limit)  # no sentence-similarity

    def parameters(self) -> dict[str, Schema]:
        return {"outputs": Array(Choice(HEADS), max_items=len(HEADS), default=list(HEADS),
                                 description="which embeddings each answer holds"),
                **super().parameters(), **self.selection()}

    def selection(self) -> dict[str, Schema]:
        return selection(None)

    def token_doc(self) -> dict[str, Any]:
        width = self.task.layout.colbert_dim
        vector = {"type": "array", "items": {"type": "number"}, "minItems": width, "maxItems": width}
        return {"type": "array", "items": vector, "description": "one ColBERT vector per token but the first"}

    def answer_doc(self) -> dict[str, Any]:
        one = {"type": "object", "properties": {"dense": self.vector_doc(), "sparse": sparse_vector_doc(),
                                                "colbert": self.token_doc()},
               "description": "the embeddings `outputs` names"}
        return one_or_many(one)

    def parse(self, inputs: Any, params: dict[str, Any]) -> Parsed:
        parsed = super().parse(inputs, params)
        parsed.options.update(outputs=params.get("outputs", list(HEADS)), threshold=params.get("threshold", 0.0),
                              top_k=params.get("top_k"))
        return parsed

    def respond(self, rows: np.ndarray, parsed: Parsed, encoded: list[Encoded]) -> Any:
        task, params, heads = self.task, parsed.options, parsed.options["outputs"]
        by_head: dict[str, Any] = {}
        if "dense" in heads:
            by_head["dense"] = self.vectors(rows, params)
        if "sparse" in heads:
            by_head["sparse"] = task.sparse_answers(rows, encoded, params["threshold"], params["top_k"])
        if "colbert" in heads:
            by_head["colbert"] = task.token_answers(rows, encoded)
        answers = [dict(zip(by_head, values)) for values in zip(*by_head.values())]
        return answers[0] if parsed.single else answers


class SparseEmbeddingOperation(Operation[SparseEmbedding]):
    top_level = ("top_k", "threshold", "prompt_name")

    def parameters(self) -> dict[str, Schema]:
        return {**self.selection(), **prompt_fields(self.task), **self.chunking_fields()}

    def selection(self) -> dict[str, Schema]:
        return selection(self.task.manifest.task.embedding_dim)

    def answer_doc(self) -> dict[str, Any]:
        return one_or_many(sparse_vector_doc())

    def parse(self, inputs: Any, params: dict[str, Any]) -> Parsed:
        options = {"threshold": params.get("threshold", 0.0), "top_k": params.get("top_k")}
        return Parsed(listed(inputs), options, isinstance(inputs, str))

    def specific(self, request: Job, params: Mapping[str, Any]) -> Job:
        return self.task.prompted(request, params.get("prompt_name"))

    def respond(self, rows: np.ndarray, parsed: Parsed, encoded: list[Encoded]) -> Any:
        vectors = self.task.sparse_answers(rows, encoded, parsed.options["threshold"], parsed.options["top_k"])
        return vectors[0] if parsed.single else vectors


class MultiVectorOperation(Operation[MultiVectorEmbedding]):
    top_level = ("input_type", "chunking")

    def parameters(self) -> dict[str, Schema]:
        return {"input_type": self.role_field(), **self.chunking_fields()}

    def role_field(self) -> Schema:
        return Choice(ROLES, default=DOCUMENT,
                      description="query or document: each gets the model's own prompt and length, a query its "
                                  "expansion, a document its skiplist")

    def matrix_doc(self) -> dict[str, Any]:
        vector: dict[str, Any] = {"type": "array", "items": {"type": "number"}}
        if self.task.manifest.task.embedding_dim:
            vector["minItems"] = vector["maxItems"] = self.task.manifest.task.embedding_dim
        return {"type": "array", "items": vector, "description": "one vector per token the model scores"}

    def answer_doc(self) -> dict[str, Any]:
        return one_or_many(self.matrix_doc())

    def parse(self, inputs: Any, params: dict[str, Any]) -> Parsed:
        return Parsed(listed(inputs), {"input_type": params.get("input_type", DOCUMENT)}, isinstance(inputs, str))

    def specific(self, request: Job, params: Mapping[str, Any]) -> Job:
        return self.task.in_role(request, params.get("input_type", DOCUMENT))

    def respond(self, rows: np.ndarray, parsed: Parsed, encoded: list[Encoded]) -> Any:
        vectors = self.task.vectors(rows, encoded, parsed.options["input_type"])
        return vectors[0] if parsed.single else vectors


class RankingOperation(Operation[Ranking]):
    top_level = ("raw_scores", "chunking")

    def inputs(self, limit: int) -> Schema:
        return Object({"query": Text(), "texts": Array(Text(), max_items=limit)}, required=("query", "texts"))

    def parameters(self) -> dict[str, Schema]:
        return {"top_n": Integer(minimum=1, description="answer only the N best texts"),
                "return_text": Boolean(default=False), "raw_scores": Boolean(default=False),
                **self.instruction_field(), **self.chunking_fields()}

    def instruction_field(self) -> dict[str, Schema]:
        """A causal reranker's task description, in place of the manifest's for one request; others take none."""
        reranker = self.task.manifest.task.reranker
        if reranker is None:
            return {}
        return {"instruction": Text(description=f"what relevance means here (default: {reranker.instruction!r})")}

    def answer_doc(self) -> dict[str, Any]:
        """The JSON schema of ranking()."""
        ranked = {"type": "object", "required": ["index", "score"],
                  "properties": {"index": {"type": "integer"}, "score": {"type": "number"},
                                 "text": {"type": "string"}}}
        return {"type": "array", "items": ranked}

    def ranking(self, rows: np.ndarray, texts: list[str], raw: bool, top_n: int | None,
                return_text: bool) -> list[dict[str, Any]]:
        """The ranking in the shape /predict and TEI's /rerank answer."""
        return [{"index": i, "score": score, **({"text": texts[i]} if return_text else {})}
                for i, score in self.task.ranked(rows, raw, top_n)]

    def parse(self, inputs: Any, params: dict[str, Any]) -> Parsed:
        options = {"top_n": params.get("top_n"), "return_text": params.get("return_text", False),
                   "raw_scores": params.get("raw_scores", False), "texts": inputs["texts"]}
        return Parsed(pairs(inputs["query"], inputs["texts"]), options, single=False)

    def specific(self, request: Job, params: Mapping[str, Any]) -> Job:
        request.instruction, request.document_tokens = params.get("instruction"), params.get("max_tokens_per_doc")
        return request

    def respond(self, rows: np.ndarray, parsed: Parsed, encoded: list[Encoded]) -> Any:
        options = parsed.options
        return self.ranking(rows, options["texts"], options["raw_scores"], options["top_n"], options["return_text"])


def pairs(query: str, texts: list[str]) -> list[TextInput]:
    """A ranker's inputs: the query beside each text."""
    return [(query, text) for text in texts]


FUNCTIONS = ("softmax", "sigmoid", "none")
PAIR = Object({"text": Text(), "text_pair": Text()}, required=("text",), description="a text, or a text pair")
TEI_PAIR = Array(Text(), length=2, description="[text, text_pair], as TEI's /predict takes a pair in a batch")


def _text(item: Any) -> TextInput:
    if isinstance(item, dict):
        return (item["text"], item["text_pair"]) if "text_pair" in item else item["text"]
    if isinstance(item, list):
        return (item[0], item[1])
    return str(item)


class SequenceClassificationOperation(Operation[SequenceClassification]):
    top_level = ("raw_scores",)
    nests_single_answer = True

    def inputs(self, limit: int) -> Schema:
        batch = Array(OneOf((Text(), PAIR, TEI_PAIR), 'a string, {"text", "text_pair"} or [text, text_pair]'),
                      max_items=limit)
        return OneOf((Text(), PAIR, batch), 'a string, {"text": str, "text_pair": str}, or a list of those')

    def parameters(self) -> dict[str, Schema]:
        return {"top_k": Integer(minimum=1, description="answer only the K most likely labels per input"),
                "function_to_apply": Choice(FUNCTIONS, default=self.task.default_function),
                "raw_scores": Boolean(default=False, description="same as function_to_apply=none (TEI)")}

    def answer_doc(self) -> dict[str, Any]:
        labels = {"type": "array", "items": {"type": "object", "required": ["label", "score"],
                                             "properties": {"label": {"type": "string"},
                                                            "score": {"type": "number"}}}}
        return {"oneOf": [labels, {"type": "array", "items": labels}]}

    def function(self, params: dict[str, Any]) -> str:
        """The function applied to the logits, as the parameters name it."""
        return "none" if params.get("raw_scores") else params.get("function_to_apply", self.task.default_function)

    def parse(self, inputs: Any, params: dict[str, Any]) -> Parsed:
        options = {"top_k": params.get("top_k"), "function_to_apply": self.function(params)}
        if isinstance(inputs, list):
            return Parsed([_text(item) for item in inputs], options, single=False)
        return Parsed([_text(inputs)], options, single=True)

    def respond(self, rows: np.ndarray, parsed: Parsed, encoded: list[Encoded]) -> Any:
        results = self.task.labelled(rows, parsed.options["function_to_apply"], parsed.options["top_k"])
        return results[0] if parsed.single else results


class TokenClassificationOperation(Operation[TokenClassification]):
    def parameters(self) -> dict[str, Schema]:
        return {"aggregation_strategy": Choice(STRATEGIES, default="simple", case_insensitive=True),
                "ignore_labels": Array(Text(allow_blank=True), min_items=0, default=["O"])}

    def answer_doc(self) -> dict[str, Any]:
        def entity(grouped: bool) -> dict[str, Any]:
            properties: dict[str, Any] = {"score": {"type": "number"}, "word": {"type": "string"},
                                          "start": {"type": "integer"}, "end": {"type": "integer"}}
            if grouped:
                properties["entity_group"] = {"type": "string"}
            else:
                properties.update(entity={"type": "string"}, index={"type": "integer"})
            return {"type": "object", "properties": properties, "required": list(properties),
                    "additionalProperties": False}

        entities = {"type": "array", "items": {"oneOf": [entity(True), entity(False)]}}
        # anyOf: a single text with no entities answers [], which is also an empty list of lists
        return {"anyOf": [entities, {"type": "array", "items": entities}]}

    def parse(self, inputs: Any, params: dict[str, Any]) -> Parsed:
        options = {"aggregation_strategy": params.get("aggregation_strategy", "simple"),
                   "ignore_labels": params.get("ignore_labels", ["O"])}
        return Parsed(listed(inputs), options, isinstance(inputs, str))

    def respond(self, rows: np.ndarray, parsed: Parsed, encoded: list[Encoded]) -> Any:
        task = self.task
        labels = {i: task.labels.get(i, f"LABEL_{i}") for i in range(rows.shape[-1])}
        results = [entities_for(str(text), probs, enc, labels, parsed.options["aggregation_strategy"],
                                parsed.options["ignore_labels"], task.vocabulary)
                   for probs, enc, text in zip(rows, encoded, parsed.inputs)]
        return results[0] if parsed.single else results


OPERATIONS: dict[str, type[Operation[Any]]] = {
    FeatureExtraction.name: FeatureExtractionOperation, HybridEmbedding.name: HybridEmbeddingOperation,
    SparseEmbedding.name: SparseEmbeddingOperation, MultiVectorEmbedding.name: MultiVectorOperation,
    Ranking.name: RankingOperation, SequenceClassification.name: SequenceClassificationOperation,
    TokenClassification.name: TokenClassificationOperation,
}


def operation_for(task: Task) -> Operation[Any]:
    return OPERATIONS[task.name](task)
