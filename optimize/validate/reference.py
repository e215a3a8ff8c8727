"""The reference stage: the original model's answers, PyTorch FP32, as its task computes them (tasks/*.py)."""
from __future__ import annotations

from infinity.engine.tokenization import TextInput
from optimize.agreement import Outputs
from optimize.checkpoint import SourceModel
from optimize.tasks import task_for


def torch_reference(source: SourceModel, inputs: list[TextInput]) -> Outputs:
    return task_for(source.task).reference(source, inputs)
