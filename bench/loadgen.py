"""HTTP load against 127.0.0.1: closed loop at concurrency N, or open loop at a fixed rate.

A minimal keep-alive HTTP/1.1 client on asyncio streams, so the client costs little of the CPU it
shares with the server. Every run is bounded in requests and in seconds.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import orjson

from bench.stats import summarize


@dataclass
class LoadResult:
    latencies_ms: list[float] = field(default_factory=list)
    compute_ms: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    def summary(self) -> dict[str, object]:
        data: dict[str, object] = dict(summarize(self.latencies_ms, self.wall_s, len(self.latencies_ms)))
        if self.compute_ms:
            data["compute_p50_ms"] = summarize(self.compute_ms, 1, len(self.compute_ms))["p50_ms"]
        data["errors"] = dict(self.errors)
        return data


class Connection:
    def __init__(self, host: str, port: int, headers: str = "") -> None:
        self.host, self.port = host, port
        self.headers = headers  # extra header lines, each ending in CRLF
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n{self.headers}"
                f"content-length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("connection closed")
        status = int(status_line.split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        payload = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection") == "close":
            await self.close()
        return status, headers, payload

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


async def _one(connection: Connection, body: bytes, result: LoadResult, scheduled: float | None = None) -> None:
    start = scheduled if scheduled is not None else time.perf_counter()
    try:
        status, headers, _ = await connection.post("/predict", body)
    except (OSError, ConnectionError, asyncio.IncompleteReadError) as exc:
        result.errors[type(exc).__name__] = result.errors.get(type(exc).__name__, 0) + 1
        await connection.close()
        return
    if status != 200:
        result.errors[str(status)] = result.errors.get(str(status), 0) + 1
        return
    result.latencies_ms.append((time.perf_counter() - start) * 1000)
    if "x-compute-time" in headers:
        result.compute_ms.append(float(headers["x-compute-time"]))


async def closed_loop(port: int, payload: dict, concurrency: int, requests: int, max_seconds: float,
                      host: str = "127.0.0.1", headers: str = "") -> LoadResult:
    body, result = orjson.dumps(payload), LoadResult()
    remaining = requests
    deadline = time.perf_counter() + max_seconds

    async def worker() -> None:
        nonlocal remaining
        connection = Connection(host, port, headers)
        try:
            while remaining > 0 and time.perf_counter() < deadline:
                remaining -= 1
                await _one(connection, body, result)
        finally:
            await connection.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - start
    return result


async def open_loop(port: int, payload: dict, rate: float, seconds: float, host: str = "127.0.0.1",
                    max_connections: int = 64) -> LoadResult:
    """Requests start on schedule whether or not earlier ones finished; latency counts from the schedule."""
    body, result = orjson.dumps(payload), LoadResult()
    idle: list[Connection] = [Connection(host, port) for _ in range(max_connections)]
    tasks = []

    async def send(scheduled: float) -> None:
        if not idle:
            result.errors["client_saturated"] = result.errors.get("client_saturated", 0) + 1
            return
        connection = idle.pop()
        try:
            await _one(connection, body, result, scheduled)
        finally:
            idle.append(connection)

    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(send(scheduled)))
    await asyncio.gather(*tasks)
    result.wall_s = time.perf_counter() - start
    for connection in idle:
        await connection.close()
    return result
