"""Real `python -m infinity serve` processes on 127.0.0.1, for tests that talk HTTP to them."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
WAIT = 120.0  # a hang guard, never a performance expectation


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def metric(server: Server, name: str) -> float:
    """The sum of a metric's samples on the server's /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
    return sum(float(row.rsplit(" ", 1)[1]) for row in text.splitlines()
               if row.startswith(name + " ") or row.startswith(name + "{"))


def until(condition: Callable[[], bool]) -> None:
    """Waits for `condition` to hold, up to WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def wait_until_ready(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Until `url` answers 200; fails with the server's log if it exits first."""
    deadline = time.monotonic() + WAIT
    while True:
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the server never became ready"
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)


@contextmanager
def running(artifact: Path, log: Path, *args: str, env: dict[str, str] | None = None,
            preexec_fn: Callable[[], None] | None = None) -> Iterator[Server]:
    """Start a server and wait until /health/ready answers 200; kill it on the way out.
    preexec_fn runs in the child before the server starts (e.g. to lower its open-file limit)."""
    port = free_port()
    environ = {**os.environ, "INFINITY_THREADS": "1", "INFINITY_LOG_LEVEL": "info", **(env or {})}
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "infinity", "serve", str(artifact), "--port", str(port),
                                    *args], cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=preexec_fn)
    try:
        wait_until_ready(process, f"http://127.0.0.1:{port}/health/ready", log)
        yield Server(process, port, log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


class Reader:
    """Responses with content-length bodies, one after another from one connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def _fill(self, enough: Callable[[], bool]) -> None:
        while not enough():
            chunk = self.sock.recv(65536)
            assert chunk, f"closed before a whole response: {self.buffer[:300]!r}"
            self.buffer += chunk

    def response(self) -> tuple[bytes, bytes]:
        self._fill(lambda: b"\r\n\r\n" in self.buffer)
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        self.buffer = rest
        self._fill(lambda: len(self.buffer) >= length)
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return head, body

    def closed(self) -> bool:
        return not self.buffer and self.sock.recv(1) == b""
