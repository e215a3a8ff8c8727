"""Limits below the app, on a real server over real sockets: request heads, connections, slow clients, the port."""
from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from infinity.cli import build_parser, settings_from
from infinity.errors import StartupError
from tests.servers import ROOT, WAIT, Reader, Server, Unrouted, connections, running

HEAD_LIMIT = 4096
CONNECTIONS = 8
SMALL = ("--max-header-bytes", str(HEAD_LIMIT), "--max-connections", str(CONNECTIONS), "--header-timeout", "1",
         "--body-timeout", "1", "--keep-alive-timeout", "1")
LIVE = b"GET /health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@pytest.fixture(scope="module")
def server(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(minilm_fp32_artifact, tmp_path_factory.mktemp("limits") / "server.log", *SMALL) as started:
        yield started


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)


def answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def error_type(response: bytes) -> str:
    return str(orjson.loads(response.partition(b"\r\n\r\n")[2])["error_type"])


def refusals(server: Server, reason: str) -> int:
    """The server's own count of socket answers for `reason`, from /metrics."""
    metrics = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
    line = f'infinity_socket_refusals_total{{reason="{reason}"}} '
    return next((int(float(row[len(line):])) for row in metrics.splitlines() if row.startswith(line)), 0)


def head_of(size: int) -> bytes:
    start = b"GET /health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: "
    return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"


def test_settings_for_the_limits_come_from_flags_and_environment() -> None:
    parsed = settings_from(build_parser().parse_args(["serve", "a", "--max-header-bytes", "8192"]),
                           {"INFINITY_MAX_CONNECTIONS": "50", "INFINITY_HEADER_TIMEOUT": "2.5",
                            "INFINITY_BODY_TIMEOUT": "7", "INFINITY_KEEP_ALIVE_TIMEOUT": "0.5"})
    assert (parsed.max_header_bytes, parsed.max_connections, parsed.header_timeout, parsed.body_timeout,
            parsed.keep_alive_timeout) == (8192, 50, 2.5, 7.0, 0.5)
    with pytest.raises(StartupError, match="header_timeout must be more than 0"):
        settings_from(build_parser().parse_args(["serve", "a", "--header-timeout", "0"]), {})


def test_a_head_up_to_the_limit_is_served_and_one_byte_more_is_431(server: Server) -> None:
    before = refusals(server, "header_too_large")
    for size, expected in ((HEAD_LIMIT, 200), (HEAD_LIMIT + 1, 431)):
        with connect(server) as sock:
            sock.sendall(head_of(size))
            response = answer(sock)
        assert status(response) == expected, response[:200]
    assert error_type(response) == "header_too_large"
    assert refusals(server, "header_too_large") == before + 1


def test_a_huge_header_is_refused_while_it_is_still_arriving(server: Server) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\nX: ")
        try:
            for _ in range(64):  # 64 MiB; the server answers and stops reading long before
                sock.sendall(b"a" * (1 << 20))
        except (BrokenPipeError, ConnectionResetError):
            pass
        response = answer(sock)
    assert status(response) == 431, response[:200]
    assert httpx.get(f"{server.url}/health/live", timeout=WAIT).status_code == 200


def test_a_head_sent_a_byte_at_a_time_is_served(server: Server) -> None:
    with connect(server) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for byte in LIVE:
            sock.send(bytes([byte]))
        assert status(answer(sock)) == 200


def test_pipelined_requests_are_all_answered(server: Server) -> None:
    body = b'{"inputs": "hello"}'
    post = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    with connect(server) as sock:
        sock.sendall(post + post + LIVE)
        response = answer(sock)
    assert response.count(b"HTTP/1.1 200 OK") == 3


@pytest.mark.parametrize("sent", [
    b"GET /health/live HTTP/1.1\r\nHo",  # a head that never ends (slowloris)
    b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"inputs",  # a body that never ends
])
def test_a_request_that_stops_arriving_gets_408_and_is_closed(server: Server, sent: bytes) -> None:
    before = refusals(server, "timeout")
    with connect(server) as sock:
        sock.sendall(sent)
        response = answer(sock)
    assert status(response) == 408 and error_type(response) == "request_timeout", response[:200]
    assert refusals(server, "timeout") == before + 1


def test_a_body_that_stalls_after_its_answer_gets_no_second_answer(server: Server) -> None:
    with connect(server) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n{\"inputs")
        response = answer(sock)
    assert status(response) == 413 and response.count(b"HTTP/1.1 ") == 1, response[:300]


