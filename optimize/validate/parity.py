"""Task-level agreement between a reference and a candidate, against thresholds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimize.validate.reference import Outputs

# metric -> (threshold, "min" means the metric must be at least the threshold)
THRESHOLDS: dict[str, dict[str, float]] = {
    "feature-extraction": {"cosine_min": 0.99},
    "sparse-embedding": {"cosine_min": 0.99, "dot_spearman_mean": 0.95, "top_k_overlap_mean": 0.9},
    "multi-vector": {"token_cosine_mean": 0.99, "maxsim_spearman_mean": 0.95},
    # the sparse head's weights are one dot product per token, cut at zero by relu: a text of two tokens whose
    # smaller weight sits near zero moves its cosine most, so the mean and the rankings are held to account
    "hybrid-embedding": {"dense_cosine_min": 0.99, "sparse_cosine_mean": 0.99, "sparse_dot_spearman_mean": 0.95,
                         "sparse_top_k_overlap_mean": 0.9, "colbert_token_cosine_mean": 0.99,
                         "colbert_maxsim_spearman_mean": 0.95},
    "sequence-classification": {"top1_agreement": 0.99},
    "token-classification": {"label_agreement": 0.99},
    "ranking": {"spearman_mean": 0.95, "top1_agreement": 0.99},
}

# Sparse vectors: how many of the largest weights top_k_overlap compares
TOP_K = 32
# Ranking scores closer than this are a tie: the reference cannot order them to the precision a client reads
# (sigmoid scores saturate near 1, where 0.9999908 and 0.9999902 are two answers equal to five decimals).
RANKING_TIE = 1e-3

METRICS: dict[str, tuple[str, ...]] = {
    "feature-extraction": ("cosine_min", "cosine_mean", "max_abs_diff"),
    "sparse-embedding": ("cosine_min", "cosine_mean", "max_abs_diff", "dot_spearman_mean", "dot_spearman_min",
                         "dot_top1_agreement", "top_k_overlap_mean", "top_k_overlap_min", "nonzero_jaccard_min"),
    "multi-vector": ("token_cosine_min", "token_cosine_mean", "max_abs_diff", "maxsim_spearman_mean",
                     "maxsim_spearman_min", "maxsim_top1_agreement", "tokenization_mismatches"),
    "sequence-classification": ("top1_agreement", "max_prob_diff"),
    "token-classification": ("label_agreement", "max_prob_diff"),
    "ranking": ("spearman_mean", "spearman_min", "top1_agreement", "top1_agreement_strict", "max_score_diff"),
}
# hybrid-embedding: each head's metrics, by the task whose answers it shares
HYBRID_HEADS = {"dense": "feature-extraction", "sparse": "sparse-embedding", "colbert": "multi-vector"}
METRICS["hybrid-embedding"] = tuple(f"{head}_{name}" for head, task in HYBRID_HEADS.items() for name in METRICS[task])


def check_thresholds(task: str, thresholds: dict[str, float]) -> None:
    unknown = sorted(set(thresholds) - set(METRICS[task]))
    if unknown:
        raise ValueError(f"unknown parity metric(s) for {task}: {', '.join(unknown)}; "
                         f"known: {', '.join(METRICS[task])}")


@dataclass
class ParityResult:
    metrics: dict[str, float]
    thresholds: dict[str, float]
    failures: list[str] = field(default_factory=list)
    hardest: list[int] = field(default_factory=list)  # embeddings: input indices, farthest from the reference first

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def score(self) -> float:
        """How far inside (>0) or outside (<0) the tightest threshold is; drives the fallback search."""
        return min(self.metrics[name] - bound for name, bound in self.thresholds.items())


def compare(task: str, reference: Outputs, candidate: Outputs, groups: list[int] | None = None,
            thresholds: dict[str, float] | None = None) -> ParityResult:
    thresholds = dict(THRESHOLDS[task] if thresholds is None else thresholds)
    if task == "feature-extraction":
        metrics = _embeddings(reference, candidate)
    elif task == "sparse-embedding":
        metrics = _sparse(reference, candidate)
    elif task == "multi-vector":
        metrics = _multi_vector(reference, candidate)
    elif task == "hybrid-embedding":
        metrics = _hybrid(reference, candidate)
    elif task == "sequence-classification":
        metrics = _classification(reference, candidate)
    elif task == "token-classification":
        metrics = _tokens(reference, candidate)
    else:
        metrics = _ranking(reference, candidate, groups or [len(reference)])
    failures = [f"{name} = {metrics[name]:.4f}, needs >= {bound}" for name, bound in thresholds.items()
                if not metrics[name] >= bound]
    # texts to rank a search's nodes on: where the metric is continuous; a top-1 agreement over a few texts ties
    if task == "hybrid-embedding":  # ranked by the dense vector
        reference, candidate = [r.dense for r in reference], [c.dense for c in candidate]
    ranked = hardest(reference, candidate) if task in CONTINUOUS else []
    return ParityResult(metrics, thresholds, failures, ranked)


CONTINUOUS = ("feature-extraction", "sparse-embedding", "multi-vector", "hybrid-embedding")  # answers are vectors


def hardest(reference: Outputs, candidate: Outputs) -> list[int]:
    """Input indices by how far each answer is from the reference's (relative L2 of the whole output), farthest
    first."""
    distances = [float(np.linalg.norm(np.asarray(c, np.float64) - np.asarray(r, np.float64))
                       / max(float(np.linalg.norm(np.asarray(r, np.float64))), 1e-12))
                 if np.shape(c) == np.shape(r) else np.inf for r, c in zip(reference, candidate)]
    return sorted(range(len(distances)), key=lambda i: -distances[i])


def worst(first: ParityResult, second: ParityResult) -> ParityResult:
    """Each metric at its worse value of the two runs, judged against the same thresholds."""
    metrics = {name: (max if _lower_is_better(name) else min)(value, second.metrics[name])
               for name, value in first.metrics.items()}
    failures = [f"{name} = {metrics[name]:.4f}, needs >= {bound}" for name, bound in first.thresholds.items()
                if not metrics[name] >= bound]
    return ParityResult(metrics, dict(first.thresholds), failures, second.hardest or first.hardest)


def _lower_is_better(metric: str) -> bool:
    name = metric.split("_", 1)[1] if metric.startswith(tuple(f"{head}_" for head in HYBRID_HEADS)) else metric
    return name.startswith("max_") or name == "tokenization_mismatches"


def batch_invariance(task: str, alone: Outputs, batched: Outputs) -> dict[str, float]:
    """How far an input's served answer moves between running alone and inside a padded batch."""
    def moved(a: Any, b: Any) -> float:
        if np.shape(a) != np.shape(b):  # a sparse answer with other ids
            return np.inf
        return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max(initial=0.0))

    diffs = [max(map(moved, a, b)) if task == "hybrid-embedding" else moved(a, b) for a, b in zip(alone, batched)]
    result = {"max_abs_diff": max(diffs), "inputs_changed": float(sum(d > 0 for d in diffs))}
    if task == "hybrid-embedding":  # of the dense vectors
        alone, batched = [a.dense for a in alone], [b.dense for b in batched]
    if task in CONTINUOUS:  # a multi-vector answer's rows are its tokens' vectors
        join = np.concatenate if task == "multi-vector" else np.stack
        result["cosine_min"] = float(_cosines(join(alone), join(batched)).min())
    return result


