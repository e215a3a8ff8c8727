"""The managed platforms' contracts, driven over real HTTP the way each platform drives a container: SageMaker
(`<image> serve`, SAGEMAKER_BIND_TO_PORT, /ping, /invocations), Vertex AI (AIP_* routes and port), KServe's Open
Inference Protocol through tritonclient, and the JSON log lines with request ids. Every answer is compared with
/predict's answer from the same server."""
from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jsonschema
import numpy as np
import pytest
import tritonclient.http as triton
import yaml
from tritonclient.utils import InferenceServerException

from bench.process import WAIT, Server, free_port
from tests.servers import ROOT, running, until

TEXTS = ["The cat sat on the mat.", "Quarterly revenue rose four percent."]
VERTEX_PREDICT = "/v1/endpoints/123/deployedModels/456:predict"
VERTEX_HEALTH = "/v1/endpoints/123/deployedModels/456"
INFERENCE_SERVICE = ROOT / "deploy" / "kubernetes" / "kserve" / "inferenceservice.yaml"
CRD_SCHEMA = Path(__file__).parent / "schemas" / "inferenceservice-v1beta1.json.gz"


@contextmanager
def platform_server(argv: list[str], env: dict[str, str], port: int, ready: str, log: Path) -> Iterator[str]:
    """`python -m infinity serve ARGV` with only the platform's variables naming port and routes."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith(("INFINITY_", "AIP_", "SM_",
                                                                                      "SAGEMAKER_"))}
    environ.update({"INFINITY_THREADS": "1", **env})
    server = Server([sys.executable, "-m", "infinity", "serve", *argv], port, cwd=ROOT, log=log, env=environ)
    try:
        server.wait_ready(WAIT, ready)
        yield server.url
    finally:
        server.kill()


def post(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(url, json=body, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def sagemaker(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    # as SageMaker starts the image: the one argument `serve`, its port variable, the model where it unpacks it;
    # the image's own INFINITY_PORT and INFINITY_ARTIFACT give way to them
    port, log = free_port(), tmp_path_factory.mktemp("sagemaker") / "server.log"
    env = {"SAGEMAKER_BIND_TO_PORT": str(port), "SM_MODEL_DIR": str(minilm_fp32_artifact),
           "INFINITY_PORT": str(free_port()), "INFINITY_ARTIFACT": "/nonexistent", "INFINITY_JSON_LOGS": "true"}
    with platform_server(["serve"], env, port, "/ping", log) as url:
        yield url, log


@pytest.fixture(scope="module")
def vertex(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    env = {"AIP_HTTP_PORT": str(port), "AIP_PREDICT_ROUTE": VERTEX_PREDICT, "AIP_HEALTH_ROUTE": VERTEX_HEALTH}
    with platform_server([str(minilm_fp32_artifact)], env, port, VERTEX_HEALTH,
                         tmp_path_factory.mktemp("vertex") / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def ranker(artifact_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    env = {"AIP_HTTP_PORT": str(port), "AIP_PREDICT_ROUTE": VERTEX_PREDICT, "AIP_HEALTH_ROUTE": "/health"}
    with platform_server([str(artifact_for("ranking"))], env, port, "/health",
                         tmp_path_factory.mktemp("ranker") / "server.log") as url:
        yield url


# SageMaker


def test_sagemaker_pings_then_invocations_answer_as_predict(sagemaker: tuple[str, Path]) -> None:
    url, _ = sagemaker
    assert httpx.get(url + "/ping").status_code == 200
    for body in ({"inputs": TEXTS}, {"inputs": TEXTS[0], "parameters": {"normalize": False}},
                 {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}}):
        invoked = post(url + "/invocations", body)
        assert invoked.status_code == 200, invoked.text
        assert invoked.content == post(url + "/predict", body).content


def test_sagemaker_defaults_to_its_payload_limit_and_answers_bad_bodies_with_json(sagemaker: tuple[str, Path]) -> None:
    url, _ = sagemaker
    assert httpx.get(url + "/info").json()["batching"]["max_payload_bytes"] == 6 * 1024 * 1024
    wrong = post(url + "/invocations", {"input": TEXTS})
    assert wrong.status_code == 422 and wrong.json()["error_type"] == "validation"


def test_json_logs_carry_the_request_id_route_status_and_timings(sagemaker: tuple[str, Path]) -> None:
    url, log = sagemaker
    sent = post(url + "/invocations", {"inputs": TEXTS}, **{"x-request-id": "req-7f3a"})
    assert sent.headers["x-request-id"] == "req-7f3a"
    generated = httpx.get(url + "/ping").headers["x-request-id"]
    assert len(generated) == 32 and generated != "req-7f3a"
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(line) for line in log.read_text().splitlines()]  # every line is one JSON object
        mine = [line for line in lines if line.get("request_id") == "req-7f3a"]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    (line,) = mine
    assert line["logger"] == "infinity.request" and line["level"] == "info"
    assert (line["route"], line["status"], line["method"]) == ("/invocations", 200, "POST")
    assert line["total_ms"] >= line["inference_ms"] > 0 and line["queue_ms"] >= 0
    assert {"time", "message"} <= set(line)


def test_request_lines_of_one_turn_of_the_event_loop_go_out_in_one_write(monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    from infinity.logs import request_line

    class Stderr:
        writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return len(text)

    caplog.set_level("INFO", logger="infinity.request")
    monkeypatch.setattr(sys, "stderr", Stderr())

    async def turn() -> list[str]:
        for status in (200, 422, 429):
            request_line(f"POST /embed {status}", {"status": status})
        written_during_the_turn = list(Stderr.writes)
        await asyncio.sleep(0)
        return written_during_the_turn

    assert asyncio.run(turn()) == []
    (written,) = Stderr.writes
    assert [json.loads(line)["status"] for line in written.splitlines()] == [200, 422, 429]
    request_line("POST /embed 200", {"status": 200})  # off the event loop: at once
    assert len(Stderr.writes) == 2 and json.loads(Stderr.writes[1])["status"] == 200


# Vertex AI


def test_vertex_serves_its_routes_from_the_aip_variables(vertex: str) -> None:
    assert httpx.get(vertex + VERTEX_HEALTH).status_code == 200
    body = {"instances": TEXTS, "parameters": {"normalize": False}}
    answer = post(vertex + VERTEX_PREDICT, body)
    assert answer.status_code == 200, answer.text
    predicted = post(vertex + "/predict", {"inputs": TEXTS, "parameters": {"normalize": False}}).json()
    assert answer.json() == {"predictions": predicted}


def test_vertex_refuses_too_many_inputs_and_bad_instances(vertex: str) -> None:
    too_many = post(vertex + VERTEX_PREDICT, {"instances": [TEXTS] * 300})  # 600 texts, 512 allowed
    assert too_many.status_code == 413 and "limit is 512" in too_many.json()["error"]
    assert post(vertex + VERTEX_PREDICT, {"instances": [3]}).status_code == 422
    assert post(vertex + VERTEX_PREDICT, {"inputs": TEXTS}).status_code == 422


def test_vertex_ranks_each_instance_as_predict_does(ranker: str) -> None:
    instance = {"query": "where do cats sit?", "texts": TEXTS}
    answer = post(ranker + VERTEX_PREDICT, {"instances": [instance], "parameters": {"return_text": True}})
    assert answer.status_code == 200, answer.text
    alone = post(ranker + "/predict", {"inputs": instance, "parameters": {"return_text": True}}).json()
    assert answer.json() == {"predictions": [alone]}


def test_vertex_gives_each_instance_its_entities_as_predict_does(artifact_for: Any, tmp_path: Path) -> None:
    with running(artifact_for("token-classification"), tmp_path / "server.log") as server:
        body = {"instances": TEXTS, "parameters": {"aggregation_strategy": "simple"}}
        answer = post(server.url + "/vertex/predict", body)
        assert answer.status_code == 200, answer.text
        alone = [post(server.url + "/predict", {"inputs": text, "parameters": {"aggregation_strategy": "simple"}})
                 .json() for text in TEXTS]
        assert httpx.get(server.url + "/v2/models/model").status_code == 404  # no tensors for this task
    assert answer.json() == {"predictions": alone}


# KServe Open Inference Protocol v2


def model_name(url: str, key: str = "") -> str:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return str(httpx.get(url + "/info", headers=headers).json()["model"]["id"])


def texts_input(name: str, texts: list[str]) -> triton.InferInput:
    tensor = triton.InferInput(name, [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=False)
    return tensor


def test_kserve_v2_client_gets_the_embeddings_predict_gives(vertex: str) -> None:
    client = triton.InferenceServerClient(vertex.removeprefix("http://"))
    name = model_name(vertex)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(name)
    metadata = client.get_model_metadata(name)
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    result = client.infer(name, [texts_input("text", TEXTS)],
                          outputs=[triton.InferRequestedOutput("embedding", binary_data=False)], request_id="r1")
    embeddings = result.as_numpy("embedding")
    assert embeddings.dtype == np.float32 and embeddings.shape == (2, 384)
    predicted = np.array(post(vertex + "/predict", {"inputs": TEXTS}).json(), dtype=np.float32)
    assert np.array_equal(embeddings, predicted)
    assert result.get_response()["id"] == "r1"


def test_kserve_answers_bad_tensors_and_unknown_models_in_its_error_shape(vertex: str) -> None:
    client = triton.InferenceServerClient(vertex.removeprefix("http://"))
    with pytest.raises(InferenceServerException, match="inputs\\[0\\].name must be one of text"):
        client.infer(model_name(vertex), [texts_input("sentence", TEXTS)])
    url = f"{vertex}/v2/models/{model_name(vertex)}/infer"
    wrong_shape = post(url, {"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": TEXTS}]})
    assert wrong_shape.status_code == 400 and "shape [3] but 2 elements" in wrong_shape.json()["error"]
    text = {"name": "text", "shape": [2], "datatype": "BYTES", "data": TEXTS}
    twice = post(url, {"inputs": [text, text]})
    assert twice.status_code == 400 and "repeated input 'text'" in twice.json()["error"]
    assert httpx.get(f"{vertex}/v2/models/another-model/ready").status_code == 404


@pytest.mark.parametrize("platform", ["vertex", "kserve"])
def test_a_too_long_input_is_told_to_set_the_platforms_truncate_parameter(vertex: str, platform: str) -> None:
    long = "alpha " * 400
    if platform == "vertex":
        url, body = vertex + VERTEX_PREDICT, {"instances": ["short", long]}
    else:
        url = f"{vertex}/v2/models/{model_name(vertex)}/infer"
        body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["short", long]}]}
    refused = post(url, {**body, "parameters": {"truncate": False}})
    assert refused.status_code == (422 if platform == "vertex" else 400) and refused.json()["error"] == (
        "input 1 has 402 tokens, more than the model's maximum of 256; send shorter text or set "
        '"parameters": {"truncate": true}'), refused.text
    assert post(url, {**body, "parameters": {"truncate": True}}).status_code == 200


def test_kserve_ranking_scores_equal_predicts(ranker: str) -> None:
    client = triton.InferenceServerClient(ranker.removeprefix("http://"))
    result = client.infer(model_name(ranker), [texts_input("query", ["where do cats sit?"]),
                                               texts_input("text", TEXTS)])
    scores = result.as_numpy("scores")
    ranked = post(ranker + "/predict", {"inputs": {"query": "where do cats sit?", "texts": TEXTS}}).json()
    expected = np.zeros(len(TEXTS), dtype=np.float32)
    for item in ranked:
        expected[item["index"]] = item["score"]
    assert scores.shape == (2,) and np.array_equal(scores, expected)


def test_kserve_classification_scores_are_predicts_in_label_order(artifact_for: Any, tmp_path: Path) -> None:
    with running(artifact_for("sequence-classification"), tmp_path / "server.log") as server:
        client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
        name = model_name(server.url)
        result = client.infer(name, [texts_input("text", TEXTS), texts_input("text_pair", TEXTS[::-1])],
                              parameters={"function_to_apply": "sigmoid"})
        scores = result.as_numpy("scores")
        labels = httpx.get(server.url + "/info").json()["labels"]
        inputs = [{"text": text, "text_pair": pair} for text, pair in zip(TEXTS, TEXTS[::-1])]
        predicted = post(server.url + "/predict", {"inputs": inputs,
                                                   "parameters": {"function_to_apply": "sigmoid"}}).json()
    expected = np.array([[next(item["score"] for item in answer if item["label"] == labels[str(i)])
                          for i in range(len(labels))] for answer in predicted], dtype=np.float32)
    assert scores.shape == (2, len(labels)) and np.array_equal(scores, expected)


def test_openapi_lists_every_platform_route(vertex: str) -> None:
    paths = httpx.get(vertex + "/openapi.json").json()["paths"]
    name = model_name(vertex)
    for path in ("/invocations", "/ping", VERTEX_PREDICT, VERTEX_HEALTH, "/v2/health/live", "/v2/health/ready",
                 f"/v2/models/{name}", f"/v2/models/{name}/ready", f"/v2/models/{name}/infer"):
        assert path in paths, path
    # each body is judged by the published schema and by the server; the verdicts must match
    text = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}
    bodies = {VERTEX_PREDICT: [{"instances": ["a"]}, {"instances": []}, {"instances": [3]}, {"instances": [""]},
                               {"instances": ["a"], "parameters": {"normalize": "yes"}}, {"instances": ["a"] * 513},
                               {"instances": [{"source_sentence": "a", "sentences": ["b"]}]}],
              f"/v2/models/{name}/infer": [{"inputs": [text]}, {"inputs": [{**text, "datatype": "FP32"}]},
                                           {"inputs": [{**text, "data": [""]}]}, {"inputs": []},
                                           {"inputs": [text], "outputs": [{"name": "embedding"}]},
                                           {"inputs": [text], "outputs": [{"name": "scores"}]},
                                           {"inputs": [text], "id": "x", "parameters": {"normalize": False}}]}
    for path, cases in bodies.items():
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        for body in cases:
            documented = jsonschema.Draft4Validator(schema).is_valid(body)
            status = post(vertex + path, body).status_code
            assert documented == (status == 200), (path, body, status)


def test_api_keys_guard_the_platform_routes_but_not_their_probes(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--api-key", "k1") as server:
        name = model_name(server.url, key="k1")
        for path in ("/ping", "/vertex/health", "/v2/health/live", "/v2/health/ready", f"/v2/models/{name}/ready"):
            assert httpx.get(server.url + path).status_code == 200, path
        for path in ("/v2", f"/v2/models/{name}"):
            assert httpx.get(server.url + path).status_code == 401, path
        text = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}
        for path, body in (("/invocations", {"inputs": "a"}), ("/vertex/predict", {"instances": ["a"]}),
                           (f"/v2/models/{name}/infer", {"inputs": [text]})):
            refused = post(server.url + path, body)
            assert refused.status_code == 401 and "API key" in refused.json()["error"], path
            assert post(server.url + path, body, authorization="Bearer k1").status_code == 200, path


# the InferenceService manifest


def strict(schema: Any) -> Any:
    """The CRD's structural schema, refusing fields it does not know (as kubectl's strict validation does)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: strict(value) for key, value in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema["additionalProperties"] = False
    return schema


