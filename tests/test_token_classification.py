"""Token classification against transformers' own pipeline, on the float artifact."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.inprocess import predict
from infinity.engine.model import LoadedModel
from infinity.errors import ValidationError

TEXTS = [
    "Hugging Face Inc. is a company based in New York City. Its headquarters are in DUMBO, "
    "therefore very close to the Manhattan Bridge.",
    "My name is Wolfgang and I live in Berlin; naïve café résumé 😀 ünïcödé",
    "tokenization preprocessing unbelievable xylophonist antidisestablishmentarianism",
    "   leading spaces, punctuation!!! and\ttabs\nnewlines",
]
STRATEGIES = ["none", "simple", "first", "average", "max"]


@pytest.fixture(scope="module")
def artifact(artifact_for: Any) -> Path:
    return artifact_for("token-classification")


@pytest.fixture(scope="module")
def model(artifact: Path) -> LoadedModel:
    return LoadedModel.load(artifact, threads=1)


@pytest.fixture(scope="module")
def reference(model: LoadedModel) -> Any:
    from transformers import pipeline
    return pipeline("token-classification", model=model.manifest.source.model, device="cpu")


def assert_same(expected: list[dict[str, Any]], actual: list[dict[str, Any]]) -> None:
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual):
        want, got = dict(want), dict(got)
        assert list(got) == list(want)
        assert float(got.pop("score")) == pytest.approx(float(want.pop("score")), abs=1e-4)
        assert got == want


@pytest.mark.parametrize(("strategy", "ignore"), [(strategy, None) for strategy in STRATEGIES] + [
    ("none", []), ("simple", []), ("first", ["O", "B-PER"]), ("max", ["PER"])])
def test_matches_the_transformers_pipeline(model: LoadedModel, reference: Any, strategy: str,
                                           ignore: list[str] | None) -> None:
    parameters: dict[str, Any] = {"aggregation_strategy": strategy}
    kwargs: dict[str, Any] = {"aggregation_strategy": strategy}
    if ignore is not None:
        parameters["ignore_labels"] = kwargs["ignore_labels"] = ignore
    actual = predict(model, TEXTS, parameters)
    expected = reference(TEXTS, **kwargs)
    assert sum(map(len, expected)) > 0
    for want, got in zip(expected, actual):
        assert_same(want, got)


def test_default_is_simple_grouping_without_o(model: LoadedModel, reference: Any) -> None:
    assert_same(reference(TEXTS[0], aggregation_strategy="simple"), predict(model, TEXTS[0]))


def test_a_single_text_gives_a_flat_list(model: LoadedModel) -> None:
    single = predict(model, TEXTS[0], {"ignore_labels": []})
    assert isinstance(single, list) and all(isinstance(e, dict) for e in single)
    assert predict(model, [TEXTS[0]], {"ignore_labels": []}) == [single]


@pytest.mark.parametrize("parameters", [
    {"aggregation_strategy": "loudest"},
    {"aggregation_strategy": 3},
    {"ignore_labels": "O"},
    {"ignore_labels": [1]},
    {"stride": 16},
])
def test_bad_parameters_are_refused(model: LoadedModel, parameters: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        predict(model, "Berlin", parameters)
