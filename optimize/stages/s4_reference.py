"""The reference stage: the original model's answers, PyTorch FP32, as its task computes them (tasks/*.py)."""
from __future__ import annotations

from infinity.engine.tokenization import TextInput
from optimize.measure.agreement import Outputs
from optimize.tasks.base import SourceModel


def torch_reference(source: SourceModel, inputs: list[TextInput]) -> Outputs:
    return source.task.reference(source, inputs)