def _cosines(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Row by row; two zero vectors agree (a sparse vector may be empty), one zero vector does not."""
    a, b = reference.astype(np.float64), candidate.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    both_zero = ~a.any(axis=1) & ~b.any(axis=1)
    return np.where(both_zero, 1.0, (a * b).sum(1) / np.maximum(norms, 1e-300))


def _embeddings(reference: Outputs, candidate: Outputs) -> dict[str, float]:
    a, b = np.stack(reference).astype(np.float64), np.stack(candidate).astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
            "max_abs_diff": float(np.abs(a / np.linalg.norm(a, axis=1, keepdims=True)
                                         - b / np.linalg.norm(b, axis=1, keepdims=True)).max())}


def _sparse(reference: Outputs, candidate: Outputs) -> dict[str, float]:
    """SPLADE vectors as retrieval uses them: each input's weights, and its dot products with every other input
    (each input a query, the rest its documents), ranked; the largest weights, and which weights are non-zero."""
    a, b = np.stack(reference).astype(np.float64), np.stack(candidate).astype(np.float64)
    cos = _cosines(a, b)
    metrics = {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
               "max_abs_diff": float(np.abs(a - b).max())}
    dots_a, dots_b = a @ a.T, b @ b.T
    rhos, top1 = [], []
    for row in range(len(a)):
        others = np.arange(len(a)) != row
        x, y = dots_a[row, others], dots_b[row, others]
        rhos.append(_spearman(x, y))
        top1.append(float(x[y.argmax()] >= x.max() - RANKING_TIE * max(abs(x.max()), 1.0)))
    overlaps, jaccards = [], []
    for x, y in zip(a, b):
        kept_x, kept_y = set(np.flatnonzero(x).tolist()), set(np.flatnonzero(y).tolist())
        jaccards.append(len(kept_x & kept_y) / len(kept_x | kept_y) if kept_x | kept_y else 1.0)
        k = min(TOP_K, len(kept_x))
        if k == 0:
            overlaps.append(1.0 if not kept_y else 0.0)
            continue
        top_x, top_y = np.argsort(-x, kind="stable")[:k], np.argsort(-y, kind="stable")[:k]
        overlaps.append(len(set(top_x.tolist()) & set(top_y.tolist())) / k)
    metrics.update(dot_spearman_mean=float(np.mean(rhos)) if rhos else 1.0,
                   dot_spearman_min=float(np.min(rhos)) if rhos else 1.0,
                   dot_top1_agreement=float(np.mean(top1)) if top1 else 1.0,
                   top_k_overlap_mean=float(np.mean(overlaps)), top_k_overlap_min=float(np.min(overlaps)),
                   nonzero_jaccard_min=float(np.min(jaccards)))
    return metrics


def _multi_vector(reference: Outputs, candidate: Outputs) -> dict[str, float]:
    """Token vectors as late interaction uses them: each token's vector, and each input's MaxSim scores (the sum
    over its tokens of their best dot product) with every other input (each input a query, the rest its
    documents), ranked. An input answered with other tokens than the reference's fails every metric."""
    mismatched = sum(np.shape(a) != np.shape(b) for a, b in zip(reference, candidate))
    if mismatched:
        return {name: 0.0 for name in METRICS["multi-vector"]} | {"max_abs_diff": np.inf,
                                                                  "tokenization_mismatches": float(mismatched)}
    a, b = np.concatenate(reference).astype(np.float64), np.concatenate(candidate).astype(np.float64)
    cos = _cosines(a, b)
    starts = np.cumsum([0, *(len(r) for r in reference[:-1])])
    rhos, top1 = [], []
    for row in range(len(reference)):
        others = np.arange(len(reference)) != row
        x, y = _maxsim(reference[row], a, starts)[others], _maxsim(candidate[row], b, starts)[others]
        rhos.append(_spearman(x, y))
        top1.append(float(x[y.argmax()] >= x.max() - RANKING_TIE * max(abs(x.max()), 1.0)))
    return {"token_cosine_min": float(cos.min()), "token_cosine_mean": float(cos.mean()),
            "max_abs_diff": float(np.abs(a - b).max()), "maxsim_spearman_mean": float(np.mean(rhos)),
            "maxsim_spearman_min": float(np.min(rhos)), "maxsim_top1_agreement": float(np.mean(top1)),
            "tokenization_mismatches": 0.0}


def _hybrid(reference: Outputs, candidate: Outputs) -> dict[str, float]:
    """Each head as its own task measures it; the sparse vectors over the token ids either side weighs."""
    ids = np.unique(np.concatenate([answer.sparse[0] for answer in [*reference, *candidate]])).astype(np.int64)

    def sparse(answers: Outputs) -> Outputs:
        rows = np.zeros((len(answers), len(ids)))
        for row, answer in zip(rows, answers):
            row[np.searchsorted(ids, answer.sparse[0].astype(np.int64))] = answer.sparse[1]
        return list(rows)

    heads = {"dense": _embeddings([r.dense for r in reference], [c.dense for c in candidate]),
             "sparse": _sparse(sparse(reference), sparse(candidate)),
             "colbert": _multi_vector([r.colbert for r in reference], [c.colbert for c in candidate])}
    return {f"{head}_{name}": value for head, metrics in heads.items() for name, value in metrics.items()}


def _maxsim(query: np.ndarray, documents: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The query's MaxSim score with each document, whose token vectors are the rows of `documents` from each
    of `starts` to the next."""
    scores: np.ndarray = np.maximum.reduceat(query.astype(np.float64) @ documents.T, starts, axis=1).sum(axis=0)
    return scores


def _classification(reference: Outputs, candidate: Outputs) -> dict[str, float]:
    a, b = np.stack(reference), np.stack(candidate)
    return {"top1_agreement": float((a.argmax(1) == b.argmax(1)).mean()),
            "max_prob_diff": float(np.abs(a - b).max())}


def _tokens(reference: Outputs, candidate: Outputs) -> dict[str, float]:
    """Per-token label probabilities on both sides (the server's softmax over the labels)."""
    agree, total, diff, mismatched = 0, 0, 0.0, 0
    for a, b in zip(reference, candidate):
        if a.shape != b.shape:
            mismatched += 1
            continue
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
        diff = max(diff, float(np.abs(a - b).max()))
    agreement = agree / total if total and not mismatched else 0.0
    return {"label_agreement": agreement, "max_prob_diff": diff, "tokenization_mismatches": float(mismatched)}


def _ranking(reference: Outputs, candidate: Outputs, groups: list[int]) -> dict[str, float]:
    a, b = np.asarray(reference, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    rhos, top1, strict, start = [], [], [], 0
    for size in groups:
        x, y = a[start:start + size], b[start:start + size]
        rhos.append(_spearman(x, y))
        # The candidate's pick agrees when the reference scores it as high as its own best, up to a tie.
        top1.append(float(x[y.argmax()] >= x.max() - RANKING_TIE))
        strict.append(float(x.argmax() == y.argmax()))
        start += size
    return {"spearman_mean": float(np.mean(rhos)), "spearman_min": float(np.min(rhos)),
            "top1_agreement": float(np.mean(top1)), "top1_agreement_strict": float(np.mean(strict)),
            "max_score_diff": float(np.abs(a - b).max())}


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    if len(x) < 2:
        return 1.0
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / np.sqrt((rx ** 2).sum() * (ry ** 2).sum()))

