"""Hybrid embeddings (bge-m3): the dense, sparse and ColBERT heads from one pass, each held to what its own task
measures, against bge-m3's formulas over the transformers encoder."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from infinity.engine.tokenization import Encoded, TextInput
from infinity.manifest import Hybrid, TaskFacts, TaskName
from optimize.checkpoint import Checkpoint, Module, hidden_size, pooling_mode, prompts, read_json
from optimize.measure import agreement
from optimize.measure.agreement import Outputs
from optimize.tasks.base import OptimizerTask, SourceModel, head

if TYPE_CHECKING:
    import torch


M3_HEADS = ("colbert_linear", "sparse_linear")  # bge-m3's extra weight files, beside the encoder's
HEADS = {"dense": ("cosine_min", "cosine_mean", "max_abs_diff"),
         "sparse": ("cosine_min", "cosine_mean", "max_abs_diff", "dot_spearman_mean", "dot_spearman_min",
                    "dot_top1_agreement", "top_k_overlap_mean", "top_k_overlap_min", "nonzero_jaccard_min"),
         "colbert": agreement.MULTI_VECTOR_METRICS}


class HybridAnswer(NamedTuple):
    dense: np.ndarray    # the normalized vector
    sparse: np.ndarray   # 2 x n: token ids in order, and their weights
    colbert: np.ndarray  # one normalized vector per token but the first


class HybridEmbeddingTask(OptimizerTask):
    name = TaskName.HYBRID_EMBEDDING
    metrics = tuple(f"{head}_{name}" for head, names in HEADS.items() for name in names)
    # the sparse head's weights are one dot product per token, cut at zero by relu: a text of two tokens whose
    # smaller weight sits near zero moves its cosine most, so the mean and the rankings are held to account
    thresholds = {"dense_cosine_min": 0.99, "sparse_cosine_mean": 0.99, "sparse_dot_spearman_mean": 0.95,
                  "sparse_top_k_overlap_mean": 0.9, "colbert_token_cosine_mean": 0.99,
                  "colbert_maxsim_spearman_mean": 0.95}
    continuous = True
    ranges = True

    def facts(self, checkpoint: Checkpoint, pooling: str | None,
              reranker: str | dict[str, str] | None) -> tuple[TaskFacts, list[Module]]:
        """bge-m3 (FlagEmbedding's M3 layout): the encoder's first token normalized (dense), relu of sparse_linear
        per token (sparse), colbert_linear normalized per token (ColBERT)."""
        path, tokenizer = checkpoint.path, checkpoint.tokenizer
        missing = [f"{name}.pt" for name in M3_HEADS if not (path / f"{name}.pt").is_file()]
        if missing:
            raise ValueError(f"{path.name} has no {' or '.join(missing)}: hybrid-embedding reads bge-m3's sparse and "
                             "ColBERT heads from those weight files beside the encoder")
        kinds = [m.kind for m in checkpoint.modules]
        if "Pooling" in kinds:
            mode, _ = pooling_mode(read_json(checkpoint.modules[kinds.index("Pooling")].path / "config.json"))
            if mode != "cls":
                raise ValueError(f"{path.name} pools its dense vector by {mode}; bge-m3's dense vector is its first "
                                 "token's, the one hybrid-embedding serves")
        hidden = hidden_size(checkpoint.config)
        heads = m3_heads(path)
        colbert, sparse = heads["colbert_linear"], heads["sparse_linear"]
        if colbert.in_features != hidden or sparse.in_features != hidden or sparse.out_features != 1:
            raise ValueError(f"{path.name}: colbert_linear.pt and sparse_linear.pt must read the {hidden}-wide hidden "
                             "state, and sparse_linear must give one weight per token")
        unused = sorted({int(i) for i in (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                          tokenizer.unk_token_id) if i is not None})
        named, default = prompts(path)
        facts = TaskFacts(pooling="cls", normalize=True, embedding_dim=hidden, prompts=named,
                          default_prompt_name=default,
                          hybrid=Hybrid(hidden_size=hidden, colbert_dim=colbert.out_features, unused_ids=unused))
        return facts, []

    def graph(self, model: Any, source: SourceModel) -> tuple[Any, str]:
        """(attention mask, inputs) -> batch x tokens x (hidden state, relu of sparse_linear, colbert_linear
        normalized): each token's numbers for every head side by side."""
        import torch

        heads = m3_heads(source.path)

        def forward(module: Any, attention_mask: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            hidden = module.model(**inputs).last_hidden_state
            colbert = torch.nn.functional.normalize(module.colbert(hidden), dim=-1)
            return torch.cat([hidden, torch.relu(module.sparse(hidden)), colbert], dim=-1)

        return head(model, forward, colbert=heads["colbert_linear"], sparse=heads["sparse_linear"]), "hybrid"

    def per_token_output(self, source: SourceModel) -> bool:
        return True

    def reference(self, source: SourceModel, inputs: list[TextInput]) -> Outputs:
        """bge-m3's reference formulas over the transformers encoder: the first token's hidden state normalized;
        relu of sparse_linear per token, each token id's largest weight, the cls, eos, pad and unk ids left out; and
        colbert_linear of every token but the first, masked, normalized."""
        import torch

        assert source.facts.hybrid is not None
        unused = set(source.facts.hybrid.unused_ids)
        model, heads = self.load_model(source), m3_heads(source.path)
        answers: list[HybridAnswer] = []
        for start in range(0, len(inputs), 8):
            texts = [t for t in inputs[start:start + 8] if isinstance(t, str)]
            batch = source.tokenizer(texts, padding=True, truncation=True, max_length=source.max_length,
                                     return_tensors="pt")
            with torch.no_grad():
                hidden = model(**batch).last_hidden_state
                dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1)
                weights = torch.relu(heads["sparse_linear"](hidden)).squeeze(-1)
                mask = batch["attention_mask"]
                colbert = heads["colbert_linear"](hidden[:, 1:]) * mask[:, 1:, None].float()
                colbert = torch.nn.functional.normalize(colbert, dim=-1)
            for row in range(len(texts)):
                best: dict[int, float] = {}
                for token, weight in zip(batch["input_ids"][row].tolist(), weights[row].tolist()):
                    if token not in unused and weight > 0:
                        best[token] = max(best.get(token, 0.0), weight)
                ids = sorted(best)
                answers.append(HybridAnswer(dense[row].numpy(),
                                            np.asarray([ids, [best[i] for i in ids]], np.float64),
                                            colbert[row, :int(mask[row].sum()) - 1].numpy()))
        return answers

    def reference_name(self, source: SourceModel) -> str:
        return ("bge-m3's formulas over the transformers encoder (dense: first token normalized; sparse: relu of "
                "sparse_linear, each token id's largest; ColBERT: colbert_linear normalized), PyTorch FP32")

    def measure(self, reference: Outputs, candidate: Outputs, inputs: list[TextInput]) -> dict[str, float]:
        """Each head as its own task measures it; the sparse vectors over the token ids either side weighs."""
        ids = np.unique(np.concatenate([answer.sparse[0] for answer in [*reference, *candidate]])).astype(np.int64)

        def sparse(answers: Outputs) -> Outputs:
            rows = np.zeros((len(answers), len(ids)))
            for row, answer in zip(rows, answers):
                row[np.searchsorted(ids, answer.sparse[0].astype(np.int64))] = answer.sparse[1]
            return list(rows)

        heads = {"dense": agreement.embeddings([r.dense for r in reference], [c.dense for c in candidate]),
                 "sparse": agreement.sparse(sparse(reference), sparse(candidate)),
                 "colbert": agreement.multi_vector([r.colbert for r in reference], [c.colbert for c in candidate])}
        return {f"{head}_{name}": value for head, metrics in heads.items() for name, value in metrics.items()}

    def vectors(self, answers: Outputs) -> list[np.ndarray]:
        return [answer.dense for answer in answers]  # a search ranks texts by the dense vector

    def moved(self, alone: Any, batched: Any) -> float:
        return max(super(HybridEmbeddingTask, self).moved(a, b) for a, b in zip(alone, batched))

    def served_values(self, answer: Any, row: np.ndarray, item: Encoded) -> Any:
        heads = answer[0]
        sparse = heads["sparse"]
        return HybridAnswer(heads["dense"], np.asarray([[e["index"] for e in sparse], [e["value"] for e in sparse]],
                                                       np.float64), heads["colbert"])


def m3_heads(path: Path) -> dict[str, torch.nn.Linear]:
    """bge-m3's ColBERT and sparse heads as torch Linear layers, from their weight files."""
    import torch

    heads = {}
    for name in M3_HEADS:
        state = torch.load(path / f"{name}.pt", map_location="cpu", weights_only=True)
        out_features, in_features = state["weight"].shape
        layer = torch.nn.Linear(in_features, out_features, bias="bias" in state)
        layer.load_state_dict(state)
        heads[name] = layer.eval()
    return heads
