"""The short lane: plain keep-alive POSTs to inference routes, answered by the connection itself. Each contract
of the usual path is checked on a real server over real sockets; one test runs the protocol in-process to see
that the lane, not the parser, answered."""
from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from infinity.api.app import create_app
from infinity.api.router import Router
from infinity.engine.model import LoadedModel
from infinity.http.connection import Connection
from infinity.http.heads import declared_body
from infinity.http.server import limits
from infinity.http.shared import Shared
from infinity.settings import Settings
from tests.servers import WAIT, Reader, Server, metric, running, until

LONG = " ".join(["a long sentence that fills the model's whole context window"] * 40)


def post(body: bytes, path: str = "/predict", extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: {len(body)}\r\n\r\n".encode() + body


def chunked(body: bytes, path: str = "/predict") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{len(body):x}\r\n".encode()
            + body + b"\r\n0\r\n\r\n")


def names(head: bytes) -> list[bytes]:
    return [line.split(b":")[0] for line in head.split(b"\r\n")[1:]]


def value(head: bytes, name: bytes) -> bytes:
    return next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")[1:] if line.split(b":")[0] == name)


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)


@pytest.fixture(scope="module")
def server(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(minilm_fp32_artifact, tmp_path_factory.mktemp("lane") / "server.log", "--body-timeout", "1",
                 "--keep-alive-timeout", "1") as started:
        yield started


@pytest.mark.parametrize("head, length", [
    (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n", 12),
    (b"POST /predict HTTP/1.1\r\nhost: x\r\nconnection: Keep-Alive\r\ncontent-length: 0\r\n\r\n", 0),
    (b"POST /predict HTTP/1.1\r\nHost:x\xe9\tz\r\nContent-Length:7\r\n\r\n", 7),  # what the parser takes, too
    (b"POST /predict HTTP/1.0\r\nContent-Length: 12\r\n\r\n", None),
    (b"POST /predict extra HTTP/1.1\r\nContent-Length: 12\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 12\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 12\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 12\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\nContent-Length: 13\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nConnection: close\r\n"
     b"Content-Length: 1\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nContent-Length: 12\r\n\r\n", None),  # HTTP/1.1 without Host: the parser refuses it
    (b"POST /predict HTTP/1.1\r\nHost: x\r\nHost: y\r\nContent-Length: 12\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost: x\r\n\r\n", None),
    # malformed heads, which the parser refuses with 400
    (b"POST /predict HTTP/1.1\nHost: x\nContent-Length: 7\n\n", None),
    (b"POST /predict http/1.1\r\nContent-Length: 7\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost x\r\nContent-Length: 7\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost : x\r\nContent-Length: 7\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost: x\r\n folded\r\nContent-Length: 7\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost: a\x00b\r\nContent-Length: 7\r\n\r\n", None),
    (b"POST /predict HTTP/1.1\r\nHost: a\rb\r\nContent-Length: 7\r\n\r\n", None),
])
def test_only_a_plain_sized_keep_alive_head_declares_a_body_for_the_lane(head: bytes, length: int | None) -> None:
    assert declared_body(head, len(head)) == length


@pytest.mark.parametrize("line", [b"Host x", b"Host : x", b"Host: x\r\n folded", b"Host: a\x00b"])
def test_a_malformed_head_gets_the_parsers_400_not_an_answer(server: Server, line: bytes) -> None:
    body = b'{"inputs": "malformed"}'
    with connect(server) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\n" + line + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        head, _ = Reader(sock).response()
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 400 Bad Request"


def test_a_plain_request_gets_the_bytes_the_usual_path_writes(server: Server) -> None:
    body = orjson.dumps({"inputs": "the same text both ways"})
    with connect(server) as sock:
        reader = Reader(sock)
        sock.sendall(post(body))
        lane_head, lane_body = reader.response()
        sock.sendall(chunked(body))  # a chunked body always takes the parser
        usual_head, usual_body = reader.response()
    assert lane_head.split(b"\r\n")[0] == usual_head.split(b"\r\n")[0] == b"HTTP/1.1 200 OK"
    assert names(lane_head) == names(usual_head)
    for name in (b"server", b"content-type", b"content-length", b"x-compute-tokens"):
        assert value(lane_head, name) == value(usual_head, name)
    assert lane_body == usual_body and len(orjson.loads(lane_body)) == 384


def test_bodies_in_pieces_and_requests_sent_together_are_answered_in_order(server: Server) -> None:
    bodies = [orjson.dumps({"inputs": f"text number {i}"}) for i in range(4)]
    alone = [httpx.post(f"{server.url}/predict", content=body, timeout=WAIT).content for body in bodies]
    first, second, third, fourth = (post(body) for body in bodies)
    with connect(server) as sock:
        reader = Reader(sock)
        sock.sendall(first[:-5])  # the body arrives later, in two pieces
        time.sleep(0.05)
        sock.sendall(first[-5:-2])
        time.sleep(0.05)
        sock.sendall(first[-2:] + second + third[:30])  # the next two arrive while the first is answered
        time.sleep(0.05)
        sock.sendall(third[30:] + chunked(bodies[3]) + fourth)
        answers = [reader.response()[1] for _ in range(5)]
    assert answers == [alone[0], alone[1], alone[2], alone[3], alone[3]]


@pytest.mark.parametrize("path, body", [
    ("/v1/embeddings", b'{"input": []}'),
    ("/predict", b"not json"),
    ("/predict", b'{"inputs": "fine", "unknown": 1}'),
    ("/rerank", b'{"query": "q", "texts": ["a"]}'),  # a route of another task
])
def test_errors_are_the_same_on_the_lane_and_the_usual_path(server: Server, path: str, body: bytes) -> None:
    with connect(server) as sock:
        reader = Reader(sock)
        sock.sendall(post(body, path) + chunked(body, path) + post(b'{"inputs": "still serving"}'))
        (lane_head, lane_body), (usual_head, usual_body), (next_head, _) = (reader.response() for _ in range(3))
    assert lane_head.split(b"\r\n")[0] == usual_head.split(b"\r\n")[0] != b"HTTP/1.1 200 OK"
    assert names(lane_head) == names(usual_head) and lane_body == usual_body
    assert next_head.startswith(b"HTTP/1.1 200 ")


def test_a_lane_connection_is_closed_once_idle_past_the_keep_alive_timeout(server: Server) -> None:
    with connect(server) as sock:
        reader = Reader(sock)
        sock.sendall(post(b'{"inputs": "then nothing"}'))
        assert b" 200 " in reader.response()[0].split(b"\r\n")[0]
        assert reader.closed()  # within the 1 s keep-alive timeout; WAIT guards a hang


def test_a_body_that_stops_arriving_gets_408(server: Server) -> None:
    before = metric(server, 'infinity_socket_refusals_total{reason="timeout"}')
    with connect(server) as sock:
        sock.sendall(post(b'{"inputs": "never finished"}')[:-4])
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received.startswith(b"HTTP/1.1 408 ")
    assert metric(server, 'infinity_socket_refusals_total{reason="timeout"}') == before + 1


def test_with_api_keys_a_plain_request_still_needs_its_key(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--api-key", "secret") as started:
        with connect(started) as sock:
            reader = Reader(sock)
            sock.sendall(post(b'{"inputs": "no key"}'))
            refused, _ = reader.response()
            sock.sendall(post(b'{"inputs": "a key"}', extra="Authorization: Bearer secret\r\n"))
            accepted, _ = reader.response()
    assert b" 401 " in refused.split(b"\r\n")[0]
    assert b" 200 " in accepted.split(b"\r\n")[0]


def _busy_then_queued(server: Server) -> tuple[socket.socket, socket.socket]:
    """One long request running in the engine, and a short one from another client queued behind it."""
    running_one, queued = connect(server), connect(server)
    running_one.sendall(post(orjson.dumps({"inputs": [LONG] * 32})))
    # The engine takes the first (tokenized in milliseconds) long before the second arrives. Were both ever
    # queued together, they would run as one batch, the depth would never read 1, and until() would fail.
    time.sleep(0.3)
    queued.sendall(post(b'{"inputs": "queued behind it"}'))
    until(lambda: metric(server, "infinity_queue_depth") == 1)
    return running_one, queued


def test_a_client_that_leaves_while_queued_is_counted_and_costs_no_compute(minilm_fp32_artifact: Path,
                                                                           tmp_path: Path) -> None:
    with running(minilm_fp32_artifact, tmp_path / "server.log") as started:
        rows_before = metric(started, "infinity_batch_size_sum")
        running_one, queued = _busy_then_queued(started)
        queued.close()
        until(lambda: metric(started, 'infinity_failures_total{error_type="client_closed",route="/predict"}') == 1)
        with running_one:
            head, body = Reader(running_one).response()
        assert b" 200 " in head.split(b"\r\n")[0] and len(orjson.loads(body)) == 32
        until(lambda: metric(started, "infinity_queue_depth") == 0)
        assert metric(started, "infinity_batch_size_sum") == rows_before + 32  # the queued one never ran
    text = started.log.read_text()
    assert text.count("the client disconnected") == 1 and "Traceback" not in text and "ERROR" not in text


def test_a_refused_connection_is_not_read_again_before_its_retry_after(minilm_fp32_artifact: Path,
                                                                         tmp_path: Path) -> None:
    """Both refusals, on the socket (a whole request while full) and by the lane (a body completed while full),
    hold the connection: a retry sent at once is read only once Retry-After has passed, and then served."""
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--max-queue", "1", "--retry-after", "2") as started:
        late_body, whole = connect(started), connect(started)
        body = b'{"inputs": "refused"}'
        late_body.sendall(post(body)[:-len(body)])  # the lane gathers its body while the server still has room
        running_one, queued = _busy_then_queued(started)
        assert metric(started, "infinity_queue_depth") == 1  # full: one queued is the limit
        late_body.sendall(body)
        whole.sendall(post(body))
        retries = []
        for sock in (late_body, whole):
            reader = Reader(sock)
            head, answer = reader.response()
            refused_at = time.monotonic()
            assert b" 429 " in head.split(b"\r\n")[0] and value(head, b"retry-after") == b"2", head
            assert orjson.loads(answer)["error_type"] == "overloaded"
            sock.sendall(post(b'{"inputs": "at once"}'))
            retries.append((sock, reader, refused_at))
        for _, reader, refused_at in retries:
            head, _ = reader.response()
            assert time.monotonic() - refused_at > 1.5  # 2 s after the 429 was written, less the time to read it
            assert int(head.split(b" ")[1]) in (200, 429), head  # 429 again if the long batch still runs
        with running_one, queued:
            assert all(b" 200 " in Reader(sock).response()[0] for sock in (running_one, queued))
        for sock, reader, _ in retries:  # the load is gone: served, at the latest once a second hold is over
            with sock:
                sock.sendall(post(b'{"inputs": "later"}'))
                assert b" 200 " in reader.response()[0].split(b"\r\n")[0]
    assert "Traceback" not in started.log.read_text()


def test_a_lane_request_in_flight_at_sigterm_is_answered_then_its_connection_closed(minilm_fp32_artifact: Path,
                                                                                     tmp_path: Path) -> None:
    with running(minilm_fp32_artifact, tmp_path / "server.log") as started:
        running_one, queued = _busy_then_queued(started)
        started.process.send_signal(signal.SIGTERM)
        with running_one, queued:
            answers = [Reader(sock) for sock in (running_one, queued)]
            heads = [reader.response()[0] for reader in answers]
            assert all(b" 200 " in head.split(b"\r\n")[0] for head in heads), heads
            assert all(value(head, b"connection") == b"close" and reader.closed()
                       for head, reader in zip(heads, answers))
        assert started.process.wait(WAIT) == 0
    assert "Traceback" not in started.log.read_text()


def test_lane_requests_still_queued_at_the_drain_deadline_get_the_json_503(minilm_fp32_artifact: Path,
                                                                          tmp_path: Path) -> None:
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--drain-timeout", "0.5") as started:
        running_one, queued = _busy_then_queued(started)
        more = [connect(started) for _ in range(3)]
        for sock in more:
            sock.sendall(post(orjson.dumps({"inputs": [LONG] * 32})))
        until(lambda: metric(started, "infinity_queue_depth") == 4)
        started.process.send_signal(signal.SIGTERM)
        statuses, bodies = [], []
        for sock in [running_one, queued, *more]:
            with sock:
                head, body = Reader(sock).response()
                statuses.append(int(head.split(b" ")[1]))
                bodies.append(body)
        assert started.process.wait(WAIT) == 0
    assert set(statuses) <= {200, 503} and 503 in statuses, statuses
    assert all(orjson.loads(body)["error_type"] == "unhealthy" for status, body in zip(statuses, bodies)
               if status == 503)
    assert "Traceback" not in started.log.read_text()


@pytest.mark.parametrize("options", [{}, {"json_logs": True, "otlp_endpoint": "http://127.0.0.1:9", "api_keys": ("k",),
                                                "access_log": True}])
def test_the_lane_answers_without_starting_a_request_cycle(minilm_fp32_artifact: Path, options: dict[str, Any]) -> None:
    """In-process, with the connection `infinity serve` uses: a plain request leaves no ASGI cycle behind,
    a chunked one does (so the plain one was answered by the lane), with every option off and on."""
    settings = Settings(threads=1, **options)
    auth = b"Authorization: Bearer k\r\n" if options else b""
    router = Router.build(LoadedModel.load(minilm_fp32_artifact, threads=1), settings)
    app = create_app(router)
    made: list[Connection] = []

    async def main() -> tuple[bytes, bytes]:
        async with app.router.lifespan_context(app) as state:
            shared = Shared(app, keep_alive=5.0, limits=limits(settings), router=router, state=dict(state))

            def connection() -> Connection:
                made.append(Connection(shared))
                return made[-1]

            listener = await asyncio.get_running_loop().create_server(connection, "127.0.0.1", 0)
            reader, writer = await asyncio.open_connection(*listener.sockets[0].getsockname()[:2])
            answers = []
            for request in (post(b'{"inputs": "lane"}'), chunked(b'{"inputs": "parser"}')):
                writer.write(request.replace(b"Host: x\r\n", b"Host: x\r\n" + auth))
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(int(value(head[:-4], b"content-length")))
                answers.append(head)
                if not answers[1:]:
                    assert made[0].exchange is None
            writer.close()
            listener.close()
            return answers[0], answers[1]

    lane_head, parser_head = asyncio.run(asyncio.wait_for(main(), WAIT))
    assert b" 200 " in lane_head.split(b"\r\n")[0] and b" 200 " in parser_head.split(b"\r\n")[0]
    assert made[0].exchange is not None  # the chunked request went through the parser and an exchange


def test_with_the_access_log_on_plain_requests_are_logged(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--access-log") as started:
        with connect(started) as sock:
            sock.sendall(post(b'{"inputs": "logged"}'))
            head, _ = Reader(sock).response()
    assert b" 200 " in head.split(b"\r\n")[0]
    assert '"POST /predict HTTP/1.1" 200' in started.log.read_text()


EVERY_OPTION = ("--json-logs", "--otlp-endpoint", "http://127.0.0.1:9", "--api-key", "k", "--access-log")
TIMED = {b"date", b"x-compute-time", b"x-tokenization-time", b"x-queue-time", b"x-inference-time", b"x-total-time"}


def exchange(server: Server, key: bool) -> list[tuple[bytes, list[tuple[bytes, bytes]], bytes]]:
    """Status line, headers but the timed ones, and body of each of a few requests, on one connection."""
    auth = "Authorization: Bearer k\r\n" if key else ""
    ids = "X-Request-Id: r0\r\n"
    requests = [post(b'{"inputs": "lane"}', extra=auth + ids), chunked(b'{"inputs": "parser"}'),
                post(b'{"inputs": "lane"}', "/embed", auth + ids), post(b'{"input": 1}', extra=auth + ids),
                post(b'{"inputs": ""}', "/v1/embeddings", auth + ids)]
    requests[1] = requests[1].replace(b"Host: x\r\n", f"Host: x\r\n{auth}{ids}".encode())
    answers = []
    with connect(server) as sock:
        reader = Reader(sock)
        for request in requests:
            sock.sendall(request)
            head, body = reader.response()
            lines = head.split(b"\r\n")
            headers = [(name.lower(), value.strip()) for name, _, value in (line.partition(b":") for line in lines[1:])]
            answers.append((lines[0], [h for h in headers if h[0] not in TIMED], body))
    return answers


def test_every_option_on_leaves_the_path_and_the_answers_as_they_were(minilm_fp32_artifact: Path, tmp_path: Path,
                                                                      server: Server) -> None:
    """JSON logs, traces, API keys and the access log on: the same bytes (timings aside), and each request logged
    with its id (test_the_lane_answers_without_starting_a_request_cycle sees the lane answer with them on)."""
    plain = exchange(server, key=False)
    with running(minilm_fp32_artifact, tmp_path / "server.log", *EVERY_OPTION) as started:
        everything = exchange(started, key=True)
        assert [status for status, _, _ in everything] == [b"HTTP/1.1 200 OK"] * 3 + [
            b"HTTP/1.1 422 Unprocessable Entity", b"HTTP/1.1 400 Bad Request"]
        assert everything == plain
        assert all((b"x-request-id", b"r0") in headers for _, headers, _ in everything)
        until(lambda: started.log.read_text().count('"request_id":"r0"') == len(everything))
