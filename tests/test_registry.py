"""A task is one entry in each registry, the server's three (its name, its task class, its operation) and the
optimizer's one, and each operation's parameters are one typed dataclass whose fields its schema names."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from infinity.api import OPERATIONS, operation_for
from infinity.api.operations.base import Params
from infinity.manifest import Manifest, TaskName
from infinity.tasks import TASK_CLASSES, make_task
from optimize.tasks import REGISTRY


def test_every_task_has_exactly_one_entry_in_each_registry() -> None:
    names = set(TaskName)
    assert set(OPERATIONS) == names and set(REGISTRY) == names
    assert {TaskName(name) for name in TASK_CLASSES} == names and len(TASK_CLASSES) == len(names)
    for name, operation in OPERATIONS.items():
        assert operation.name is name and TASK_CLASSES[name.value].name == name.value and REGISTRY[name].name is name


def test_each_operation_takes_its_parameters_as_a_frozen_dataclass() -> None:
    for operation in OPERATIONS.values():
        assert issubclass(operation.params_type, Params), operation
        assert operation.params_type.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert {"truncate", "truncation_direction", "chunking"} <= {f.name for f in dataclasses.fields(
            operation.params_type)}


def test_the_parameters_the_schema_names_are_the_dataclass_fields(minilm_fp32_artifact: Path) -> None:
    """On MiniLM: every field /predict's schema takes becomes one of the dataclass's, with the schema's default."""
    manifest = Manifest.load(minilm_fp32_artifact)
    operation = operation_for(make_task(manifest, minilm_fp32_artifact))
    params = operation.params()
    assert set(operation.fields()) <= {f.name for f in dataclasses.fields(params)}
    assert params.normalize is manifest.task.normalize and params.precision == "float" and params.truncate is True
    assert params.dimensions is None and params.truncation_direction == "right"
    assert operation.params({"normalize": not manifest.task.normalize, "dimensions": 8}).dimensions == 8
    with pytest.raises(Exception, match="unknown field"):
        operation.params({"normalise": True})
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.normalize = False  # type: ignore[misc]
