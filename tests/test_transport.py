"""The transport against hostile and careless clients, on real servers over real sockets: what HTTP/1.1 refuses is
refused in JSON, stalled bodies hold no permit in flight, a missing key is 401 before anything else, and a request
takes the same path and gets the same answer with and without API keys."""
from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from infinity.http.heads import refusal
from tests.servers import WAIT, Reader, Server, running

KEY = "secret-key"
AUTH = f"Authorization: Bearer {KEY}\r\n"
LONG = " ".join(["a long sentence that fills the model's whole context window"] * 40)


def post(body: bytes, path: str = "/predict", extra: str = "", line: str = "HTTP/1.1", host: bool = True) -> bytes:
    return (f"POST {path} {line}\r\n{'Host: x' + chr(13) + chr(10) if host else ''}{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)


def status(head: bytes) -> int:
    return int(head.split(b" ", 2)[1])


def exchange(server: Server, request: bytes) -> tuple[int, dict[str, object], bytes]:
    """Send raw bytes; the status, the JSON body and the head of the one answer."""
    with connect(server) as sock:
        sock.sendall(request)
        head, body = Reader(sock).response()
    assert b"content-type: application/json" in head.lower(), head
    return status(head), orjson.loads(body), head


@pytest.fixture(scope="module")
def server(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(minilm_fp32_artifact, tmp_path_factory.mktemp("transport") / "server.log") as started:
        yield started


@pytest.fixture(scope="module")
def keyed(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(minilm_fp32_artifact, tmp_path_factory.mktemp("keyed") / "server.log", "--api-key", KEY) as started:
        yield started


@pytest.mark.parametrize("version, headers, upgrade, expected", [
    ("1.1", [(b"host", b"x")], False, None),
    ("1.0", [], False, None),
    ("1.1", [(b"host", b"x"), (b"transfer-encoding", b"chunked")], False, None),
    ("2.0", [(b"host", b"x")], False, 505),
    ("1.1", [], False, 400),
    ("1.1", [(b"host", b"x"), (b"host", b"y")], False, 400),
    ("1.1", [(b"host", b"x"), (b"transfer-encoding", b"gzip, chunked")], False, 501),
    ("1.1", [(b"host", b"x")], True, 400),
])
def test_what_http_1_1_refuses(version: str, headers: list[tuple[bytes, bytes]], upgrade: bool,
                               expected: int | None) -> None:
    refused = refusal(version, headers, upgrade)
    assert (refused[0] if refused else None) == expected


@pytest.mark.parametrize("request_bytes, expected", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"POST /predict HTTP/1.1\r\nHost x\r\nContent-Length: 2\r\n\r\n{}", 400),
    (post(b'{"inputs": "a"}', line="HTTP/2.0"), 505),
    (post(b'{"inputs": "a"}', host=False), 400),
    (b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 501),
    (post(b'{"inputs": "a"}', extra="Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AA\r\n"),
     400),
])
def test_requests_http_refuses_get_a_json_error(server: Server, request_bytes: bytes, expected: int) -> None:
    code, body, _ = exchange(server, request_bytes)
    assert code == expected and body["error_type"] == "bad_request" and body["error"]


def test_http_layer_errors_take_the_route_familys_shape(server: Server) -> None:
    code, body, _ = exchange(server, post(b'{"input": "a"}', path="/v1/embeddings", line="HTTP/2.0"))
    assert code == 505 and body["error"]["code"] == "bad_request"  # type: ignore[index]


def test_a_trailing_slash_is_a_json_404_not_a_redirect(server: Server) -> None:
    answer = httpx.post(f"{server.url}/predict/", json={"inputs": "a"}, timeout=WAIT)
    assert answer.status_code == 404 and answer.json()["error_type"] == "not_found"


STALLED = {
    "close": b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nConnection: close\r\n\r\n",
    "chunked": b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    "expect": b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n",
    "keep-alive": b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n",
}


@pytest.mark.parametrize("with_keys", [False, True])
def test_stalled_bodies_take_no_place_in_flight(server: Server, keyed: Server, with_keys: bool) -> None:
    """More stalled bodies than the places in flight (max_queue 128 + max_batch_size 32): every kind of head
    that announces a body and never sends it leaves the server answering a well-behaved client."""
    started = keyed if with_keys else server
    extra = AUTH if with_keys else ""
    stalled = []
    try:
        for kind in STALLED.values():
            for _ in range(45):
                sock = connect(started)
                sock.sendall(kind.replace(b"Host: x\r\n", f"Host: x\r\n{extra}".encode()))
                stalled.append(sock)
        time.sleep(0.3)  # every head has arrived and been parsed
        headers = {"authorization": f"Bearer {KEY}"} if with_keys else {}
        answer = httpx.post(f"{started.url}/predict", json={"inputs": ["a", "b"]}, headers=headers, timeout=WAIT)
        assert answer.status_code == 200 and len(answer.json()) == 2
        if with_keys:
            keyless = httpx.post(f"{started.url}/predict", json={"inputs": "a"}, timeout=WAIT)
            assert keyless.status_code == 401
    finally:
        for sock in stalled:
            sock.close()


def _fill(started: Server) -> list[socket.socket]:
    """A --max-queue 1 server made full: one long batch running in the engine, one request queued behind it."""
    running_one, queued = connect(started), connect(started)
    running_one.sendall(post(orjson.dumps({"inputs": [LONG] * 32}), extra=AUTH))
    time.sleep(0.3)  # the engine takes the first long before the second arrives
    queued.sendall(post(b'{"inputs": "queued behind it"}', extra=AUTH))
    deadline = time.monotonic() + WAIT
    while "infinity_queue_depth 1" not in httpx.get(f"{started.url}/metrics", headers={
            "authorization": f"Bearer {KEY}"}, timeout=WAIT).text:
        assert time.monotonic() < deadline, "the server never filled"
        time.sleep(0.005)
    return [running_one, queued]


def test_a_missing_key_is_401_even_when_the_server_is_full(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--api-key", KEY, "--max-queue", "1") as started:
        taken = _fill(started)
        try:
            keyless_code, keyless, _ = exchange(started, post(b'{"inputs": "no key"}'))
            wrong_code, _, _ = exchange(started, post(b'{"inputs": "wrong"}', extra="Authorization: Bearer nope\r\n"))
            keyed_code, keyed_body, _ = exchange(started, post(b'{"inputs": "a key"}', extra=AUTH))
        finally:
            for sock in taken:
                with sock:
                    Reader(sock).response()
        metrics = httpx.get(f"{started.url}/metrics", headers={"authorization": f"Bearer {KEY}"}, timeout=WAIT).text
    assert (keyless_code, wrong_code, keyed_code) == (401, 401, 429)
    assert keyless["error_type"] == "unauthorized" and keyed_body["error_type"] == "overloaded"
    assert 'infinity_requests_total{route="/predict",status="401"} 2.0' in metrics


def _answer(started: Server, extra: str) -> tuple[bytes, bytes]:
    with connect(started) as sock:
        sock.sendall(post(b'{"inputs": "the same text with and without keys"}', extra=extra))
        return Reader(sock).response()


def test_a_request_gets_the_same_answer_with_and_without_api_keys(server: Server, keyed: Server) -> None:
    def counted(started: Server) -> list[str]:
        text = httpx.get(f"{started.url}/metrics", headers={"authorization": f"Bearer {KEY}"}, timeout=WAIT).text
        return [line for line in text.splitlines() if line.startswith("infinity_requests_total")]

    before = counted(server), counted(keyed)
    same_id = "X-Request-Id: same\r\n"
    (open_head, open_body), (keyed_head, keyed_body) = _answer(server, same_id), _answer(keyed, AUTH + same_id)
    after = counted(server), counted(keyed)

    def shape(head: bytes) -> list[tuple[bytes, bytes]]:
        lines = [line.split(b":", 1) for line in head.split(b"\r\n")[1:]]
        timed = (b"date", b"x-total-time", b"x-compute-time", b"x-tokenization-time", b"x-queue-time",
                 b"x-inference-time")
        return [(name.lower(), b"" if name.lower() in timed else value.strip()) for name, value in lines]

    assert open_head.split(b"\r\n")[0] == keyed_head.split(b"\r\n")[0] == b"HTTP/1.1 200 OK"
    assert shape(open_head) == shape(keyed_head)
    assert open_body == keyed_body
    assert [line for line in after[0] if line not in before[0]] == [
        line for line in after[1] if line not in before[1]]
