"""AWS Lambda from a container image: the Runtime API's loop (next invocation, its response or error), each
invocation sent to this same server over loopback as the HTTP request its event describes, and the answer given
back in the event's own shape. Every route, header and status is the HTTP server's own: this is AWS's Lambda Web
Adapter pattern, run in the server's process.

Events: API Gateway HTTP API (payload 2.0) and Lambda function URLs; API Gateway REST API and HTTP API payload 1.0;
Application Load Balancer. Any other event (`aws lambda invoke --payload '{"inputs": ...}'`) is a `/predict` body:
its answer is the invocation's result, and an error status an invocation error."""
from __future__ import annotations

import base64
import http.client
import json
import logging
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("infinity.lambda")

API = "/2018-06-01/runtime"
DIRECT_ROUTE = "/predict"
# what the hop between API Gateway and the function decided, and this loop's own connection decides again
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te", "trailer",
              "proxy-authorization", "proxy-authenticate", "expect"}
TEXT_TYPES = ("application/json", "text/", "application/problem+json")


@dataclass
class Call:
    """The HTTP request an event describes, and the shape its answer goes back in."""
    shape: str  # "2.0" (HTTP API, function URL), "1.0" (REST API, HTTP API 1.0), "alb", or "direct"
    method: str
    target: str  # path and query
    headers: dict[str, str]
    body: bytes


def _body(event: dict[str, Any]) -> bytes:
    body = event.get("body") or ""
    return base64.b64decode(body) if event.get("isBase64Encoded") else str(body).encode()


def _query(pairs: dict[str, Any] | None, multi: dict[str, list[Any]] | None) -> str:
    if multi:
        return urllib.parse.urlencode([(k, v) for k, values in multi.items() for v in values or []])
    return urllib.parse.urlencode(pairs or {})


def call(event: Any) -> Call:
    """The request in an invocation event."""
    if not isinstance(event, dict):
        return Call("direct", "POST", DIRECT_ROUTE, {"content-type": "application/json"}, json.dumps(event).encode())
    context = event.get("requestContext") or {}
    if event.get("version") == "2.0" and "http" in context:
        headers = {k.lower(): str(v) for k, v in (event.get("headers") or {}).items()}
        if event.get("cookies"):
            headers["cookie"] = "; ".join(event["cookies"])
        query = event.get("rawQueryString") or ""
        return Call("2.0", context["http"]["method"], (event.get("rawPath") or "/") + ("?" + query if query else ""),
                    headers, _body(event))
    if "httpMethod" in event:
        multi = event.get("multiValueHeaders")
        headers = ({k.lower(): ", ".join(map(str, v)) for k, v in multi.items()} if multi else
                   {k.lower(): str(v) for k, v in (event.get("headers") or {}).items()})
        query = _query(event.get("queryStringParameters"), event.get("multiValueQueryStringParameters"))
        return Call("alb" if "elb" in context else "1.0", event["httpMethod"],
                    (event.get("path") or "/") + ("?" + query if query else ""), headers, _body(event))
    return Call("direct", "POST", DIRECT_ROUTE, {"content-type": "application/json"}, json.dumps(event).encode())


