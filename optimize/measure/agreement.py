"""How far a candidate's answers agree with a reference's: the measures every task's parity is made of, and the
result of holding them to thresholds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Outputs = list[Any]  # one answer per input, in the task's own shape

# Sparse vectors: how many of the largest weights top_k_overlap compares
TOP_K = 32
# Ranking scores closer than this are a tie: the reference cannot order them to the precision a client reads
# (sigmoid scores saturate near 1, where 0.9999908 and 0.9999902 are two answers equal to five decimals).
RANKING_TIE = 1e-3


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


def failures(metrics: dict[str, float], thresholds: dict[str, float]) -> list[str]:
    return [f"{name} = {metrics[name]:.4f}, needs >= {bound}" for name, bound in thresholds.items()
            if not metrics[name] >= bound]


def lower_is_better(metric: str) -> bool:
    """A difference or a count of mismatches (each hybrid head's too, under its head's prefix)."""
    return metric.startswith("max_") or "_max_" in metric or metric.endswith("tokenization_mismatches")


def hardest(reference: Outputs, candidate: Outputs) -> list[int]:
    """Input indices by how far each answer is from the reference's (relative L2 of the whole output), farthest
    first."""
    distances = [float(np.linalg.norm(np.asarray(c, np.float64) - np.asarray(r, np.float64))
                       / max(float(np.linalg.norm(np.asarray(r, np.float64))), 1e-12))
                 if np.shape(c) == np.shape(r) else np.inf for r, c in zip(reference, candidate)]
    return sorted(range(len(distances)), key=lambda i: -distances[i])


def cosines(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Row by row; two zero vectors agree (a sparse vector may be empty), one zero vector does not."""
    a, b = reference.astype(np.float64), candidate.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    both_zero = ~a.any(axis=1) & ~b.any(axis=1)
    return np.where(both_zero, 1.0, (a * b).sum(1) / np.maximum(norms, 1e-300))


def embeddings(reference: Outputs, candidate: Outputs) -> dict[str, float]:
    a, b = np.stack(reference).astype(np.float64), np.stack(candidate).astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
            "max_abs_diff": float(np.abs(a / np.linalg.norm(a, axis=1, keepdims=True)
                                         - b / np.linalg.norm(b, axis=1, keepdims=True)).max())}


def sparse(reference: Outputs, candidate: Outputs) -> dict[str, float]:
    """SPLADE vectors as retrieval uses them: each input's weights, and its dot products with every other input
    (each input a query, the rest its documents), ranked; the largest weights, and which weights are non-zero."""
    a, b = np.stack(reference).astype(np.float64), np.stack(candidate).astype(np.float64)
    cos = cosines(a, b)
    metrics = {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
               "max_abs_diff": float(np.abs(a - b).max())}
    dots_a, dots_b = a @ a.T, b @ b.T
    rhos, top1 = [], []
    for row in range(len(a)):
        others = np.arange(len(a)) != row
        x, y = dots_a[row, others], dots_b[row, others]
        rhos.append(spearman(x, y))
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


MULTI_VECTOR_METRICS = ("token_cosine_min", "token_cosine_mean", "max_abs_diff", "maxsim_spearman_mean",
                        "maxsim_spearman_min", "maxsim_top1_agreement", "tokenization_mismatches")


def multi_vector(reference: Outputs, candidate: Outputs) -> dict[str, float]:
    """Token vectors as late interaction uses them: each token's vector, and each input's MaxSim scores (the sum
    over its tokens of their best dot product) with every other input (each input a query, the rest its
    documents), ranked. An input answered with other tokens than the reference's fails every metric."""
    mismatched = sum(np.shape(a) != np.shape(b) for a, b in zip(reference, candidate))
    if mismatched:
        return {name: 0.0 for name in MULTI_VECTOR_METRICS} | {"max_abs_diff": np.inf,
                                                               "tokenization_mismatches": float(mismatched)}
    a, b = np.concatenate(reference).astype(np.float64), np.concatenate(candidate).astype(np.float64)
    cos = cosines(a, b)
    starts = np.cumsum([0, *(len(r) for r in reference[:-1])])
    rhos, top1 = [], []
    for row in range(len(reference)):
        others = np.arange(len(reference)) != row
        x, y = maxsim(reference[row], a, starts)[others], maxsim(candidate[row], b, starts)[others]
        rhos.append(spearman(x, y))
        top1.append(float(x[y.argmax()] >= x.max() - RANKING_TIE * max(abs(x.max()), 1.0)))
    return {"token_cosine_min": float(cos.min()), "token_cosine_mean": float(cos.mean()),
            "max_abs_diff": float(np.abs(a - b).max()), "maxsim_spearman_mean": float(np.mean(rhos)),
            "maxsim_spearman_min": float(np.min(rhos)), "maxsim_top1_agreement": float(np.mean(top1)),
            "tokenization_mismatches": 0.0}


def maxsim(query: np.ndarray, documents: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The query's MaxSim score with each document, whose token vectors are the rows of `documents` from each
    of `starts` to the next."""
    scores: np.ndarray = np.maximum.reduceat(query.astype(np.float64) @ documents.T, starts, axis=1).sum(axis=0)
    return scores


def classification(reference: Outputs, candidate: Outputs) -> dict[str, float]:
    a, b = np.stack(reference), np.stack(candidate)
    return {"top1_agreement": float((a.argmax(1) == b.argmax(1)).mean()),
            "max_prob_diff": float(np.abs(a - b).max())}


def token_labels(reference: Outputs, candidate: Outputs) -> dict[str, float]:
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


def ranking(reference: Outputs, candidate: Outputs, groups: list[int]) -> dict[str, float]:
    a, b = np.asarray(reference, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    rhos, top1, strict, start = [], [], [], 0
    for size in groups:
        x, y = a[start:start + size], b[start:start + size]
        rhos.append(spearman(x, y))
        # The candidate's pick agrees when the reference scores it as high as its own best, up to a tie.
        top1.append(float(x[y.argmax()] >= x.max() - RANKING_TIE))
        strict.append(float(x.argmax() == y.argmax()))
        start += size
    return {"spearman_mean": float(np.mean(rhos)), "spearman_min": float(np.min(rhos)),
            "top1_agreement": float(np.mean(top1)), "top1_agreement_strict": float(np.mean(strict)),
            "max_score_diff": float(np.abs(a - b).max())}


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    if len(x) < 2:
        return 1.0
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / np.sqrt((rx ** 2).sum() * (ry ** 2).sum()))
