"""The HTTP/1.1 connection under the server, with a small ASGI app over real sockets: answers in request order,
framing as HTTP/1.1 asks, flow control, a failing app answered 500, idle connections closed. And the rule the
transport is built on: no module imports a private name of another library."""
from __future__ import annotations

import ast
import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.servers import connections

ROOT = Path(__file__).resolve().parent.parent
Scope = dict[str, Any]


async def app(scope: Scope, receive: Callable[[], Awaitable[dict[str, Any]]],
              send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """Echoes the body's length; /slow waits first, /stream answers in three chunks, /fail raises, /mute
    returns without answering."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path = scope["path"]
    if path == "/fail":
        raise ValueError("the app failed")
    if path == "/mute":
        return
    if path == "/slow":
        await asyncio.sleep(0.3)
    answer = f"{path} {len(body)}".encode()
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one ", b"two ", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


def request(path: str, body: bytes = b"", method: str = "POST", extra: str = "", version: str = "1.1") -> bytes:
    return (f"{method} {path} HTTP/{version}\r\nHost: x\r\n{extra}Content-Length: {len(body)}\r\n\r\n".encode()
            + body)


async def answer(reader: asyncio.StreamReader, head_only: bool = False) -> tuple[bytes, bytes]:
    """One response: its head and its body (de-chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    if head_only:
        return head, b""
    if b"transfer-encoding: chunked" in lines:
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readexactly(2)
        return head, body
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:"))
    return head, await reader.readexactly(length)


def test_pipelined_requests_are_answered_in_the_order_they_came() -> None:
    async def check(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request("/slow", b"first") + request("/fast", b"second!") + request("/stream"))
        bodies = [(await answer(reader))[1] for _ in range(3)]
        assert bodies == [b"/slow 5", b"/fast 7", b"one two three"]
        writer.close()

    connections(app, check)


def test_a_streamed_answer_is_chunked_and_a_head_request_gets_no_body() -> None:
    async def check(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request("/stream"))
        head, body = await answer(reader)
        assert b"transfer-encoding: chunked" in head and body == b"one two three"
        writer.write(request("/echo", method="HEAD"))
        head, _ = await answer(reader, head_only=True)
        assert b"content-length: 7" in head
        writer.write(request("/after", b"x"))  # the HEAD answer had no body: the next answer comes right after it
        assert (await answer(reader))[1] == b"/after 1"
        writer.close()

    connections(app, check)


def test_a_large_body_arrives_whole_through_paused_reads() -> None:
    body = bytes(3_000_000)

    async def check(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request("/big", body))
        assert (await answer(reader))[1] == b"/big 3000000"
        writer.close()

    connections(app, check)


def test_expect_100_continue_is_answered_when_the_app_reads_the_body() -> None:
    async def check(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request("/wait", extra="Expect: 100-continue\r\n").replace(b"Content-Length: 0",
                                                                                  b"Content-Length: 4"))
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"body")
        assert (await answer(reader))[1] == b"/wait 4"
        writer.close()

    connections(app, check)


@pytest.mark.parametrize("path", ["/fail", "/mute"])
def test_an_app_that_fails_or_does_not_answer_gets_a_500_and_the_server_goes_on(
        path: str, caplog: pytest.LogCaptureFixture) -> None:
    async def check(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request(path))
        head, body = await answer(reader)
        assert head.startswith(b"HTTP/1.1 500 ") and b"connection: close" in head and body == b"Internal Server Error"
        assert await reader.read() == b""  # closed after it
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request("/next"))
        assert (await answer(reader))[1] == b"/next 0"
        writer.close()

    connections(app, check)
    assert any(path in record.getMessage() for record in caplog.records if record.levelname == "ERROR")


def test_http_1_0_is_answered_then_closed_and_an_idle_connection_is_closed_after_keep_alive() -> None:
    async def check(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request("/old", b"abc", version="1.0"))
        head, body = await answer(reader)
        assert b"connection: close" in head and body == b"/old 3"
        assert await reader.read() == b""
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request("/one"))
        await answer(reader)
        started = asyncio.get_running_loop().time()
        assert await reader.read() == b""  # closed by the server once idle for keep_alive seconds
        assert asyncio.get_running_loop().time() - started >= 0.15

    shared = connections(app, check, keep_alive=0.2)
    assert not shared.connections and not shared.tasks


def test_no_module_imports_a_private_name_of_another_library() -> None:
    private = []
    for package in ("infinity", "optimize", "bench"):
        for path in (ROOT / package).rglob("*.py"):
            if "work" in path.relative_to(ROOT).parts:  # bench/work: benchmarks' own virtual environments
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [*node.module.split("."), *(alias.name for alias in node.names)]
                elif isinstance(node, ast.Import):
                    names = [part for alias in node.names for part in alias.name.split(".")]
                else:
                    continue
                if any(name.startswith("_") and name != "__future__" for name in names):
                    private.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert private == []
