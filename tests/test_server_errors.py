"""Every error status, overload, engine failure and client disconnects, over a real ONNX Runtime session."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.routing import Route
from starlette.testclient import TestClient

from infinity.api.app import LastResort, create_app
from infinity.api.openai import OPENAI
from infinity.api.router import Router
from infinity.engine.model import LoadedModel
from infinity.settings import Settings
from tests.servers import until

WAIT = 60.0  # a hang guard, never a performance expectation


class ControlledSession:
    """Wraps the real onnxruntime session: can hold a batch until released, or fail like a lost device."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.rows: list[int] = []
        self.threads: list[str] = []  # the thread each batch ran on
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.fail = False

    def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.rows.append(int(feeds["input_ids"].shape[0]))
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        self.release.wait(WAIT)
        if self.fail:
            raise RuntimeError("CUDA error: device lost")
        return self.real.run(names, feeds)


@pytest.fixture(scope="module")
def model(artifact_for: Any) -> LoadedModel:
    return LoadedModel.load(artifact_for("sequence-classification"), threads=1)


@pytest.fixture()
def session(model: LoadedModel) -> Iterator[ControlledSession]:
    real = model.engine.session
    controlled = ControlledSession(real)
    try:
        yield controlled
    finally:
        controlled.release.set()
        model.engine.session = real


# Tests that hold the engine in a batch send their first request to the engine thread, not the event loop
ON_ENGINE = {"lone_request_tokens": 0}


@pytest.fixture()
def client(model: LoadedModel) -> Iterator[TestClient]:
    settings = Settings(max_payload_bytes=4096, max_inputs_per_request=4, max_batch_size=8, max_queue=2, **ON_ENGINE)
    with TestClient(create_app(Router.build(model, settings))) as test_client:
        yield test_client


