"""AWS Lambda from a container image: a real server takes invocations from a stand-in of Lambda's Runtime API
(written here from AWS's documented API: next invocation, response, invocation error, init error), with the
events API Gateway and function URLs send, and answers them as it answers the same request over HTTP."""
from __future__ import annotations

import base64
import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from infinity.http.awslambda import call
from tests.servers import ROOT, WAIT, running

BODY = json.dumps({"inputs": ["The cat sat on the mat.", "A dog barked."]})
EMBEDDINGS = json.dumps({"input": "Lambda answers this one.", "model": "minilm"})
PER_REQUEST = {"x-request-id", "date", "content-length", "connection", "keep-alive"}  # and every *-time header


def stable(headers: dict[str, str]) -> dict[str, str]:
    """The headers two answers to the same request share."""
    return {k: v for k, v in headers.items() if k not in PER_REQUEST and not k.endswith("-time")}


class RuntimeApi:
    """Lambda's Runtime API, version 2018-06-01, as its reference describes it."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.results: dict[str, queue.Queue[tuple[str, dict[str, str], Any]]] = {}
        self.init_errors: queue.Queue[tuple[dict[str, str], Any]] = queue.Queue()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                assert self.path == "/2018-06-01/runtime/invocation/next"
                request_id, event = api.events.get()  # waits, as Lambda does, for the next invocation
                self.reply(200, event, {"Lambda-Runtime-Aws-Request-Id": request_id,
                                        "Lambda-Runtime-Deadline-Ms": "1795758030000",
                                        "Lambda-Runtime-Invoked-Function-Arn":
                                            "arn:aws:lambda:us-east-1:123456789012:function:infinity",
                                        "Lambda-Runtime-Trace-Id": "Root=1-5bef4de7-ad49b0e87f6ef6c87fc2e700",
                                        "Content-Type": "application/json"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                parts = self.path.removeprefix("/2018-06-01/runtime/").split("/")
                if parts == ["init", "error"]:
                    api.init_errors.put((dict(self.headers), body))
                else:
                    assert parts[0] == "invocation" and parts[2] in ("response", "error"), self.path
                    api.results[parts[1]].put((parts[2], dict(self.headers), body))
                self.reply(202, b'{"status":"OK"}', {"Content-Type": "application/json"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def invoke(self, event: Any) -> tuple[str, str, dict[str, str], Any]:
        """(request id, "response" or "error", the runtime's headers, its payload)."""
        request_id = str(uuid.uuid4())
        self.results[request_id] = queue.Queue()
        self.events.put((request_id, json.dumps(event).encode()))
        kind, headers, payload = self.results[request_id].get(timeout=WAIT)
        return request_id, kind, headers, payload


@pytest.fixture
def runtime() -> Iterator[RuntimeApi]:
    api = RuntimeApi()
    yield api
    api.server.shutdown()


def http_api(path: str, body: str, **headers: str) -> dict[str, Any]:
    """API Gateway HTTP API, payload format 2.0 (the shape of AWS's example event)."""
    host = "r3pmxmplak.execute-api.us-east-1.amazonaws.com"
    return {"version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": "",
            "headers": {"accept": "*/*", "content-length": str(len(body)), "content-type": "application/json",
                        "host": host, "user-agent": "curl/8.5.0", "x-amzn-trace-id": "Root=1-67891233-abcdef",
                        "x-forwarded-for": "203.0.113.7", "x-forwarded-port": "443", "x-forwarded-proto": "https",
                        **headers},
            "requestContext": {"accountId": "123456789012", "apiId": "r3pmxmplak", "domainName": host,
                               "domainPrefix": "r3pmxmplak",
                               "http": {"method": "POST", "path": path, "protocol": "HTTP/1.1",
                                        "sourceIp": "203.0.113.7", "userAgent": "curl/8.5.0"},
                               "requestId": "JKJaXmPLvHcESHA=", "routeKey": "$default", "stage": "$default",
                               "time": "28/Nov/2026:05:40:00 +0000", "timeEpoch": 1795758000000},
            "body": body, "isBase64Encoded": False}


def function_url(path: str, body: str) -> dict[str, Any]:
    """A Lambda function URL's event: payload 2.0, its body base64-encoded here as function URLs may send it."""
    event = http_api(path, body)
    host = "a1b2c3d4e5f6g7h8i9j0.lambda-url.us-east-1.on.aws"
    event["headers"]["host"] = event["requestContext"]["domainName"] = host
    event["requestContext"]["domainPrefix"] = host.split(".")[0]
    event["requestContext"]["apiId"] = host.split(".")[0]
    event.update(body=base64.b64encode(body.encode()).decode(), isBase64Encoded=True)
    return event


def rest_api(path: str, body: str) -> dict[str, Any]:
    """API Gateway REST API, a {proxy+} resource on the stage `prod`."""
    headers = {"Accept": "*/*", "Content-Type": "application/json", "User-Agent": "curl/8.5.0",
               "Host": "abc123.execute-api.us-east-1.amazonaws.com", "X-Forwarded-Proto": "https"}
    return {"resource": "/{proxy+}", "path": path, "httpMethod": "POST", "headers": headers,
            "multiValueHeaders": {k: [v] for k, v in headers.items()}, "queryStringParameters": None,
            "multiValueQueryStringParameters": None, "pathParameters": {"proxy": path.lstrip("/")},
            "stageVariables": None,
            "requestContext": {"resourcePath": "/{proxy+}", "httpMethod": "POST", "path": f"/prod{path}",
                               "stage": "prod", "requestId": "c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
                               "accountId": "123456789012", "apiId": "abc123",
                               "identity": {"sourceIp": "203.0.113.7"}},
            "body": body, "isBase64Encoded": False}


@contextmanager
def on_lambda(artifact: Path, runtime: RuntimeApi, log: Path, *args: str) -> Iterator[str]:
    with running(artifact, log, *args, env={"AWS_LAMBDA_RUNTIME_API": runtime.address}) as server:
        yield server.url


def same_answer(url: str, path: str, body: str, answer: dict[str, Any], headers: dict[str, str]) -> None:
    direct = httpx.post(url + path, content=body, headers={"content-type": "application/json"}, timeout=WAIT)
    assert answer["statusCode"] == direct.status_code
    assert json.loads(answer["body"]) == direct.json()
    assert not answer["isBase64Encoded"]
    assert stable(headers) == stable(dict(direct.headers))
    assert {k for k in headers if k.endswith("-time")} == {k for k in direct.headers if k.endswith("-time")}
    if answer["statusCode"] == 200:
        assert float(headers["x-compute-time"]) > 0


def test_api_gateway_and_function_url_events_are_answered_as_over_http(minilm_fp32_artifact, runtime, tmp_path):
    with on_lambda(minilm_fp32_artifact, runtime, tmp_path / "server.log") as url:
        for event, path, body in [(http_api("/predict", BODY), "/predict", BODY),
                                  (function_url("/predict", BODY), "/predict", BODY),
                                  (http_api("/v1/embeddings", EMBEDDINGS), "/v1/embeddings", EMBEDDINGS),
                                  (function_url("/v1/embeddings", EMBEDDINGS), "/v1/embeddings", EMBEDDINGS)]:
            request_id, kind, _, answer = runtime.invoke(event)
            assert kind == "response", answer
            assert answer["headers"]["x-request-id"] == request_id  # the log line carries Lambda's request id
            same_answer(url, path, body, answer, answer["headers"])

        _, kind, _, answer = runtime.invoke(rest_api("/predict", BODY))
        assert kind == "response"
        headers = {k: v[-1] for k, v in answer["multiValueHeaders"].items()}
        assert headers == answer["headers"]
        same_answer(url, "/predict", BODY, answer, headers)

        bad = json.dumps({"inputs": []})
        _, kind, _, answer = runtime.invoke(http_api("/predict", bad, **{"x-request-id": "mine"}))
        assert kind == "response" and 400 <= answer["statusCode"] < 500 and answer["headers"]["x-request-id"] == "mine"
        same_answer(url, "/predict", bad, answer, answer["headers"])
        _, kind, _, answer = runtime.invoke(http_api("/nowhere", BODY))
        assert (kind, answer["statusCode"]) == ("response", 404)


def test_a_direct_invocation_is_a_predict_body(minilm_fp32_artifact, runtime, tmp_path):
    with on_lambda(minilm_fp32_artifact, runtime, tmp_path / "server.log", "--keep-alive-timeout", "1") as url:
        _, kind, _, answer = runtime.invoke({"inputs": "The cat sat on the mat."})
        assert kind == "response"
        assert answer == httpx.post(url + "/predict", json={"inputs": "The cat sat on the mat."}, timeout=WAIT).json()
        time.sleep(1.5)  # the server closes the loop's idle connection, as after a frozen spell: it opens another
        _, kind, _, again = runtime.invoke({"inputs": "The cat sat on the mat."})
        assert (kind, again) == ("response", answer)
        _, kind, headers, error = runtime.invoke({"inputs": []})
        assert kind == "error" and error["errorType"] == headers["Lambda-Runtime-Function-Error-Type"]
        assert error["errorType"].startswith("4") and error["errorMessage"]


def test_a_bad_artifact_is_reported_as_an_init_error_and_the_process_ends(runtime, tmp_path):
    result = subprocess.run([sys.executable, "-m", "infinity", "serve", str(tmp_path)], cwd=ROOT, timeout=WAIT,
                            env={**os.environ, "AWS_LAMBDA_RUNTIME_API": runtime.address}, capture_output=True)
    assert result.returncode == 1
    headers, error = runtime.init_errors.get(timeout=1)
    assert error["errorType"] == headers["Lambda-Runtime-Function-Error-Type"] == "Runtime.InitError"
    assert "manifest.json" in error["errorMessage"]
    assert runtime.events.empty() and not runtime.results  # it never asked for an invocation


def test_events_map_to_the_request_they_describe() -> None:
    request = call({**http_api("/v1/embeddings", "{}"), "rawQueryString": "a=1&a=2", "cookies": ["s=1", "t=2"]})
    assert (request.shape, request.method, request.target) == ("2.0", "POST", "/v1/embeddings?a=1&a=2")
    assert request.headers["cookie"] == "s=1; t=2"
    rest = {**rest_api("/predict", "{}"), "multiValueQueryStringParameters": {"x": ["1", "2"]}}
    assert call(rest).target == "/predict?x=1&x=2"
    alb = {"requestContext": {"elb": {"targetGroupArn": "arn:aws:elasticloadbalancing:..."}}, "httpMethod": "GET",
           "path": "/health", "queryStringParameters": {}, "headers": {"host": "lb"}, "body": "",
           "isBase64Encoded": False}
    assert (call(alb).shape, call(alb).method, call(alb).target) == ("alb", "GET", "/health")
    assert (call([1, 2]).shape, call([1, 2]).target, call([1, 2]).body) == ("direct", "/predict", b"[1, 2]")
