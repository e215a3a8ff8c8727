"""What each task is to the optimizer, in one object: the facts its model directory gives the manifest, the PyTorch
model its graph is exported from, the original it is measured against, the texts it runs on, and how its answers
are compared. A task is one module of this package and one entry of the registry in __init__.py."""
from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from infinity.engine.tokenization import Encoded, TextInput
from infinity.manifest import TaskFacts, TaskName
from optimize.checkpoint import Checkpoint, Module
from optimize.measure import agreement, texts
from optimize.measure.agreement import Outputs

if TYPE_CHECKING:
    from torch import Tensor



class UnsupportedModel(ValueError):
    """The model cannot be exported for this task; the message is the one line the user sees."""


@dataclass
class SourceModel:
    """A model directory loaded for its task: what the stages pass on."""
    path: Path
    task: OptimizerTask  # the task object, its name at .name
    config: Any              # transformers PretrainedConfig
    tokenizer: Any           # transformers fast tokenizer
    facts: TaskFacts
    max_length: int
    sentence_transformers: bool
    model_id: str | None = None  # the hub id, where known
    head: list[Module] = field(default_factory=list)  # modules after pooling that the graph includes
    trust_remote_code: bool = False  # the model's own code (config.json's auto_map) is what runs

    @property
    def model_type(self) -> str:
        return str(self.config.model_type)


