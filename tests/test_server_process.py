"""A real `python -m infinity serve` process: readiness, a prediction, and a drain on SIGTERM."""
from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.servers import WAIT, running


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