def answer(shape: str, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> dict[str, Any]:
    """The HTTP answer in the shape API Gateway, a function URL or a load balancer reads."""
    kept = [(k.lower(), v) for k, v in headers if k.lower() not in HOP_BY_HOP]
    content_type = next((v for k, v in kept if k == "content-type"), "")
    text = not body or content_type.startswith(TEXT_TYPES)
    result: dict[str, Any] = {"statusCode": status, "headers": dict(kept),
                              "body": body.decode() if text else base64.b64encode(body).decode(),
                              "isBase64Encoded": not text}
    if shape == "1.0":
        multi: dict[str, list[str]] = {}
        for k, v in kept:
            multi.setdefault(k, []).append(v)
        result["multiValueHeaders"] = multi
    if shape == "alb":
        result["statusDescription"] = f"{status} {reason}"
    return result


class RuntimeApi:
    """The Runtime API's three calls, over one keep-alive connection."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.connection = http.client.HTTPConnection(host, int(port))  # no timeout: /next waits for the next event

    def _send(self, method: str, path: str, body: bytes | None = None,
              headers: dict[str, str] | None = None) -> tuple[http.client.HTTPResponse, bytes]:
        self.connection.request(method, API + path, body, headers or {})
        response = self.connection.getresponse()
        return response, response.read()

    def next(self) -> tuple[str, dict[str, str], bytes]:
        response, body = self._send("GET", "/invocation/next")
        return response.headers["Lambda-Runtime-Aws-Request-Id"], dict(response.headers), body

    def respond(self, request_id: str, payload: Any) -> None:
        self._send("POST", f"/invocation/{request_id}/response", json.dumps(payload).encode(),
                   {"content-type": "application/json"})

    def fail(self, request_id: str | None, kind: str, message: str) -> None:
        """An invocation's error, or with no request id the init error that ends this environment."""
        path = f"/invocation/{request_id}/error" if request_id else "/init/error"
        error = {"errorMessage": message, "errorType": kind, "stackTrace": []}
        self._send("POST", path, json.dumps(error).encode(),
                   {"content-type": "application/json", "Lambda-Runtime-Function-Error-Type": kind})


def forward(server: http.client.HTTPConnection, request: Call, request_id: str) -> tuple[int, str, list[tuple[str,
                                                                                                          str]], bytes]:
    headers = {k: v for k, v in request.headers.items() if k not in HOP_BY_HOP}
    headers.setdefault("x-request-id", request_id)  # the log line and the answer carry Lambda's request id
    try:
        server.request(request.method, request.target, request.body, headers)
        response = server.getresponse()
    except (OSError, http.client.HTTPException):  # the server closed the kept-alive connection: once more
        server.close()
        server.request(request.method, request.target, request.body, headers)
        response = server.getresponse()
    body = response.read()
    if response.will_close:
        server.close()
    return response.status, response.reason, response.getheaders(), body


def serve(runtime: RuntimeApi, server: http.client.HTTPConnection) -> None:
    """Take invocations until the environment ends (Lambda freezes or stops the process)."""
    while True:
        request_id, _, event = runtime.next()
        try:
            request = call(json.loads(event))
            status, reason, headers, body = forward(server, request, request_id)
        except Exception as exc:  # a malformed event, or the server unreachable: this invocation's error
            log.exception("invocation %s failed", request_id)
            runtime.fail(request_id, "Runtime.InvocationError", str(exc) or repr(exc))
            continue
        if request.shape != "direct":
            runtime.respond(request_id, answer(request.shape, status, reason, headers, body))
        elif status < 400:
            runtime.respond(request_id, json.loads(body))
        else:
            runtime.fail(request_id, *direct_error(status, body))


def direct_error(status: int, body: bytes) -> tuple[str, str]:
    """An error answer as an invocation error: ("422.validation", its message)."""
    try:
        error = json.loads(body)
    except ValueError:
        error = None
    if isinstance(error, dict) and "error" in error:
        return f"{status}.{error.get('error_type', 'error')}", str(error["error"])
    return f"{status}.error", body.decode(errors="replace")


def start(address: str, host: str, port: int) -> threading.Thread:
    """The loop on a thread of its own, once the server listens on (host, port)."""
    local = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    thread = threading.Thread(target=serve, args=(RuntimeApi(address), http.client.HTTPConnection(local, port)),
                              name="infinity-lambda", daemon=True)
    thread.start()
    log.info("taking AWS Lambda invocations from %s", address)
    return thread


def init_error(address: str, message: str) -> None:
    """Tell Lambda the function could not start (it then reports the error and ends the environment)."""
    try:
        RuntimeApi(address).fail(None, "Runtime.InitError", message)
    except OSError as exc:
        log.error("could not report the init error to the Runtime API at %s: %s", address, exc)