class CheckedLoadReport(logging.Filter):
    """transformers' load report, left to what load_model does not check: the weights a checkpoint lacks or holds
    in other shapes are refused there in one line, and what else the report lists (a base model's pooler, which no
    embedding graph reads; checkpoint keys the model does not use) needs nothing from the user. A report on failed
    conversions, which transformers raises on next, still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "LOAD REPORT" not in message or "CONVERSION" in message


CHECKED_LOAD_REPORT = CheckedLoadReport()  # one instance: adding it again to a logger adds nothing


class OptimizerTask:
    name: ClassVar[TaskName]
    texts: ClassVar[texts.Kind] = "singles"  # what an input is: a text, a pair (ranking), or either
    metrics: ClassVar[tuple[str, ...]]       # what parity measures, in the order the manifest lists them
    thresholds: ClassVar[dict[str, float]]   # the defaults each metric is held to (at least this)
    continuous: ClassVar[bool] = False       # answers are vectors: a search ranks its texts by their distance
    auto_model: ClassVar[str] = "AutoModel"  # the transformers class the graph is exported from
    takes_pooling: ClassVar[bool] = False    # --pooling applies
    ranges: ClassVar[bool] = False           # the manifest records the answers' ranges (int8 and uint8 answers)

    # load

    def facts(self, checkpoint: Checkpoint, pooling: str | None,
              reranker: str | dict[str, str] | None) -> tuple[TaskFacts, list[Module]]:
        """What the manifest records of the model for this task, and the modules after pooling its graph runs."""
        raise NotImplementedError

    def model_class(self, source: SourceModel) -> Any:
        import transformers

        return getattr(transformers, self.auto_model)

    def refuse_missing(self, source: SourceModel, missing: str) -> None:
        """A checkpoint without the weights this task reads is refused here in one line (`missing`: the first
        few keys): transformers would start them from random values."""

    # export

    def graph(self, model: Any, source: SourceModel) -> tuple[Any, str]:
        """(a torch module (attention mask, inputs) -> the graph's output, or None for the model's own output;
        that output's name)."""
        return None, "logits"

    def per_token_output(self, source: SourceModel) -> bool:
        """The graph's output keeps a sequence axis (a vector per token), rather than one row per input."""
        return False

    # reference and parity

    def reference(self, source: SourceModel, inputs: list[TextInput]) -> Outputs:
        """The original's answers, PyTorch FP32, as the library its users run it with computes them."""
        raise NotImplementedError

    def reference_name(self, source: SourceModel) -> str:
        raise NotImplementedError

    def measure(self, reference: Outputs, candidate: Outputs, inputs: list[TextInput]) -> dict[str, float]:
        raise NotImplementedError

    def vectors(self, answers: Outputs) -> list[np.ndarray]:
        """The answers as vectors, for ranking a search's texts and for the cosine an answer keeps alone and
        batched (continuous tasks)."""
        return list(answers)

    def rows(self, vectors: list[np.ndarray]) -> np.ndarray:
        """The vectors as rows of one matrix (a multi-vector answer's rows are its tokens')."""
        return np.stack(vectors)

    def moved(self, alone: Any, batched: Any) -> float:
        """How far an answer moved between alone and batched."""
        if np.shape(alone) != np.shape(batched):  # a sparse answer with other ids
            return np.inf
        return float(np.abs(np.asarray(alone, np.float64) - np.asarray(batched, np.float64)).max(initial=0.0))

    def served_values(self, answer: Any, row: np.ndarray, item: Encoded) -> Any:
        """The numbers parity compares, from the operation's answer to one row of a served batch (a request with
        every default; `row` and `item` are that row and its tokens): a classifier's scores."""
        return answer.scores[0].astype(np.float32)

    def notes(self, source: SourceModel) -> list[str]:
        """What the artifact does for this model that a reader of the manifest should know."""
        return []

    # texts

    def probes(self) -> list[TextInput]:
        return texts.probe_inputs(self.texts)

    def calibration(self) -> list[TextInput]:
        return texts.calibration_inputs(self.texts)

    def heldout(self) -> list[TextInput]:
        return texts.heldout_inputs(self.texts)

    def tuning(self) -> list[TextInput]:
        return texts.tuning_inputs(self.texts)

    # shared by the tasks

    def check_thresholds(self, thresholds: dict[str, float]) -> None:
        unknown = sorted(set(thresholds) - set(self.metrics))
        if unknown:
            raise ValueError(f"unknown parity metric(s) for {self.name}: {', '.join(unknown)}; "
                             f"known: {', '.join(self.metrics)}")

    def load_model(self, source: SourceModel) -> Any:
        """The PyTorch model the graph is exported from, refused in one line where the checkpoint lacks weights it
        needs or holds them in other shapes than its config."""
        cls = self.model_class(source)
        try:
            # Eager attention traces to the plain MatMul/Softmax pattern that onnxruntime's fusions recognize.
            model, loading = cls.from_pretrained(source.path, attn_implementation="eager", output_loading_info=True,
                                                 ignore_mismatched_sizes=True,
                                                 trust_remote_code=source.trust_remote_code)
        except ValueError as exc:  # transformers' "Unrecognized configuration class ..." runs over many lines
            if "Unrecognized configuration class" not in str(exc):
                raise
            raise UnsupportedModel(f"transformers has no {cls.__name__} for model type {source.model_type!r}, so "
                                   f"multiverse cannot build a {self.name} model from it") from None
        if loading["mismatched_keys"]:  # started from random values, as missing ones are
            (key, stored, expected), *others = sorted(loading["mismatched_keys"])
            more = f" (and {len(others)} more)" if others else ""
            raise UnsupportedModel(f"{source.path.name}'s weights do not fit its config.json: {key} is "
                                   f"{list(stored)} in the checkpoint and {list(expected)} in the model{more}")
        # a base model's pooler may be missing: only a classifier reads it, and the embedding graphs end before it
        untrained = sorted(key for key in loading["missing_keys"]
                           if not (cls.__name__ == "AutoModel" and key.startswith("pooler.")))
        if untrained:
            self.refuse_missing(source, ", ".join(untrained[:3]))
            # the artifact would carry random weights, and the reference other random ones: a parity failure at best
            more = f" and {len(untrained) - 3} more" if len(untrained) > 3 else ""
            raise UnsupportedModel(f"{source.path.name} has no trained weights for {', '.join(untrained[:3])}{more}: "
                                   "transformers would start them from random values; pass the complete checkpoint")
        return model.eval()


def input_names(model: Any) -> list[str]:
    """The inputs the graph takes. Segment ids only where the model has more than one segment embedding: with
    one (RoBERTa, XLM-R, GTE), the only valid id is 0, which is what the model assumes when given none, and a
    tokenizer that numbers a pair's second text 1 would index past the table."""
    accepted = inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in accepted and (getattr(model.config, "type_vocab_size", 0) or 0) >= 2:
        names.append("token_type_ids")
    return names


Forward = Callable[[Any, "Tensor", dict[str, "Tensor"]], "Tensor"]  # (the module, attention mask, inputs) -> output


def head(model: Any, forward: Forward, **parts: Any) -> Any:
    """One torch module of the transformers model (`model`), `parts` beside it (each a submodule of that name),
    and `forward(module, attention_mask, inputs)`: every task's graph has this shape."""
    import torch

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            for name, part in parts.items():
                setattr(self, name, part)

        def forward(self, attention_mask: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            result: torch.Tensor = forward(self, attention_mask, inputs)
            return result

    return Head().eval()


def with_modules(model: Any, modules: list[Any], output: str) -> Any:
    """The transformers model followed by sentence-transformers modules: (attention mask, inputs) -> the modules'
    `output` feature."""
    import torch

    def forward(module: Any, attention_mask: Tensor, inputs: dict[str, Tensor]) -> Tensor:
        features = {"token_embeddings": module.model(**inputs).last_hidden_state, "attention_mask": attention_mask}
        for step in module.steps:
            features = step(features)
        result: Tensor = features[output]
        return result

    return head(model, forward, steps=torch.nn.ModuleList(modules))


@contextmanager
def output_hook(module: Any, hook: Any) -> Iterator[None]:
    """`hook(module, args, output)` answers in place of the module's output while the block runs: the LM heads
    compute only what their graph needs from the head's input."""
    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def classifier_reference(source: SourceModel, model: Any, inputs: list[TextInput],
                         rows: Callable[[np.ndarray, np.ndarray], list[np.ndarray]]) -> Outputs:
    """A transformers classifier's answers, in batches of like lengths (as sentence-transformers' encode makes
    them: the least padding): `rows(logits, attention_mask)` turns a batch's logits into one answer per input."""
    import torch

    names = input_names(model)
    results: dict[int, np.ndarray] = {}
    by_length = sorted(range(len(inputs)), key=lambda i: len("".join(inputs[i])))
    singles = [i for i in by_length if not isinstance(inputs[i], tuple)]
    pairs = [i for i in by_length if isinstance(inputs[i], tuple)]
    for indices in (singles, pairs):
        for start in range(0, len(indices), 8):
            chunk = indices[start:start + 8]
            batch = [inputs[i] for i in chunk]
            args: tuple[list[str], ...] = (
                ([t[0] for t in batch if isinstance(t, tuple)], [t[1] for t in batch if isinstance(t, tuple)])
                if indices is pairs else ([t for t in batch if isinstance(t, str)],))
            enc = source.tokenizer(*args, padding=True, truncation=True, max_length=source.max_length,
                                   return_tensors="pt")
            with torch.no_grad():
                out = model(**{name: enc[name] for name in names})
            results.update(zip(chunk, rows(out.logits.numpy(), enc["attention_mask"].numpy())))
    return [results[i] for i in range(len(inputs))]


def hardest(task: OptimizerTask, reference: Outputs, candidate: Outputs) -> list[int]:
    return agreement.hardest(task.vectors(reference), task.vectors(candidate)) if task.continuous else []


def labels(config: Any) -> dict[int, str]:
    return {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}


class ClassifierHead(OptimizerTask):
    """A task whose checkpoint must bring its trained head."""

    def refuse_missing(self, source: SourceModel, missing: str) -> None:
        # scores and labels from random weights, which the PyTorch reference (started from other random weights)
        # would not even match
        raise UnsupportedModel(f"{source.path.name} has no trained {self.name} head (missing {missing}): pass a "
                               f"checkpoint fine-tuned for {self.name}, or --task feature-extraction for its "
                               "embeddings")


def st_modules(module: str, *names: str) -> list[Any]:
    """sentence-transformers' module classes, from where versions 3 to 5 all name them (`module`), imported without
    the deprecation warning newer ones give there."""
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        found = importlib.import_module(module)
    return [getattr(found, name) for name in names]


def st_backbone(kind: Any, source: SourceModel) -> Any:
    """The source model as a sentence-transformers backbone module of `kind` (Transformer, MLMTransformer), at the
    artifact's maximum length."""
    trust = {"trust_remote_code": source.trust_remote_code}
    return kind(str(source.path), max_seq_length=source.max_length, model_args=trust, config_args=trust)