def test_silent_and_idle_keep_alive_connections_are_closed(server: Server) -> None:
    with connect(server) as silent, connect(server) as kept:
        kept.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer(silent) == b""  # closed without a word once the header timeout passed
        response = answer(kept)  # the answer, then closed once the keep-alive timeout passed
        assert status(response) == 200 and response.endswith(b'{"status":"live"}')


def test_connections_beyond_the_cap_get_503_and_idle_ones_make_room(server: Server) -> None:
    turned_away, evicted = refusals(server, "too_many_connections"), refusals(server, "idle_evicted")
    busy = [connect(server) for _ in range(CONNECTIONS)]
    try:
        for sock in busy:
            sock.sendall(b"GET /health/live HTTP/1.1\r\n")  # begun, not finished: not idle
        with connect(server) as extra:
            response = answer(extra)
        assert status(response) == 503 and error_type(response) == "too_many_connections", response[:200]
    finally:
        for sock in busy:
            sock.close()
    assert refusals(server, "too_many_connections") == turned_away + 1
    idle = [connect(server) for _ in range(CONNECTIONS * 2)]
    try:
        assert httpx.get(f"{server.url}/health/live", timeout=WAIT).status_code == 200
        assert refusals(server, "idle_evicted") > evicted  # room made for the idle ones beyond the cap
    finally:
        for sock in idle:
            sock.close()