def test_the_inference_service_is_valid_against_kserves_crd() -> None:
    schema = strict(json.loads(gzip.decompress(CRD_SCHEMA.read_bytes())))
    (service,) = [doc for doc in yaml.safe_load_all(INFERENCE_SERVICE.read_text()) if doc]
    metadata = service.pop("metadata")
    schema["properties"].pop("metadata")
    jsonschema.validate(service, schema)
    assert metadata["name"] and service["kind"] == "InferenceService"
    (container,) = service["spec"]["predictor"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert [port["containerPort"] for port in container["ports"]] == [8080]


def test_the_manifest_check_catches_an_unknown_field() -> None:
    schema = strict(json.loads(gzip.decompress(CRD_SCHEMA.read_bytes())))
    (service,) = [doc for doc in yaml.safe_load_all(INFERENCE_SERVICE.read_text()) if doc]
    service.pop("metadata")
    schema["properties"].pop("metadata")
    service["spec"]["predictor"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(service, schema)


# what the platform decides, what it implies, and what still wins


def settings_for(argv: list[str], environ: dict[str, str]) -> Any:
    from infinity.cli import build_parser, settings_from

    return settings_from(build_parser().parse_args(["serve", *argv]), environ)


def test_sagemakers_port_beats_the_images_variable_and_a_flag_beats_both() -> None:
    environ = {"SAGEMAKER_BIND_TO_PORT": "9001", "INFINITY_PORT": "8080", "INFINITY_HOST": "10.0.0.1"}
    settings = settings_for(["serve"], environ)
    assert (settings.port, settings.host) == (9001, "10.0.0.1")
    assert (settings.max_payload_bytes, settings.request_timeout) == (6 * 1024 * 1024, 60.0)
    assert settings_for(["serve", "--port", "9002"], environ).port == 9002
    assert settings_for(["serve"], {}).port == 8080 and settings_for(["serve"], {}).host == "0.0.0.0"
    own_limit = settings_for(["serve"], {**environ, "INFINITY_MAX_PAYLOAD_BYTES": "1000"})
    assert own_limit.max_payload_bytes == 1000
    plain = settings_for(["/models/a"], {"INFINITY_PORT": "8081"})
    assert (plain.port, plain.host, plain.request_timeout) == (8081, "127.0.0.1", 0.0)


def test_vertex_variables_name_the_port_and_routes() -> None:
    settings = settings_for(["/models/a"], {"AIP_HTTP_PORT": "7080", "AIP_PREDICT_ROUTE": "/p",
                                            "AIP_HEALTH_ROUTE": "/h", "INFINITY_PORT": "8080"})
    assert (settings.port, settings.vertex_predict_route, settings.vertex_health_route) == (7080, "/p", "/h")
    assert settings.host == "0.0.0.0" and settings.max_payload_bytes == 1_572_864


def test_lambda_and_cloud_run_variables_name_the_runtime_api_and_the_port() -> None:
    on_lambda = settings_for(["/models/a"], {"AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001", "INFINITY_PORT": "8080",
                                             "INFINITY_HOST": "0.0.0.0"})  # as the image sets it
    assert (on_lambda.lambda_runtime_api, on_lambda.port, on_lambda.host) == ("127.0.0.1:9001", 8080, "127.0.0.1")
    assert on_lambda.max_payload_bytes == 6 * 1024 * 1024  # a synchronous invocation's limit
    assert settings_for(["/models/a"], {}).lambda_runtime_api is None
    cloud_run = settings_for(["/models/a"], {"K_SERVICE": "embed", "PORT": "7000", "INFINITY_PORT": "8080"})
    assert (cloud_run.port, cloud_run.host) == (7000, "0.0.0.0")
    assert settings_for(["/models/a"], {"PORT": "7000"}).port == 8080  # PORT alone is anybody's


def test_serve_alone_takes_sagemakers_model_dir_only_if_it_holds_an_artifact(tmp_path: Path) -> None:
    from infinity.cli import artifact_dir, build_parser

    args = build_parser().parse_args(["serve", "serve"])
    environ = {"SM_MODEL_DIR": str(tmp_path), "INFINITY_ARTIFACT": "/model"}
    assert artifact_dir(args, environ) == "/model"  # an image with a baked artifact and no model data
    (tmp_path / "manifest.json").write_text("{}")
    assert artifact_dir(args, environ) == str(tmp_path)
    assert artifact_dir(build_parser().parse_args(["serve", "/elsewhere"]), environ) == "/elsewhere"


def test_a_vertex_route_that_another_route_has_is_refused_at_start(minilm_fp32_artifact: Path) -> None:
    environ = {**os.environ, "INFINITY_THREADS": "1", "AIP_HTTP_PORT": str(free_port()),
               "AIP_PREDICT_ROUTE": "/predict"}
    done = subprocess.run([sys.executable, "-m", "infinity", "serve", str(minilm_fp32_artifact)], check=False,
                          cwd=ROOT, env=environ, capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 1
    assert "the Vertex AI predict route /predict is taken by another route" in done.stderr


def test_a_request_past_request_timeout_is_answered_504(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    long_texts = [f"sentence {i} " + "about cats and mats " * 40 for i in range(32)]  # tokenized off the event loop
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--request-timeout", "0.000001") as server:
        late = post(server.url + "/invocations", {"inputs": long_texts})
        assert late.status_code == 504 and late.json()["error_type"] == "timeout"
        assert "request_timeout" in late.json()["error"]
    with running(minilm_fp32_artifact, tmp_path / "server.log") as server:
        assert post(server.url + "/invocations", {"inputs": long_texts}).status_code == 200


# OpenTelemetry traces


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP receiver: keeps every span posted to /v1/traces, and the target and headers of each post;
    answers the first `busy` posts 503. With `keep_alive`, a connection is kept for that many posts, then closed
    without a word, as a collector closes an idle one."""

    def __init__(self, busy: int = 0, keep_alive: int = 0) -> None:
        super().__init__(("127.0.0.1", 0), CollectorHandler)
        self.spans: list[Any] = []
        self.posts: list[dict[str, str]] = []
        self.targets: list[str] = []
        self.busy = busy
        self.keep_alive = keep_alive
        self.connections = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class CollectorHandler(BaseHTTPRequestHandler):
    server: Collector

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1
        self.kept = 0
        if self.server.keep_alive:
            self.protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["content-length"]))
        self.server.posts.append({name.lower(): value for name, value in self.headers.items()})
        self.server.targets.append(self.path)
        self.kept += 1
        if self.server.keep_alive and self.kept >= self.server.keep_alive:
            self.close_connection = True  # after this answer, which does not say so
        if len(self.server.posts) <= self.server.busy:
            self.send_response(503)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        self.server.resources = [resource.resource for resource in request.resource_spans]
        self.server.spans += [span for resource in request.resource_spans for scope in resource.scope_spans
                              for span in scope.spans]
        self.send_response(200 if urlsplit(self.path).path == "/v1/traces" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture()
def collector() -> Iterator[Collector]:
    server = Collector()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_request_becomes_a_span_with_its_stages_under_the_callers_trace(minilm_fp32_artifact: Path, tmp_path: Path,
                                                                         collector: Collector) -> None:
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with running(minilm_fp32_artifact, tmp_path / "server.log", env=env) as server:
        answer = post(server.url + "/predict", {"inputs": TEXTS}, traceparent=f"00-{trace_id}-{parent_id}-01")
        assert answer.status_code == 200
        assert post(server.url + "/predict", {"input": TEXTS}).status_code == 422
        deadline = time.monotonic() + 10
        while len([span for span in collector.spans if span.name == "POST /predict"]) < 2 \
                and time.monotonic() < deadline:
            time.sleep(0.05)
    requests = [span for span in collector.spans if span.name == "POST /predict"]
    (request,) = [span for span in requests if span.trace_id.hex() == trace_id]
    (refused,) = [span for span in requests if span.trace_id.hex() != trace_id]
    assert not refused.parent_span_id  # no caller's trace: a trace of its own
    assert {(a.key, a.value.int_value) for a in refused.attributes} >= {("http.response.status_code", 422)}
    assert not [span for span in collector.spans if span.parent_span_id == refused.span_id]
    assert request.trace_id.hex() == trace_id and request.parent_span_id.hex() == parent_id
    assert request.kind == request.SPAN_KIND_SERVER
    children = sorted((span for span in collector.spans if span.parent_span_id == request.span_id),
                      key=lambda span: span.start_time_unix_nano)
    assert [span.name for span in children] == ["tokenization", "queue", "inference", "post-processing"]
    for earlier, later in itertools.pairwise(children):
        assert earlier.end_time_unix_nano == later.start_time_unix_nano
    assert request.start_time_unix_nano <= children[0].start_time_unix_nano
    assert children[-1].end_time_unix_nano <= request.end_time_unix_nano
    inference = children[2]
    assert abs((inference.end_time_unix_nano - inference.start_time_unix_nano) / 1e6
               - float(answer.headers["x-inference-time"])) < 0.001
    assert all(span.trace_id.hex() == trace_id for span in children)
    assert ("service.name", "infinity") in {(a.key, a.value.string_value) for a in collector.resources[0].attributes}


MEASURED = {"compute_ms": 3.0, "tokenization_ms": 0.25, "queue_ms": 0.5, "inference_ms": 2.0}


def test_spans_written_as_wire_bytes_read_back_as_the_messages_opentelemetry_defines() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

    from infinity.tracing import Tracing

    tracing = Tracing("http://127.0.0.1:9")
    tracing.close()
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    path = "/" + "x" * 200  # a name longer than one byte can count
    taken = [(("POST", path, caller, "vendor=x", 1_000), 503, MEASURED, 9_000_000),
             (("POST", "/embed", None, None, 2_000), 200, {}, 3_000)]
    request = ExportTraceServiceRequest.FromString(tracing.encode(taken))
    (resource,) = request.resource_spans
    (scope,) = resource.scope_spans
    assert scope.scope.name == "infinity"
    server, *stages, alone = scope.spans
    assert (server.name, server.kind, server.status.code) == (f"POST {path}", Span.SPAN_KIND_SERVER,
                                                              Status.STATUS_CODE_ERROR)
    assert server.trace_id.hex() == caller[3:35] and server.parent_span_id.hex() == caller[36:52]
    assert (server.start_time_unix_nano, server.end_time_unix_nano) == (1_000, 9_000_000)
    assert server.trace_state == "vendor=x"
    assert server.flags == 0x300  # the context's remoteness known, and remote
    assert {(a.key, a.value.string_value or a.value.int_value) for a in server.attributes} == {
        ("http.request.method", "POST"), ("url.path", path), ("http.response.status_code", 503)}
    assert [(s.name, s.kind, s.parent_span_id, s.trace_id, s.flags) for s in stages] == [
        (name, Span.SPAN_KIND_INTERNAL, server.span_id, server.trace_id, 0x100)
        for name in ("tokenization", "queue", "inference", "post-processing")]
    assert stages[-1].end_time_unix_nano == 9_000_000 and stages[0].start_time_unix_nano == 9_000_000 - 3_500_000
    assert (alone.name, alone.parent_span_id, alone.status.code, alone.flags) == ("POST /embed", b"",
                                                                                  Status.STATUS_CODE_UNSET, 0x100)
    assert len({server.span_id, alone.span_id, *(s.span_id for s in stages)}) == 6


def test_the_sampler_resource_and_exporter_variables_are_those_of_any_opentelemetry_sdk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from infinity.tracing import Tracing

    sampled, unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", \
        "00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    collector = Collector(busy=1)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        for name, value in {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0",
                            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-tenant=t1,authorization=Bearer%20k",
                            "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_BSP_SCHEDULE_DELAY": "10",
                            "OTEL_SERVICE_NAME": "embedder"}.items():
            monkeypatch.setenv(name, value)
        tracing = Tracing(collector.url)
        for traceparent in (sampled, unsampled, None):  # ratio 0: only the caller's sampled trace is kept
            tracing.finish(tracing.start("POST", "/embed", traceparent, "vendor=x"), 200, MEASURED)
        until(lambda: collector.spans)
        tracing.close()
    finally:
        collector.shutdown()
        collector.server_close()
    busy, taken = collector.posts  # the 503 is retried
    assert taken["content-encoding"] == "gzip" and taken["x-tenant"] == "t1"
    assert taken["authorization"] == "Bearer k" and taken["content-type"] == "application/x-protobuf"
    assert {span.trace_id.hex() for span in collector.spans} == {"4bf92f3577b34da6a3ce929d0e0e4736"}
    assert len(collector.spans) == 5 and {span.trace_state for span in collector.spans} == {"vendor=x"}
    (resource,) = collector.resources
    assert ("service.name", "embedder") in {(a.key, a.value.string_value) for a in resource.attributes}


def test_batches_share_a_connection_and_one_the_collector_closed_is_opened_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from infinity.tracing import Tracing

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.45")  # no time to retry: a closed one is replaced at once
    collector = Collector(keep_alive=2)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        tracing = Tracing(collector.url)
        for _ in range(3):  # a batch each; the third finds its connection closed
            tracing.finish(tracing.start("POST", "/embed", None, None), 200, MEASURED)
            until(lambda: not tracing.noted)  # taken: the next is a batch of its own
        tracing.close()
    finally:
        collector.shutdown()
        collector.server_close()
    assert collector.connections == 2 and len(collector.spans) == 15


def test_a_proxy_that_the_usual_variables_name_carries_the_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    from infinity.tracing import Tracing

    proxy = Collector()  # answers as the collector behind it would
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    for name in ("HTTP_PROXY", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    try:
        tracing = Tracing("http://collector.invalid:4318")
        tracing.finish(tracing.start("POST", "/embed", None, None), 200, MEASURED)
        until(lambda: proxy.spans)
        tracing.close()
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert proxy.targets == ["http://collector.invalid:4318/v1/traces"] and len(proxy.spans) == 5


def test_an_absent_collector_costs_the_requests_nothing_and_stops_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from infinity.tracing import Tracing

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    tracing = Tracing(f"http://127.0.0.1:{free_port()}")
    for _ in range(3):
        tracing.finish(tracing.start("POST", "/embed", None, None), 200, MEASURED)
    until(lambda: not tracing.noted)  # taken by the export thread, which retries
    started = time.monotonic()
    tracing.close()
    assert time.monotonic() - started < 2  # the retries end as the server stops (the timeout is 10 s)
    assert not tracing.worker.is_alive()


def test_a_variable_that_is_not_a_number_stops_the_start_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from infinity.errors import StartupError
    from infinity.tracing import Tracing

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "5s")
    with pytest.raises(StartupError, match="OTEL_BSP_SCHEDULE_DELAY=5s is not a whole number"):
        Tracing("http://127.0.0.1:4318")


def test_with_tracing_off_no_span_is_made_and_opentelemetry_is_never_imported() -> None:
    from infinity.observe import Observers
    from infinity.settings import Settings

    assert Observers.from_settings(Settings()).tracing is None
    imports = ("import sys, infinity.cli, infinity.api.app; "
               "print(sorted(m for m in sys.modules if 'opentel' in m))")
    lean = subprocess.run([sys.executable, "-c", imports], check=False, cwd=ROOT, capture_output=True, text=True,
                          timeout=WAIT)
    assert lean.stdout.strip() == "[]", lean.stderr
