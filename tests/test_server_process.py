"""A real `python -m infinity serve` process: readiness, a prediction, and a drain on SIGTERM."""
from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from tests.servers import WAIT, metric, running, until


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


@pytest.fixture()
def server(minilm_fp32_artifact: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    with running(minilm_fp32_artifact, tmp_path / "server.log") as started:
        yield started.process, started.port, started.log


def test_serves_then_drains_an_in_flight_request_on_sigterm(
        server: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    process, port, log = server
    answer = httpx.post(f"http://127.0.0.1:{port}/predict", json={"inputs": ["hello", "world"]}, timeout=30)
    assert answer.status_code == 200 and len(answer.json()) == 2
    assert float(answer.headers["x-compute-time"]) > 0

    # In flight: headers sent, body still on its way when the signal arrives.
    body = orjson.dumps({"inputs": "a request that was in flight at SIGTERM"})
    head = (f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(head + body[:10])
        time.sleep(0.2)  # let the server parse the headers; correctness does not depend on it
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WAIT
        while not refuses_connections(port):  # shutdown has begun: the listener is closed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        sock.sendall(body[10:])
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    status_line, _, rest = response.partition(b"\r\n")
    assert b" 200 " in status_line, response[:500]
    assert len(orjson.loads(rest.split(b"\r\n\r\n", 1)[1])) == 384
    assert process.wait(WAIT) == 0, log.read_text()
    assert "Traceback" not in log.read_text()


def test_a_client_that_leaves_mid_body_is_counted_as_client_closed(
        server: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    process, port, log = server
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\": \"")
            time.sleep(0.1)
    deadline = time.monotonic() + WAIT
    while 'error_type="client_closed",route="/predict"} 3' not in (metrics := httpx.get(f"http://127.0.0.1:{port}/metrics").text):
        assert time.monotonic() < deadline, metrics
        time.sleep(0.1)
    assert 'error_type="internal"' not in metrics
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text
    assert text.count("the client disconnected") == 3


def test_requests_still_waiting_at_the_drain_deadline_get_a_json_503(minilm_fp32_artifact: Path,
                                                                     tmp_path: Path) -> None:
    long = " ".join(["a long sentence that fills the model's whole context window"] * 40)
    body = {"inputs": [long] * 32}
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--drain-timeout", "1") as server:
        with ThreadPoolExecutor(24) as pool:
            calls = [pool.submit(httpx.post, server.url + "/predict", json=body, timeout=WAIT) for _ in range(24)]
            # every request read (waiting, answered or the one or two running) before SIGTERM: a connection the
            # server has not accepted yet is reset when its listener closes, and that is not what this tests
            until(lambda: metric(server, "infinity_queue_depth") + metric(server, "infinity_requests_total")
                  >= len(calls) - 2)
            server.process.send_signal(signal.SIGTERM)
            answers = [call.result(WAIT) for call in calls]  # each one read, so each one answered
        assert server.process.wait(WAIT) == 0
    statuses = [answer.status_code for answer in answers]
    assert set(statuses) <= {200, 503} and 503 in statuses, statuses
    for answer in answers:
        if answer.status_code == 503:
            assert answer.json()["error_type"] == "unhealthy"
    assert "Traceback" not in server.log.read_text()
