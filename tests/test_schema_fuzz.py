"""The published OpenAPI document is the truth: schemathesis fuzzes a real server of each task from its own
/openapi.json with every check (server errors, response schemas, status codes, content types, valid data
accepted and invalid data refused); a few answers the fuzzer found are pinned here as plain requests."""
from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests.servers import Server, running

KEY = "fuzz-key-27"
SEED = 27
# Per operation and phase; the coverage phase's boundary cases run in full whatever the count. The examples are most
# of a run's time, and eight server runs of them were the suite's largest cost.
EXAMPLES = 8
# With a key, the same routes take the same bodies behind one more check: a few fuzzed examples each still send every
# operation through the key's guard (the boundary cases of the coverage phase run without the key)
KEYED_EXAMPLES = 5
# Where the server knowingly answers other than schemathesis expects, and why. Nothing else is excluded; each
# entry becomes a section of the schemathesis configuration.
DEVIATIONS: dict[str, dict[str, Any]] = {
    "checks.negative_data_rejection": {
        "expected-statuses": [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, "5xx"],
        "why": "413 is how every route refuses more inputs than max_inputs_per_request, as each documents; "
               "schemathesis's default list of refusals lacks it",
    },
}


# Operations whose schema-valid bodies the server may still refuse, and why (only that one check is off there).
VALID_MAY_BE_REFUSED: dict[str, str] = {
    "^/v2/models/.+/infer$": "KServe's tensors carry constraints across fields that OpenAPI 3.0 cannot state: "
                                "a shape whose product is the data's length, each input named once, the "
                                "task's required inputs present (each refusal is a 400 naming the input)",
    "^/vertex/predict$": "the inputs of all instances together are limited to --max-inputs-per-request (413), "
                         "a sum over nested arrays that OpenAPI 3.0 cannot state",
}


def toml(deviations: dict[str, dict[str, Any]]) -> str:
    lines = []
    for path, _why in VALID_MAY_BE_REFUSED.items():
        lines += ["[[operations]]", f"include-path-regex = '{path}'", "checks.positive_data_acceptance.enabled = false"]
    for section, settings in deviations.items():
        lines.append(f"[{section}]")
        for key, value in settings.items():
            if key != "why":
                items = ", ".join(f'"{item}"' if isinstance(item, str) else str(item) for item in value)
                lines.append(f"{key} = [{items}]")
    return "\n".join(lines) + "\n"


def fuzz(server: Server, tmp_path: Path, *options: str, examples: int = EXAMPLES) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(toml(DEVIATIONS))
    command = [sys.executable, "-m", "schemathesis.cli", "--no-color", "--config-file", str(config),
               "run", server.url + "/openapi.json", "--seed", str(SEED),
               "--max-examples", str(examples), "--generation-database", "none",
               "--workers", "1", "--request-timeout", "60", *options]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    report = run.stdout
    assert run.returncode == 0, report[report.find("FAILURES"):] + run.stderr
    selected = re.search(r"Selected: (\d+)/", report)
    assert selected and f"Tested: {selected.group(1)}\n" in report, report  # every operation was exercised


