"""The reference stage: the original model's answers, PyTorch FP32, as its task computes them (tasks/*.py), on the
texts the INT8 recipe tunes on and the held-out texts parity is measured on."""
from __future__ import annotations

from dataclasses import dataclass

from infinity.engine.tokenization import TextInput
from infinity.manifest import Precision
from optimize.measure.agreement import Outputs
from optimize.options import Plan
from optimize.tasks.base import SourceModel


@dataclass
class References:
    search_inputs: list[TextInput]  # what the INT8 recipe and its fallback search tune on; none for a float graph
    search: Outputs
    heldout: list[TextInput]  # what the manifest's parity is measured on, and nothing else
    heldout_reference: Outputs


def references(plan: Plan, source: SourceModel) -> References:
    task = plan.task
    search_inputs = [*task.probes(), *task.tuning()] if plan.precision == Precision.INT8 else []
    heldout = task.heldout()
    return References(search_inputs, torch_reference(source, search_inputs) if search_inputs else [], heldout,
                      torch_reference(source, heldout))


def torch_reference(source: SourceModel, inputs: list[TextInput]) -> Outputs:
    return source.task.reference(source, inputs)
