"""Sparse embeddings (SPLADE): a masked-LM's logits through sentence-transformers' SpladePooling, against
SparseEncoder.encode. The worked example of a task: docs/optimizer.md walks through this module."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from infinity.engine.tokenization import Encoded, TextInput
from infinity.manifest import SPLADE, SPLADE_MAX_LOGITS, SPLADE_SETTINGS, TaskFacts, TaskName
from optimize.checkpoint import Checkpoint, Module, prompts, read_json
from optimize.measure import agreement
from optimize.measure.agreement import Outputs
from optimize.tasks.base import OptimizerTask, SourceModel, UnsupportedModel, head, output_hook, st_backbone, st_modules

if TYPE_CHECKING:
    pass

SPLADE_KEYS = {*SPLADE_SETTINGS, "embedding_dimension", "word_embedding_dimension", "chunk_size"}


class SparseEmbeddingTask(OptimizerTask):
    name = TaskName.SPARSE_EMBEDDING
    metrics = ("cosine_min", "cosine_mean", "max_abs_diff", "dot_spearman_mean", "dot_spearman_min",
               "dot_top1_agreement", "top_k_overlap_mean", "top_k_overlap_min", "nonzero_jaccard_min")
    thresholds = {"cosine_min": 0.99, "dot_spearman_mean": 0.95, "top_k_overlap_mean": 0.9}
    continuous = True
    auto_model = "AutoModelForMaskedLM"
    takes_pooling = True

    def facts(self, checkpoint: Checkpoint, pooling: str | None,
              reranker: str | dict[str, str] | None) -> tuple[TaskFacts, list[Module]]:
        """SPLADE over a masked-LM's logits: a sentence-transformers SparseEncoder's own SpladePooling settings, or
        (for a bare masked-LM directory, with --pooling splade) max pooling over relu."""
        path, modules = checkpoint.path, checkpoint.modules
        kinds = [m.kind for m in modules]
        if pooling is not None and pooling != SPLADE:
            raise ValueError(f"--pooling {pooling}: sparse-embedding pools with {SPLADE} only")
        if not modules:
            if pooling is None:
                raise ValueError(f"{path.name} declares no SPLADE pooling (no sentence-transformers SparseEncoder "
                                 f"modules); pass --pooling {SPLADE} to serve its masked-LM logits as SPLADE vectors")
            settings = {key: values[0] for key, values in SPLADE_SETTINGS.items()}
        elif kinds != ["MLMTransformer", "SpladePooling"]:
            raise ValueError(f"{path.name}: sparse-embedding reads a SparseEncoder of a masked-LM Transformer and "
                             f"SpladePooling, not {' + '.join(kinds)}")
        else:
            config = read_json(modules[1].path / "config.json")
            unknown = sorted(set(config) - SPLADE_KEYS)
            if unknown:
                raise ValueError(f"the SpladePooling config has keys this optimizer does not know: "
                                 f"{', '.join(unknown)}")
            settings = {key: str(config.get(key, values[0])) for key, values in SPLADE_SETTINGS.items()}
            bad = [f"{key}={value}" for key, value in settings.items() if value not in SPLADE_SETTINGS[key]]
            if bad:
                raise ValueError(f"the SpladePooling config has {', '.join(bad)}, which this optimizer does not know")
        named, default = prompts(path)
        facts = TaskFacts(pooling=SPLADE, splade=settings, pooled_in_graph=True,
                          embedding_dim=int(checkpoint.config.vocab_size), prompts=named, default_prompt_name=default)
        return facts, []

    def refuse_missing(self, source: SourceModel, missing: str) -> None:
        # transformers would start the missing head from random weights: sparse vectors that look plausible
        raise UnsupportedModel(f"{source.path.name} has no trained masked-LM head (missing {missing}); SPLADE reads "
                               "its logits")

    def graph(self, model: Any, source: SourceModel) -> tuple[Any, str]:
        return splade_model(model, source.facts.splade or {})

    def reference(self, source: SourceModel, inputs: list[TextInput]) -> Outputs:
        vectors = sparse_encoder(source).encode(inputs, batch_size=8, convert_to_tensor=True,
                                                convert_to_sparse_tensor=False)
        return list(vectors.float().numpy())

    def reference_name(self, source: SourceModel) -> str:
        return "sentence-transformers SparseEncoder, PyTorch FP32" + (
            "" if source.sentence_transformers else " (transformers masked-LM + SpladePooling)")

    def measure(self, reference: Outputs, candidate: Outputs, inputs: list[TextInput]) -> dict[str, float]:
        return agreement.sparse(reference, candidate)

    def served_values(self, answer: Any, row: np.ndarray, item: Encoded) -> Any:
        """Every vocabulary entry's weight, before the answer's threshold."""
        return row.astype(np.float32)


def splade_model(model: Any, settings: dict[str, str]) -> tuple[Any, str]:
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

    def forward(module: Any, attention_mask: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if not in_decoder:
            logits = module.model(**inputs).logits
            weights = torch.log1p(torch.relu(logits * attention_mask.unsqueeze(-1).to(logits.dtype)))
            weights = torch.log1p(weights) if twice else weights
            return weights.amax(dim=1) if by_max else weights.sum(dim=1)

        def pooled(linear: torch.nn.Linear, args: tuple[torch.Tensor, ...], _: torch.Tensor) -> torch.Tensor:
            hidden = args[0]
            first = hidden[torch.arange(hidden.shape[0]), attention_mask.argmax(dim=1)].unsqueeze(1)
            hidden = torch.where(attention_mask.unsqueeze(-1) > 0, hidden, first)
            best = torch.matmul(hidden, linear.weight.t()).amax(dim=1, keepdim=True)
            return best if linear.bias is None else best + linear.bias

        with output_hook(decoder, pooled):
            return torch.relu(module.model(**inputs).logits[:, 0])

    return head(model, forward), SPLADE_MAX_LOGITS if in_decoder else "sparse_embedding"


def sparse_encoder(source: SourceModel) -> Any:
    """The model as sentence-transformers' SparseEncoder runs it: its own modules, or (a bare masked-LM) its
    logits through SpladePooling with the artifact's settings."""
    from sentence_transformers import SparseEncoder

    if source.sentence_transformers:
        return SparseEncoder(str(source.path), device="cpu", trust_remote_code=source.trust_remote_code)
    transformer, splade = st_modules("sentence_transformers.sparse_encoder.models", "MLMTransformer", "SpladePooling")
    backbone = st_backbone(transformer, source)
    return SparseEncoder(modules=[backbone, splade(**(source.facts.splade or {}))], device="cpu")
