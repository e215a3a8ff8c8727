"""PyTorch -> ONNX, one graph per task with dynamic batch and sequence axes."""
from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infinity.manifest import SPLADE_MAX_LOGITS, Reranker
from optimize.onnxio import copy_model, external_files
from optimize.source import SourceModel, m3_heads

OPSET = 17


class UnsupportedModel(ValueError):
    """The model cannot be exported for this task; the message is the one line the user sees."""


class CheckedLoadReport(logging.Filter):
    """transformers' load report, left to what load_torch_model does not check: the weights a checkpoint lacks or
    holds in other shapes are refused there in one line, and what else the report lists (a base model's pooler,
    which no embedding graph reads; checkpoint keys the model does not use) needs nothing from the user. A report
    on failed conversions, which transformers raises on next, still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "LOAD REPORT" not in message or "CONVERSION" in message


CHECKED_LOAD_REPORT = CheckedLoadReport()  # one instance: adding it again to a logger adds nothing


def load_torch_model(source: SourceModel) -> Any:
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    cls = {
        "feature-extraction": AutoModel,
        "sparse-embedding": AutoModelForMaskedLM,
        "multi-vector": AutoModel,
        "hybrid-embedding": AutoModel,
        "sequence-classification": AutoModelForSequenceClassification,
        "ranking": AutoModelForSequenceClassification,
        "token-classification": AutoModelForTokenClassification,
    }[source.task]
    if source.facts.reranker is not None:
        cls = AutoModelForCausalLM
    try:
        # Eager attention traces to the plain MatMul/Softmax pattern that onnxruntime's fusions recognize.
        model, loading = cls.from_pretrained(source.path, attn_implementation="eager", output_loading_info=True,
                                             ignore_mismatched_sizes=True, trust_remote_code=source.trust_remote_code)
    except ValueError as exc:  # transformers' "Unrecognized configuration class ..." runs over many lines
        if "Unrecognized configuration class" not in str(exc):
            raise
        raise UnsupportedModel(f"transformers has no {cls.__name__} for model type {source.model_type!r}, so "
                               f"multiverse cannot build a {source.task} model from it") from None
    if loading["mismatched_keys"]:  # started from random values, as missing ones are
        (key, stored, expected), *others = sorted(loading["mismatched_keys"])
        more = f" (and {len(others)} more)" if others else ""
        raise UnsupportedModel(f"{source.path.name}'s weights do not fit its config.json: {key} is {list(stored)} in "
                               f"the checkpoint and {list(expected)} in the model{more}")
    # a base model's pooler may be missing: only a classifier reads it, and the embedding graphs end before it
    untrained = sorted(key for key in loading["missing_keys"] if not (cls is AutoModel and key.startswith("pooler.")))
    missing = ", ".join(untrained[:3])
    if source.task == "sparse-embedding" and missing:
        # transformers would start the missing head from random weights: sparse vectors that look plausible
        raise UnsupportedModel(f"{source.path.name} has no trained masked-LM head (missing {missing}); SPLADE reads "
                               "its logits")
    if cls in (AutoModelForSequenceClassification, AutoModelForTokenClassification) and missing:
        # the same for a classifier: scores and labels from random weights, which the PyTorch reference (started
        # from other random weights) would not even match
        raise UnsupportedModel(f"{source.path.name} has no trained {source.task} head (missing {missing}): pass a "
                               f"checkpoint fine-tuned for {source.task}, or --task feature-extraction for its "
                               "embeddings")
    if untrained:
        # the artifact would carry random weights, and the reference other random ones: a parity failure at best
        more = f" and {len(untrained) - 3} more" if len(untrained) > 3 else ""
        raise UnsupportedModel(f"{source.path.name} has no trained weights for {missing}{more}: "
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


@contextmanager
def broadcast_masks() -> Iterator[None]:
    """transformers builds a mask from custom functions (EmbeddingGemma's bidirectional and windowed attention)
    with vmap, which the ONNX exporter cannot trace; its own mask functions are index arithmetic that
    broadcasting computes alike, so the export builds them that way."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS as masks

    eager = masks["eager"]

    def broadcast(*args: Any, **kwargs: Any) -> Any:
        return eager(*args, **{**kwargs, "use_vmap": False})

    masks["eager"] = broadcast
    try:
        yield
    finally:
        masks["eager"] = eager


def embedding_model(model: Any, source: SourceModel) -> Any:
    """The model with its own sentence-transformers Pooling and the modules after it that the graph includes, as
    one torch module: (attention mask, inputs) -> sentence embeddings."""
    from sentence_transformers import SentenceTransformer

    modules = list(SentenceTransformer(str(source.path), device="cpu",
                                       trust_remote_code=source.trust_remote_code))[1:2 + len(source.head)]
    return with_modules(model, modules, "sentence_embedding")


def multi_vector_model(model: Any, source: SourceModel) -> Any:
    """The model with its MultiVectorEncoder's Dense projections and Normalize, as one torch module:
    (attention mask, inputs) -> batch x tokens x dim. Which tokens an answer keeps is the server's work."""
    from sentence_transformers import MultiVectorEncoder

    encoder = MultiVectorEncoder(str(source.path), device="cpu", trust_remote_code=source.trust_remote_code)
    modules = [module for module in list(encoder)[1:] if type(module).__name__ in ("Dense", "Normalize")]
    return with_modules(model, modules, "token_embeddings")


def hybrid_model(model: Any, source: SourceModel) -> Any:
    """bge-m3's three heads over one pass, as one torch module: (attention mask, inputs) -> batch x tokens x (hidden
    state, relu of sparse_linear, colbert_linear normalized): each token's numbers for every head side by side."""
    import torch

    heads = m3_heads(source.path)

    class Heads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.colbert = heads["colbert_linear"]
            self.sparse = heads["sparse_linear"]

        def forward(self, attention_mask: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            hidden = self.model(**inputs).last_hidden_state
            colbert = torch.nn.functional.normalize(self.colbert(hidden), dim=-1)
            return torch.cat([hidden, torch.relu(self.sparse(hidden)), colbert], dim=-1)

    return Heads().eval()


def with_modules(model: Any, modules: list[Any], output: str) -> Any:
    """The transformers model followed by sentence-transformers modules, as one torch module: (attention mask,
    inputs) -> the modules' `output` feature."""
    import torch

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.steps = torch.nn.ModuleList(modules)

        def forward(self, attention_mask: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            features = {"token_embeddings": self.model(**inputs).last_hidden_state, "attention_mask": attention_mask}
            for step in self.steps:
                features = step(features)
            result: torch.Tensor = features[output]
            return result

    return Head().eval()


@contextmanager
def output_hook(module: Any, hook: Any) -> Iterator[None]:
    """`hook(module, args, output)` answers in place of the module's output while the block runs: the LM heads
    below compute only what their graph needs from the head's input."""
    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def splade_model(model: Any, settings: dict[str, str]) -> Any:
    """The masked-LM with sentence-transformers' SpladePooling after it, as one torch module:
    (attention mask, inputs) -> batch x vocabulary, and the name of that output.

    Max pooling over relu then log1p takes the maximum first (both are monotonic: the same weights), inside the
    decoder, over each row's tokens with its padding replaced by its first real token (already in the maximum)
    instead of masked, and adds the decoder's bias after it (constant over tokens): the graph holds one batch x
    tokens x vocabulary matrix, its decoder's product, and nothing else that size. Its output is then
    SPLADE_MAX_LOGITS, each entry's largest logit through relu, and the server takes log1p of each row's non-zero
    values (onnxruntime's Log rounds an element by where it falls in the batch, which would make an answer depend
    on its batch). Without a linear decoder, or with sum pooling, the activation runs on every token as
    sentence-transformers runs it."""
    import torch

    twice = settings["activation_function"] == "log1p_relu"
    by_max = settings["pooling_strategy"] == "max"
    decoder = model.get_output_embeddings()
    in_decoder = by_max and isinstance(decoder, torch.nn.Linear)

    class Splade(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, attention_mask: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            if not in_decoder:
                logits = self.model(**inputs).logits
                weights = torch.log1p(torch.relu(logits * attention_mask.unsqueeze(-1).to(logits.dtype)))
                weights = torch.log1p(weights) if twice else weights
                return weights.amax(dim=1) if by_max else weights.sum(dim=1)

            def pooled(module: torch.nn.Linear, args: tuple[torch.Tensor, ...], _: torch.Tensor) -> torch.Tensor:
                hidden = args[0]
                first = hidden[torch.arange(hidden.shape[0]), attention_mask.argmax(dim=1)].unsqueeze(1)
                hidden = torch.where(attention_mask.unsqueeze(-1) > 0, hidden, first)
                best = torch.matmul(hidden, module.weight.t()).amax(dim=1, keepdim=True)
                return best if module.bias is None else best + module.bias

            with output_hook(decoder, pooled):
                return torch.relu(self.model(**inputs).logits[:, 0])

    return Splade().eval(), SPLADE_MAX_LOGITS if in_decoder else "sparse_embedding"


def reranker_model(model: Any, reranker: Reranker) -> Any:
    """A causal LM as a reranker, one torch module: (attention mask, inputs) -> batch x 1, the log-odds of the true
    token over the false one after each row's last real token (the server pads on the right). The language-model
    head multiplies that one position by those two rows of its weights only: no batch x tokens x vocabulary logits."""
    import torch

    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise UnsupportedModel(f"model type {model.config.model_type!r} has no linear language-model head to score "
                               "its yes and no tokens with")
    tokens = torch.tensor([reranker.true_token_id, reranker.false_token_id])

    class Ranker(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, attention_mask: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            def odds(module: torch.nn.Linear, args: tuple[torch.Tensor, ...], _: torch.Tensor) -> torch.Tensor:
                hidden = args[0]
                last = hidden[torch.arange(hidden.shape[0]), attention_mask.sum(dim=1) - 1]
                logits = last @ module.weight[tokens].t()
                if module.bias is not None:
                    logits = logits + module.bias[tokens]
                return (logits[:, 0] - logits[:, 1]).reshape(-1, 1, 1)

            with output_hook(head, odds):
                scores: torch.Tensor = self.model(**inputs).logits[:, 0]
            return scores

    return Ranker().eval()


def export_onnx(source: SourceModel, path: Path, external_data_bytes: int | None = None) -> tuple[list[str], str]:
    """Writes the graph to `path` (weights past `external_data_bytes` to `path`.data); returns its input names and
    its one output name."""
    import torch

    model = load_torch_model(source)
    names = input_names(model)
    head: Any = None
    if source.task == "sparse-embedding":
        head, output = splade_model(model, source.facts.splade or {})
    elif source.facts.reranker is not None:
        head, output = reranker_model(model, source.facts.reranker), "logits"
    elif source.task == "multi-vector":
        head, output = multi_vector_model(model, source), "token_embeddings"
    elif source.task == "hybrid-embedding":
        head, output = hybrid_model(model, source), "hybrid"
    elif source.facts.pooled_in_graph:
        head, output = embedding_model(model, source), "sentence_embedding"
    else:
        output = "last_hidden_state" if source.task == "feature-extraction" else "logits"

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.head = head

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            if self.head is None:
                result: torch.Tensor = getattr(self.model(**dict(zip(names, tensors))), output)
                return result
            headed: torch.Tensor = self.head(tensors[names.index("attention_mask")], dict(zip(names, tensors)))
            return headed

    # Traced right-padded, as the server pads (a decoder's positions then count from each row's first token).
    padding_side, source.tokenizer.padding_side = source.tokenizer.padding_side, "right"
    try:
        sample = source.tokenizer(["a short probe", "a somewhat longer probe sentence for tracing"],
                                  padding=True, return_tensors="pt")
    finally:
        source.tokenizer.padding_side = padding_side
    args = tuple(sample[name] for name in names)
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, output]}
    if head is not None and source.task not in ("multi-vector", "hybrid-embedding"):
        axes[output] = {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad(), broadcast_masks():
        warnings.simplefilter("ignore")
        try:
            # .eval() on the wrapper too: export restores the wrapper's mode onto the model afterwards.
            torch.onnx.export(Wrapped().eval(), args, str(path), input_names=names, output_names=[output],
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False)
        except Exception as exc:  # the tracer and the exporter raise many unrelated types
            first = (str(exc) or type(exc).__name__).strip().splitlines()[0][:200]
            raise UnsupportedModel(f"model type {source.model_type!r} could not be exported to ONNX: {first}") from exc
    per_tensor = external_files(path)  # over 2 GiB the exporter writes a file per tensor: one file
    if per_tensor or external_data_bytes is not None:
        copy_model(path, path, external_data_bytes)
        for name in set(per_tensor) - set(external_files(path)):
            (path.parent / name).unlink()
    return names, output