@pytest.fixture(scope="module")
def embedder(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(minilm_fp32_artifact, tmp_path_factory.mktemp("embedder") / "server.log") as server:
        yield server


def test_fuzzing_feature_extraction_finds_nothing(embedder: Server, tmp_path: Path) -> None:
    fuzz(embedder, tmp_path)


@pytest.mark.parametrize("task", ["ranking", "sequence-classification", "token-classification", "sparse-embedding",
                                  "multi-vector", "hybrid-embedding"])
def test_fuzzing_other_tasks_finds_nothing(task: str, artifact_for: Any, tmp_path: Path) -> None:
    with running(artifact_for(task), tmp_path / "server.log") as server:
        fuzz(server, tmp_path)


def test_fuzzing_with_api_keys_finds_nothing(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--api-key", KEY) as server:
        fuzz(server, tmp_path, "--header", f"Authorization: Bearer {KEY}", "--phases", "examples,fuzzing",
             examples=KEYED_EXAMPLES)


def answer_schema(server: Server, path: str) -> dict[str, Any]:
    spec = httpx.get(server.url + "/openapi.json", timeout=60).json()
    return spec["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]


@pytest.mark.parametrize(("path", "body"), [
    ("/embed", {"inputs": ["a", "b"], "normalize": False, "dimensions": 5}),
    ("/predict", {"inputs": ["a", "b"], "parameters": {"dimensions": 5, "normalize": False}}),
    ("/", {"inputs": ["a", "b"], "parameters": {"dimensions": 5, "normalize": False}}),
    ("/predict", {"inputs": ["a", "b"], "normalize": False, "dimensions": 5}),
])
def test_unnormalized_cut_vectors_are_answered(embedder: Server, path: str, body: dict[str, Any]) -> None:
    response = httpx.post(embedder.url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    vectors = response.json()
    assert len(vectors) == 2 and all(len(vector) == 5 for vector in vectors)
    uncut = {key: value for key, value in body.items() if key != "dimensions"}
    if "parameters" in body:
        uncut["parameters"] = {"normalize": False}
    whole = httpx.post(embedder.url + path, json=uncut, timeout=60).json()
    assert vectors == [vector[:5] for vector in whole]
    jsonschema.Draft4Validator(answer_schema(embedder, path)).validate(vectors)


@pytest.mark.parametrize("body", [{"inputs": "one text"}, {"inputs": "one text", "dimensions": 7},
                                  {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}}])
def test_a_single_answer_matches_exactly_one_arm_of_its_schema(embedder: Server, body: dict[str, Any]) -> None:
    for path in ("/predict", "/"):
        response = httpx.post(embedder.url + path, json=body, timeout=60)
        assert response.status_code == 200, response.text
        jsonschema.Draft4Validator(answer_schema(embedder, path)).validate(response.json())


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embeddings"])
def test_openai_dimensions_are_bounded_as_published(embedder: Server, path: str) -> None:
    spec = httpx.get(embedder.url + "/openapi.json", timeout=60).json()
    request = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    most = request["properties"]["dimensions"]["maximum"]
    assert httpx.post(embedder.url + path, json={"input": "x", "dimensions": most}, timeout=60).status_code == 200
    assert httpx.post(embedder.url + path, json={"input": "x", "dimensions": most + 1}, timeout=60).status_code == 400


def test_metrics_are_documented_as_prometheus_text(embedder: Server) -> None:
    spec = httpx.get(embedder.url + "/openapi.json", timeout=60).json()
    documented = set(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"])
    answered = httpx.get(embedder.url + "/metrics", timeout=60).headers["content-type"]
    assert {media.split(";")[0] for media in documented} == {answered.split(";")[0]} == {"text/plain"}


INVISIBLE = ["\u2063", "\u001d", "\u200b \u200b \u200b", "\u00a0\u2028\ufeff", "\u00ad\u0000"]


@pytest.mark.parametrize("text", INVISIBLE)
def test_invisible_only_texts_are_empty_on_every_text_route(embedder: Server, text: str) -> None:
    spec = httpx.get(embedder.url + "/openapi.json", timeout=60).json()
    for path, body in [("/predict", {"inputs": text}), ("/", {"inputs": [text]}), ("/embed", {"inputs": text}),
                       ("/v1/embeddings", {"input": [text]}), ("/tokenize", {"inputs": text})]:
        request = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert not jsonschema.Draft4Validator(request).is_valid(body), path
        response = httpx.post(embedder.url + path, json=body, timeout=60)
        assert response.status_code == 400 and "empty" in response.text, (path, response.text)
    assert httpx.post(embedder.url + "/predict", json={"inputs": text + "a"}, timeout=60).status_code == 200


def test_every_error_answer_matches_its_documented_schema(embedder: Server) -> None:
    spec = httpx.get(embedder.url + "/openapi.json", timeout=60).json()
    posts = {path: item["post"] for path, item in spec["paths"].items() if "post" in item}
    assert len(posts) >= 8
    for path, operation in posts.items():
        response = httpx.post(embedder.url + path, json={"no such field": 1}, timeout=60)
        documented = operation["responses"].get(str(response.status_code))
        assert response.status_code >= 400 and documented is not None, (path, response.status_code, response.text)
        schema = json_schema(documented["content"]["application/json"]["schema"])
        jsonschema.Draft4Validator(schema).validate(response.json())


def json_schema(doc: Any) -> Any:
    """OpenAPI 3.0's `nullable` as JSON Schema says it."""
    if isinstance(doc, list):
        return [json_schema(item) for item in doc]
    if not isinstance(doc, dict):
        return doc
    schema = {key: json_schema(value) for key, value in doc.items() if key != "nullable"}
    if doc.get("nullable") and "type" in doc:
        schema["type"] = [doc["type"], "null"]
    return schema


def test_the_readme_error_table_is_the_servers() -> None:
    import re
    from pathlib import Path

    from infinity.errors import STATUS, ErrorType

    section = Path(__file__).parents[1].joinpath("README.md").read_text().split("## Errors", 1)[1].split("\n## ", 1)[0]
    rows = {(kind, int(status)) for status, kind in re.findall(r"^\| (\d+) \| `(\w+)` \|", section, re.M)}
    told = {kind for kind, _ in rows}
    for kind, status in STATUS.items():
        if kind not in (ErrorType.CLIENT_CLOSED, ErrorType.HTTP):  # never written to a client / any other status
            assert (kind.value, status) in rows, kind
    assert told <= {kind.value for kind in ErrorType}