def gauge(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def assert_error(response: httpx.Response, status: int, error_type: str) -> dict[str, str]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == error_type
    return body


@pytest.mark.parametrize(("body", "status", "error_type"), [
    (b"{", 422, "validation"),
    (b"\xff\xfe\x00garbage", 422, "validation"),
    (b'{"inputs": "\\ud800"}', 422, "validation"),
    (b"[" * 2000, 422, "validation"),
    (b'{"inputs": 1e999999}', 422, "validation"),
    (b'{"inputs": 123456789012345678901234567890}', 422, "validation"),
    (b'{"inputs": {"nested": [[[{}]]]}}', 422, "validation"),
    (b'"just a string"', 422, "validation"),
    (b"null", 422, "validation"),
    (b"{}", 422, "validation"),
    (b'{"inputs": "hi", "extra": 1}', 422, "validation"),
    (b'{"inputs": "hi", "parameters": []}', 422, "validation"),
    (b'{"inputs": [1, 2]}', 422, "validation"),
    (b'{"inputs": ""}', 400, "empty"),
    (b'{"inputs": "   "}', 400, "empty"),
    (b'{"inputs": "\\u0000\\u0000"}', 400, "empty"),
    (b'{"inputs": ["fine", "\\u200b\\u200d \\ufeff"]}', 400, "empty"),
    (b'{"inputs": []}', 400, "empty"),
    (b'{"inputs": ["a", "b", "c", "d", "e"]}', 413, "payload_too_large"),
    (b'{"inputs": "' + b"x" * 5000 + b'"}', 413, "payload_too_large"),
    (b'{"inputs": "hi", "parameters": {"top_k": 1e300}}', 422, "validation"),
])
def test_bad_bodies_get_json_errors(client: TestClient, body: bytes, status: int, error_type: str) -> None:
    assert_error(client.post("/predict", content=body), status, error_type)
    assert client.post("/predict", json={"inputs": "still serving"}).status_code == 200


def test_unknown_parameters_are_named(client: TestClient) -> None:
    body = assert_error(client.post("/predict", json={"inputs": "hi", "parameters": {"temprature": 1, "top_k": 1}}),
                        422, "validation")
    assert "temprature" in body["error"] and "top_k" not in body["error"].split(";")[0]


def test_input_longer_than_the_model_needs_truncate(client: TestClient, model: LoadedModel) -> None:
    text = "word " * (model.tokenizer.max_length + 10)
    body = assert_error(client.post("/predict", json={"inputs": text, "parameters": {"truncate": False}}),
                        422, "validation")
    assert "truncate" in body["error"]
    assert client.post("/predict", json={"inputs": text}).status_code == 200


def test_a_body_larger_than_declared_is_still_cut_off(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"inputs": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    assert_error(client.post("/predict", content=chunks()), 413, "payload_too_large")


def test_the_content_type_is_not_required(client: TestClient) -> None:
    response = client.post("/predict", content=b'{"inputs": "hello"}', headers={"content-type": "text/plain"})
    assert response.status_code == 200


def test_unknown_routes_and_methods_are_json(client: TestClient) -> None:
    assert_error(client.get("/nope"), 404, "not_found")
    response = client.get("/predict")
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"
    assert_error(client.delete("/health/ready"), 405, "method_not_allowed")


def test_a_method_a_route_does_not_take_is_answered_in_its_familys_shape(client: TestClient) -> None:
    openai = client.get("/v1/embeddings")
    assert openai.status_code == 405 and openai.headers["allow"] == "POST"
    assert openai.json()["error"]["code"] == "method_not_allowed" and set(openai.json()["error"]) == {
        "message", "type", "param", "code"}
    cohere = client.put("/v2/embed")
    assert cohere.status_code == 405 and cohere.json() == {"message": "Method Not Allowed",
                                                           "error_type": "method_not_allowed"}


def test_without_keys_no_route_documents_a_401(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    documented = {(path, method): set(op["responses"]) for path, ops in spec["paths"].items()
                  for method, op in ops.items()}
    assert all("401" not in statuses for statuses in documented.values()), documented


def test_a_full_queue_answers_429_with_retry_after(client: TestClient, model: LoadedModel,
                                                   session: ControlledSession) -> None:
    session.release.clear()
    model.engine.session = session
    with ThreadPoolExecutor(4) as pool:
        running = pool.submit(client.post, "/predict", json={"inputs": "first"})
        until(session.entered.is_set)
        queued = [pool.submit(client.post, "/predict", json={"inputs": f"queued {n}"}) for n in range(2)]
        until(lambda: gauge(client, "infinity_queue_depth") == 2)
        refused = client.post("/predict", json={"inputs": "one too many"})
        session.release.set()
        answers = [f.result(WAIT) for f in [running, *queued]]
    assert_error(refused, 429, "overloaded")
    assert int(refused.headers["retry-after"]) >= 1
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert session.rows == [1, 2]  # the two queued requests shared one batch
    assert 'infinity_failures_total{error_type="overloaded",route="/predict"} 1' in client.get("/metrics").text


def test_lone_small_requests_run_on_the_event_loop_and_overlapping_ones_on_the_engine_thread(
        model: LoadedModel, session: ControlledSession) -> None:
    from infinity.engine.service import LONE_S

    model.engine.session = session
    long_text = "word " * 80  # over the default 64 padded tokens
    with TestClient(create_app(Router.build(model, Settings()))) as client, ThreadPoolExecutor(2) as pool:
        def ran_on(text: str) -> str:
            assert client.post("/predict", json={"inputs": text}).status_code == 200
            return session.threads[-1]

        assert ran_on("short") != "infinity-engine"  # one at a time and small: on the event loop
        assert ran_on(long_text) == "infinity-engine"  # one at a time, but longer
        session.entered.clear()
        session.release.clear()
        running = pool.submit(client.post, "/predict", json={"inputs": long_text})
        until(session.entered.is_set)
        overlapping = pool.submit(client.post, "/predict", json={"inputs": "short"})
        until(lambda: gauge(client, "infinity_queue_depth") == 1)
        session.release.set()
        assert running.result(WAIT).status_code == overlapping.result(WAIT).status_code == 200
        assert session.threads[-2:] == ["infinity-engine", "infinity-engine"]
        assert ran_on("short") == "infinity-engine"  # requests overlapped less than LONE_S ago
        time.sleep(LONE_S)
        assert ran_on("short") != "infinity-engine"
    with TestClient(create_app(Router.build(model, Settings(lone_request_tokens=0)))) as client:
        assert ran_on("short") == "infinity-engine"


def test_an_engine_failure_reaches_every_waiter_and_flips_readiness(client: TestClient, model: LoadedModel,
                                                                    session: ControlledSession) -> None:
    session.release.clear()
    session.fail = True
    model.engine.session = session
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(client.post, "/predict", json={"inputs": "first"})
        until(session.entered.is_set)
        queued = [pool.submit(client.post, "/predict", json={"inputs": f"queued {n}"}) for n in range(2)]
        until(lambda: gauge(client, "infinity_queue_depth") == 2)
        session.release.set()
        answers = [f.result(WAIT) for f in [running, *queued]]
    for answer in answers:
        assert "device lost" in assert_error(answer, 500, "backend")["error"]
    assert_error(client.get("/health/ready"), 503, "unhealthy")  # its probe fails too
    assert client.get("/health/live").status_code == 200
    session.fail = False
    rows_before = len(session.rows)
    assert client.get("/health/ready").status_code == 200  # a real probe pass brings it back
    assert len(session.rows) == rows_before + 1
    assert client.post("/predict", json={"inputs": "after recovery"}).status_code == 200
    assert 'infinity_failures_total{error_type="backend",route="/predict"} 3' in client.get("/metrics").text


def test_a_client_that_disconnects_while_queued_costs_no_compute(model: LoadedModel,
                                                                 session: ControlledSession) -> None:
    app = create_app(Router.build(model, Settings(**ON_ENGINE)))

    async def main() -> None:
        async with app.router.lifespan_context(app) as state:
            session.release.clear()
            model.engine.session = session
            service = state["service"]
            gone = asyncio.Event()

            async def call(text: str, disconnect: asyncio.Event | None) -> list[dict[str, Any]]:
                body = orjson.dumps({"inputs": text})
                sent: list[dict[str, Any]] = []
                delivered = False

                async def receive() -> dict[str, Any]:
                    nonlocal delivered
                    if not delivered:
                        delivered = True
                        return {"type": "http.request", "body": body, "more_body": False}
                    await (disconnect.wait() if disconnect else asyncio.Event().wait())
                    return {"type": "http.disconnect"}

                async def send(message: dict[str, Any]) -> None:
                    sent.append(message)

                scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                         "scheme": "http", "path": "/predict", "raw_path": b"/predict", "query_string": b"",
                         "root_path": "", "headers": [(b"content-length", str(len(body)).encode())],
                         "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": dict(state)}
                await app(scope, receive, send)
                return sent

            first = asyncio.ensure_future(call("first", None))
            while not session.entered.is_set():
                await asyncio.sleep(0.01)
            leaving = asyncio.ensure_future(call("leaves early", gone))
            while service.batcher.depth != 1:
                await asyncio.sleep(0.01)
            gone.set()
            while service.batcher.depth != 0:
                await asyncio.sleep(0.01)
            session.release.set()
            answered = await first
            await leaving
            assert answered[0]["status"] == 200
            assert session.rows == [1]  # only the first request ever reached the engine

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_anything_unexpected_becomes_a_json_500_and_the_app_keeps_serving() -> None:
    async def broken(request: Request) -> None:
        raise KeyError("surprise")

    async def fine(request: Request) -> Any:
        from starlette.responses import PlainTextResponse
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/broken", broken), Route("/fine", fine), Route("/v1/embeddings", broken)],
                    middleware=[Middleware(LastResort, families={"/v1/embeddings": OPENAI})])
    with TestClient(app) as client:
        assert_error(client.get("/broken"), 500, "internal")
        assert client.get("/fine").text == "ok"
        answer = client.get("/v1/embeddings")  # in the route family's shape, as every other error on it
        assert answer.status_code == 500 and answer.json()["error"]["type"] == "server_error"


def test_a_request_before_warm_up_is_503(model: LoadedModel) -> None:
    from infinity.engine.service import Service
    from infinity.errors import NotReady

    async def main() -> None:
        with pytest.raises(NotReady) as caught:
            with Service(model, Settings()).admission():
                pass
        assert caught.value.status_code == 503

    asyncio.run(main())


def test_overload_is_refused_before_the_body_is_read_or_tokenized(model: LoadedModel,
                                                                   session: ControlledSession) -> None:
    """With every permit taken, a request is answered 429 by counting alone: nothing of it is tokenized."""
    settings = Settings(max_queue=1, max_batch_size=1, max_inputs_per_request=1, **ON_ENGINE)
    with TestClient(create_app(Router.build(model, settings))) as client, ThreadPoolExecutor(2) as pool:
        session.release.clear()
        model.engine.session = session
        running = pool.submit(client.post, "/predict", json={"inputs": "first"})
        until(session.entered.is_set)
        queued = pool.submit(client.post, "/v1/rerank", json={"inputs": "second"})  # 404: holds no permit
        assert queued.result(WAIT).status_code == 404
        waiting = pool.submit(client.post, "/predict", json={"inputs": "second"})
        until(lambda: gauge(client, "infinity_queue_depth") == 1)
        tokenized = gauge(client, "infinity_tokenization_duration_seconds_count")
        refused = client.post("/predict", content=b'{"inputs": "' + b"long text " * 200 + b'"}')
        assert gauge(client, "infinity_tokenization_duration_seconds_count") == tokenized
        session.release.set()
        assert [f.result(WAIT).status_code for f in (running, waiting)] == [200, 200]
    assert_error(refused, 429, "overloaded")
    assert "Retry-After" in refused.headers or "retry-after" in refused.headers



def test_an_engine_error_names_no_graph_nodes(model: LoadedModel) -> None:
    from infinity.engine.session import EngineError
    from infinity.engine.tokenization import Batch

    ids = np.array([[101, 10 ** 6, 102]], dtype=np.int64)  # past the vocabulary: onnxruntime refuses it
    with pytest.raises(EngineError) as caught:
        model.engine.run(Batch(ids, np.ones_like(ids), np.zeros_like(ids)), quiet=True)
    assert "out of range" in str(caught.value) and "Name:" not in str(caught.value)