def test_an_idle_flood_at_the_cap_closes_its_own_connections_before_a_keep_alive_client(
        minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    """Between two requests a keep-alive client has often waited longer than every connection of a flood that
    churns through the cap; the flood's never-used connections make room first. Both ways a request is read
    (the lane's POST, the parser's GET) leave the connection waiting behind them."""
    requests = [b"POST /predict HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nContent-Length: 18\r\n\r\n"
                b'{"inputs": "kept"}', b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n"] * 2
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--max-connections", str(CONNECTIONS),
                 "--keep-alive-timeout", "60") as server, connect(server) as kept:
        reader = Reader(kept)
        for index, request in enumerate(requests):
            kept.sendall(request)
            head, _ = reader.response()
            assert status(head) == 200, head
            if index == len(requests) - 1:
                break
            time.sleep(0.2)  # the client thinks; the flood's connections are all younger than this wait
            evicted = refusals(server, "idle_evicted")
            flood = [connect(server) for _ in range(CONNECTIONS * 2)]
            try:
                deadline = time.monotonic() + WAIT
                while refusals(server, "idle_evicted") < evicted + CONNECTIONS and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert refusals(server, "idle_evicted") >= evicted + CONNECTIONS
            finally:
                for sock in flood:
                    sock.close()


def test_idle_connections_past_the_open_file_limit_do_not_starve_requests(minilm_fp32_artifact: Path,
                                                                        tmp_path: Path) -> None:
    def few_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    with running(minilm_fp32_artifact, tmp_path / "server.log", preexec_fn=few_files) as server:
        idle = [connect(server) for _ in range(300)]
        try:
            for _ in range(3):
                response = httpx.post(f"{server.url}/predict", json={"inputs": "hello"}, timeout=WAIT)
                assert response.status_code == 200
        finally:
            for sock in idle:
                sock.close()
        assert "max_connections lowered from 1024 to 192" in server.log.read_text()


def test_a_port_in_use_is_refused_before_the_model_loads(minilm_fp32_artifact: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "infinity", "serve", str(minilm_fp32_artifact),
                                 "--port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=WAIT,
                                env={**os.environ, "INFINITY_LOG_LEVEL": "info"})
    assert result.returncode == 1
    # one line and nothing else: no model was loaded, no "ready" was logged
    assert result.stderr.strip().splitlines() == [f"infinity: error: cannot listen on 127.0.0.1:{port}: "
                                                  "address already in use"]


class Shedding(Unrouted):
    """A router with one inference route, /predict, full or not, the key valid or not; it records its refusals."""
    REFUSAL = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\r\n"

    def __init__(self, full: bool = True, authorized: bool = True) -> None:
        self.is_full, self.is_authorized, self.counted = full, authorized, list[str]()

    def route(self, line: bytes) -> str | None:
        return "/predict" if line == b"POST /predict " else None

    def full(self) -> bool:
        return self.is_full

    def authorized(self, head: bytes) -> bool:
        return self.is_authorized

    def refusal(self, path: str) -> bytes:
        self.counted.append(path)
        return self.REFUSAL


def post(path: str = "/predict", body: bytes = b'{"inputs": "hi"}', extra: str = "", version: str = "1.1") -> bytes:
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def ok(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
             send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def first_head(router: Shedding, request_bytes: bytes, rest: bytes = b"") -> bytes:
    """The head of the first answer a connection of the server gives to `request_bytes` (then `rest`), over a real
    socket, under `router` and an app that answers 200 to anything it gets."""
    heads = []

    async def check(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request_bytes)
        if rest:
            await asyncio.sleep(0.05)
            writer.write(rest)
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.close()

    connections(ok, check, router)
    return heads[0]


@pytest.mark.parametrize("request_bytes, rest, full, refused", [
    (post(), b"", True, True),
    (post(extra="Connection: keep-alive\r\n"), b"", True, True),
    (post(), b"", False, False),  # room left: the app admits it
    (post("/health/live"), b"", True, False),  # only inference routes are shed
    (post(extra="Connection: close\r\n"), b"", True, False),  # the usual path closes as asked
    (post(version="1.0"), b"", True, False),
    (post()[:-3], post()[-3:], True, False),  # the body has not all arrived: its rest must not be read as a request
    (post() + post(), b"", True, False),  # pipelined: the parser keeps the order of answers
    (post(extra="Transfer-Encoding: chunked\r\n"), b"", True, False),
])
def test_overload_is_refused_on_the_socket_only_for_one_whole_plain_request(request_bytes: bytes, rest: bytes,
                                                                            full: bool, refused: bool) -> None:
    router = Shedding(full)
    head = first_head(router, request_bytes, rest)
    assert (head == Shedding.REFUSAL) is refused, head
    assert router.counted == (["/predict"] if refused else [])


def test_a_request_without_a_valid_key_is_never_refused_on_the_socket() -> None:
    """It goes to the app, which answers 401 before counting any permit in flight."""
    router = Shedding(full=True, authorized=False)
    assert first_head(router, post()).startswith(b"HTTP/1.1 200 ") and router.counted == []


def test_a_storm_gets_429s_in_the_route_shape_and_keeps_its_connections(minilm_fp32_artifact: Path,
                                                                         tmp_path: Path) -> None:
    """One permit in flight beside one queued: long requests that arrive while both are taken are refused on
    the socket, each as a keep-alive 429 with Retry-After, and every refused connection is served normally
    once the load is gone. A round whose first two requests finish before the rest arrive is run again."""
    body = orjson.dumps({"input": "a longer text that keeps the engine busy for a while " * 30})
    small = ("--max-queue", "1", "--max-batch-size", "1", "--max-inputs-per-request", "1",
             "--keep-alive-timeout", "60")  # sockets of the first round wait through the later ones
    with running(minilm_fp32_artifact, tmp_path / "server.log", *small) as started:
        sockets: list[socket.socket] = []
        answers: list[bytes] = []
        for _ in range(5):
            round_sockets = [connect(started) for _ in range(16)]
            for sock in round_sockets[:2]:
                sock.sendall(post("/v1/embeddings", body))
            until = time.monotonic() + 2
            while time.monotonic() < until and "infinity_queue_depth 1" not in \
                    httpx.get(f"http://127.0.0.1:{started.port}/metrics").text:
                time.sleep(0.002)
            for sock in round_sockets[2:]:
                sock.sendall(post("/v1/embeddings", body))
            sockets += round_sockets
            answers += [read_response(sock) for sock in round_sockets]
            if any(b"at capacity" in a for a in answers):
                break
        refused = [a for a in answers if status(a) == 429]
        assert refused and all(status(a) in (200, 429) for a in answers)
        assert any(b"at capacity" in a for a in refused)  # refused on the socket, before the app
        for response in refused:
            head, _, body = response.partition(b"\r\n\r\n")
            assert b"retry-after: 1" in head.lower() and b"connection: close" not in head.lower()
            assert orjson.loads(body)["error"]["code"] == "overloaded"
        for sock in sockets:
            sock.sendall(post())
            assert status(read_response(sock)) == 200
            sock.close()
        metrics = httpx.get(f"http://127.0.0.1:{started.port}/metrics").text
    assert f'infinity_requests_total{{route="/v1/embeddings",status="429"}} {len(refused)}' in metrics


def read_response(sock: socket.socket) -> bytes:
    """One response with a content-length body, leaving the connection open."""
    head, body = Reader(sock).response()
    return head + b"\r\n\r\n" + body
