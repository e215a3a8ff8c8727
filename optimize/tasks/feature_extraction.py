"""Dense embeddings: the model's own sentence-transformers pooling (or --pooling), and the Dense and Normalize
modules after it, against SentenceTransformer.encode."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from infinity.engine.tokenization import Encoded, TextInput
from infinity.manifest import POOLINGS, SPLADE, TaskFacts, TaskName
from optimize.checkpoint import (
    Checkpoint,
    Module,
    dense_width,
    hidden_size,
    pooling_mode,
    prompts,
    read_json,
    read_modules,
)
from optimize.measure import agreement
from optimize.measure.agreement import Outputs
from optimize.tasks.base import OptimizerTask, SourceModel, st_backbone, st_modules, with_modules
from optimize.tasks.hybrid_embedding import M3_HEADS

if TYPE_CHECKING:
    pass


class FeatureExtractionTask(OptimizerTask):
    name = TaskName.FEATURE_EXTRACTION
    metrics = ("cosine_min", "cosine_mean", "max_abs_diff")
    thresholds = {"cosine_min": 0.99}
    continuous = True
    takes_pooling = True
    ranges = True

    def facts(self, checkpoint: Checkpoint, pooling: str | None,
              reranker: str | dict[str, str] | None) -> tuple[TaskFacts, list[Module]]:
        """Pooling as the model declares it (or as --pooling says where it declares none), and the modules after
        it."""
        path, modules = checkpoint.path, checkpoint.modules
        kinds = [m.kind for m in modules]
        if "MultiVectorMask" in kinds:
            raise ValueError(f"{path.name} is a multi-vector (ColBERT) model: it answers a vector per token; pass "
                             "--task multi-vector")
        if "SpladePooling" in kinds or "MLMTransformer" in kinds or pooling == SPLADE:
            raise ValueError(f"{path.name} is a masked-LM with SPLADE pooling: its output is sparse, one weight per "
                             "vocabulary entry; pass --task sparse-embedding")
        if pooling is not None and any(mode not in POOLINGS for mode in pooling.split("+")):
            raise ValueError(f"--pooling {pooling!r}: use one of {', '.join(POOLINGS)} (or several joined by +)")
        if "Pooling" not in kinds:
            if pooling is None:
                raise ValueError(f"{path.name} declares no pooling (no sentence-transformers Pooling module); pass "
                                 f"--pooling with one of {', '.join(POOLINGS)}, as its model card says")
            if modules[1:]:
                raise ValueError(f"{path.name}: modules after the Transformer but no Pooling module "
                                 f"({', '.join(kinds[1:])})")
            mode, after = pooling, []
        else:
            at = kinds.index("Pooling")
            mode, include_prompt = pooling_mode(read_json(modules[at].path / "config.json"))
            if pooling is not None and pooling != mode:
                raise ValueError(f"--pooling {pooling} contradicts the model's own Pooling config ({mode})")
            if not include_prompt:
                raise ValueError("the Pooling config excludes prompt tokens (include_prompt=false), which the server "
                                 "cannot reproduce")
            if any(kind != "Transformer" for kind in kinds[:at]):
                raise ValueError(f"{path.name}: a module before Pooling cannot be exported ({', '.join(kinds[:at])})")
            after = modules[at + 1:]
        if any(m.kind == "Pooling" for m in after):
            raise ValueError(f"{path.name}: more than one Pooling module")
        normalize = bool(after) and after[-1].kind == "Normalize"
        head = after[:-1] if normalize else after
        named, default = prompts(path)
        dense = [m for m in head if m.kind == "Dense"]
        dim = dense_width(dense) if dense else hidden_size(checkpoint.config) * len(mode.split("+"))
        facts = TaskFacts(pooling=mode, pooled_in_graph=bool(head), normalize=normalize, embedding_dim=dim,
                          prompts=named, default_prompt_name=default)
        return facts, head

    def graph(self, model: Any, source: SourceModel) -> tuple[Any, str]:
        """With modules after pooling, the model with its own Pooling and those modules: (attention mask, inputs)
        -> sentence embeddings; else the last hidden state, which the server pools."""
        if not source.facts.pooled_in_graph:
            return None, "last_hidden_state"
        from sentence_transformers import SentenceTransformer

        modules = list(SentenceTransformer(str(source.path), device="cpu",
                                           trust_remote_code=source.trust_remote_code))[1:2 + len(source.head)]
        return with_modules(model, modules, "sentence_embedding"), "sentence_embedding"

    def reference(self, source: SourceModel, inputs: list[TextInput]) -> Outputs:
        # sentence-transformers' own pooling, never the server's: parity then checks the server's pooling too
        return list(sentence_transformer(source).encode(inputs, batch_size=8, convert_to_numpy=True))

    def reference_name(self, source: SourceModel) -> str:
        return "sentence-transformers SentenceTransformer, PyTorch FP32" + (
            "" if source.sentence_transformers else f" (transformers model + {source.facts.pooling} pooling)")

    def measure(self, reference: Outputs, candidate: Outputs, inputs: list[TextInput]) -> dict[str, float]:
        return agreement.embeddings(reference, candidate)

    def served_values(self, answer: Any, row: np.ndarray, item: Encoded) -> Any:
        return answer[0].astype(np.float32)

    def notes(self, source: SourceModel) -> list[str]:
        notes = []
        if source.head:
            notes.append("the graph ends with the model's pooling and " + ", ".join(m.kind for m in source.head)
                         + " modules: it answers sentence embeddings")
        if all((source.path / f"{name}.pt").is_file() for name in M3_HEADS):
            notes.append("the model also has bge-m3's sparse and ColBERT heads (colbert_linear.pt, sparse_linear.pt): "
                         "--task hybrid-embedding serves all three embeddings from one pass")
        if "lasttoken" in (source.facts.pooling or "").split("+"):
            eos = source.tokenizer.eos_token
            ends = source.tokenizer("probe")["input_ids"][-1:] == [source.tokenizer.eos_token_id]
            notes.append(f"last-token pooling reads the {eos} its tokenizer appends to every input" if ends and eos
                         else "last-token pooling reads each input's last token; this tokenizer appends no "
                              "end-of-sequence token")
        return notes


def sentence_transformer(source: SourceModel) -> Any:
    """The model as sentence-transformers runs it: its own modules, or (without them) the transformers model
    followed by the Pooling module the artifact declares."""
    from sentence_transformers import SentenceTransformer

    if source.sentence_transformers and any(m.kind == "Pooling" for m in read_modules(source.path)):
        return SentenceTransformer(str(source.path), device="cpu", trust_remote_code=source.trust_remote_code)
    transformer, pooled = st_modules("sentence_transformers.models", "Transformer", "Pooling")
    backbone = st_backbone(transformer, source)
    modes = source.facts.pooling.split("+")  # type: ignore[union-attr]  # feature-extraction always has one
    pooling = pooled(backbone.get_embedding_dimension(), pooling_mode=modes[0] if len(modes) == 1 else tuple(modes))
    return SentenceTransformer(modules=[backbone, pooling], device="cpu")

