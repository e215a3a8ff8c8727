"""Task-level agreement between a reference and a candidate, held to thresholds; what each task measures is its
own (tasks/*.py: measure), on the measures of optimize/measure/agreement.py."""
from __future__ import annotations

import numpy as np

from infinity.engine.tokenization import TextInput
from optimize.measure import agreement
from optimize.measure.agreement import Outputs, ParityResult
from optimize.tasks.base import OptimizerTask, hardest


def compare(task: OptimizerTask, reference: Outputs, candidate: Outputs, inputs: list[TextInput],
            thresholds: dict[str, float] | None = None) -> ParityResult:
    thresholds = dict(task.thresholds if thresholds is None else thresholds)
    metrics = task.measure(reference, candidate, inputs)
    # texts to rank a search's nodes on: where the metric is continuous; a top-1 agreement over a few texts ties
    return ParityResult(metrics, thresholds, agreement.failures(metrics, thresholds),
                        hardest(task, reference, candidate))


def worst(first: ParityResult, second: ParityResult) -> ParityResult:
    """Each metric at its worse value of the two runs, judged against the same thresholds."""
    metrics = {name: (max if agreement.lower_is_better(name) else min)(value, second.metrics[name])
               for name, value in first.metrics.items()}
    return ParityResult(metrics, dict(first.thresholds), agreement.failures(metrics, first.thresholds),
                        second.hardest or first.hardest)


def batch_invariance(task: OptimizerTask, alone: Outputs, batched: Outputs) -> dict[str, float]:
    """How far an input's served answer moves between running alone and inside a padded batch."""
    diffs = [task.moved(a, b) for a, b in zip(alone, batched)]
    result = {"max_abs_diff": max(diffs), "inputs_changed": float(sum(d > 0 for d in diffs))}
    if task.continuous:
        rows = agreement.cosines(task.rows(task.vectors(alone)), task.rows(task.vectors(batched)))
        result["cosine_min"] = float(np.min(rows))
    return result
