"""Hostile, broken and overloaded clients against a real `infinity serve`, with normal traffic measured meanwhile.

    python -m bench abuse <artifact dir> [--seconds 12] [--soak 10000] [--out docs/results/abuse.md]

127.0.0.1 only, every scenario bounded in connections, bytes and seconds. Each scenario runs its attack
while one client sends short /predict requests one at a time; the table says what was tried, what the
server did, and the p50/p99 of that normal traffic. The soak is 10,000 requests by default (`--soak 100000`
for the full one). The attacking clients share the machine's cores with the server; the retry storm runs
from its own process, at the priority `--attacker-nice` gives it (19: clients that only take idle CPU, as if
they ran elsewhere).
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.connection
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench.loadgen import Connection
from bench.process import HOST, Server, memory_mib
from bench.stats import percentile

SHORT = orjson.dumps({"inputs": "a short sentence to embed"})
LONG = orjson.dumps({"inputs": "a longer text that takes the model a while to embed " * 40})
ROOT = Path(__file__).resolve().parents[1]
STALL_S = 35.0  # stalled bodies are held past the default --body-timeout of 30 s


@dataclass
class Normal:
    """Short /predict requests one at a time; a request that gets no answer by the deadline is an error."""
    latencies_ms: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def row(self) -> tuple[str, str, str]:
        if not self.latencies_ms:
            return "-", "-", _errors(self.errors) or "none answered"
        return (f"{percentile(self.latencies_ms, 50):.1f}", f"{percentile(self.latencies_ms, 99):.1f}",
                _errors(self.errors) or "0")


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{count} x {kind}" for kind, count in sorted(errors.items()))


ANSWER_S = 10.0  # a well-behaved client's short request unanswered this long counts as "no answer"


async def normal_traffic(port: int, until: float, result: Normal) -> None:
    connection = Connection(HOST, port)
    while time.monotonic() < until:
        start = time.perf_counter()
        try:
            # a request sent before the window closes may finish after it; only one that takes ANSWER_S is lost
            status, headers, _ = await asyncio.wait_for(connection.post("/predict", SHORT),
                                                        max(ANSWER_S, until - time.monotonic()))
        except (OSError, ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
            kind = "no answer" if isinstance(exc, asyncio.TimeoutError) else "connection error"
            result.errors[kind] = result.errors.get(kind, 0) + 1
            await connection.close()
            connection = Connection(HOST, port)
            await asyncio.sleep(0.05)
            continue
        if status == 200:
            result.latencies_ms.append((time.perf_counter() - start) * 1000)
        else:
            result.errors[str(status)] = result.errors.get(str(status), 0) + 1
            if status == 429:  # a well-behaved client waits as told: the server holds its connection meanwhile
                await asyncio.sleep(min(float(headers.get("retry-after", "1")), max(0.0, until - time.monotonic())))
    await connection.close()


async def first_line(reader: asyncio.StreamReader) -> bytes:
    """The status line, or b"" if the server closed (or reset) without one."""
    try:
        return (await reader.readline()).strip()
    except (ConnectionError, OSError):
        return b""


def _status(line: bytes) -> str:
    return line.split(b" ")[1].decode() if line.startswith(b"HTTP/") else "closed"


# ---- attacks: each returns what the server did, in a few words


async def header_flood(port: int, seconds: float, mib: int = 128) -> str:
    reader, writer = await asyncio.open_connection(HOST, port)
    answer = asyncio.ensure_future(first_line(reader))
    started, sent, chunk = time.monotonic(), 0, b"a" * (1 << 20)
    writer.write(b"GET /health/live HTTP/1.1\r\nHost: x\r\nX: ")
    try:
        while sent < mib << 20 and not answer.done() and time.monotonic() - started < seconds:
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), max(0.1, seconds - (time.monotonic() - started)))
            sent += len(chunk)
        writer.write(b"\r\n\r\n")
    except (ConnectionError, OSError, asyncio.TimeoutError):
        pass
    done, _ = await asyncio.wait({answer}, timeout=max(0.1, seconds - (time.monotonic() - started)))
    writer.close()
    if not done:
        answer.cancel()
        return f"{sent >> 20} MiB header sent; no answer in {seconds:.0f} s"
    return f"{_status(answer.result())} after {sent >> 20} MiB, {time.monotonic() - started:.2f} s"


async def _hold(port: int, count: int, seconds: float, opening: bytes, drip: bytes | None) -> str:
    """Open `count` connections, send `opening`, then drip a byte a second; say how many the server closed."""
    streams = []
    for _ in range(count):
        try:
            streams.append(await asyncio.wait_for(asyncio.open_connection(HOST, port), seconds))
        except asyncio.TimeoutError:
            break
        except OSError:
            break
    started = time.monotonic()
    answers = [asyncio.ensure_future(first_line(reader)) for reader, _ in streams]
    for _, writer in streams:
        if opening:
            writer.write(opening)
    while time.monotonic() - started < seconds and not all(a.done() for a in answers):
        await asyncio.sleep(1.0)
        for (_, writer), answer in zip(streams, answers):
            if drip and not answer.done() and not writer.is_closing():
                try:
                    writer.write(drip)
                except (ConnectionError, OSError):
                    pass
    closed = [a.result() for a in answers if a.done()]
    for answer in answers:
        answer.cancel()
    for _, writer in streams:
        writer.close()
    if not closed:
        return f"all {len(streams)} of {count} still open after {seconds:.0f} s"
    kinds: dict[str, int] = {}
    for line in closed:
        kinds[_status(line)] = kinds.get(_status(line), 0) + 1
    return f"{len(closed)} of {len(streams)} ended in {seconds:.0f} s ({_errors(kinds)})"


async def slowloris(port: int, seconds: float) -> str:
    return await _hold(port, 200, seconds, b"GET /health/live HTTP/1.1\r\nHost: x\r\n", b"a")


async def idle_flood(port: int, seconds: float) -> str:
    return await _hold(port, 3000, seconds, b"", None)


async def stalled_bodies(port: int, seconds: float) -> str:
    return await _hold(port, 40, max(seconds, STALL_S),
                       b"POST /predict HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                                    b"Content-Length: 1000\r\n\r\n{\"inputs\": \"", None)


STALLED_HEADS = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nConnection: close\r\n\r\n",
                 b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                 b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n")


async def stalled_lockout(port: int, seconds: float, per_head: int = 70) -> str:
    """More stalled bodies than the default places in flight (128 queued + 32 in a batch): 70 clients for each
    head that announce a body and never send it, each opening a new connection at once when answered."""
    deadline = time.monotonic() + seconds
    answered: dict[str, int] = {}

    async def client(head: bytes) -> None:
        while (left := deadline - time.monotonic()) > 0:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), left)
            except (OSError, asyncio.TimeoutError):
                return
            writer.write(head)
            try:
                line = await asyncio.wait_for(first_line(reader), max(0.01, deadline - time.monotonic()))
                while line.startswith(b"HTTP/1.1 100 "):  # an interim answer: the client still owes its body
                    await reader.readline()
                    line = await asyncio.wait_for(first_line(reader), max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                line = None
            writer.close()
            if line is None:
                return
            answered[_status(line)] = answered.get(_status(line), 0) + 1

    await asyncio.gather(*(client(head) for head in STALLED_HEADS for _ in range(per_head)))
    return f"answered before the end: {_errors(answered) or 'none'}"


async def disconnect_storm(port: int, seconds: float) -> str:
    """Clients that send a whole request (or half of one) and hang up at once."""
    head = (f"POST /predict HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            f"Content-Length: {len(LONG)}\r\n\r\n").encode()
    started, count = time.monotonic(), 0
    while time.monotonic() - started < seconds and count < 400:
        try:
            _, writer = await asyncio.open_connection(HOST, port)
            writer.write(head + (LONG if count % 2 else LONG[: len(LONG) // 2]))
            await writer.drain()
            writer.close()
            count += 1
        except OSError:
            pass
        await asyncio.sleep(0.02)
    return f"{count} hung up"


Storm = tuple[str, list[float], int, int, list[float]]


async def retry_storm(port: int, seconds: float, clients: int = 300) -> Storm:
    """`clients` clients re-sending at once, no back-off; returns the summary, 200 latencies at the client, the
    count of 200s, the count of 429s, and the server's own x-total-time of each 200.

    Latencies at the client include waiting for their own turn (the clients share one process and the cores
    with the server) and, for a retry sent right after a 429, the hold until its Retry-After has passed; the
    server's x-total-time runs from the moment a request is admitted."""
    ok: list[float] = []
    served: list[float] = []
    refused: dict[str, int] = {}
    until = time.monotonic() + seconds

    async def client() -> None:
        connection = Connection(HOST, port)
        while time.monotonic() < until:
            start = time.perf_counter()
            try:
                status, headers, _ = await asyncio.wait_for(connection.post("/predict", SHORT),
                                                            max(0.1, until - time.monotonic()))
            except (OSError, ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                await connection.close()
                connection = Connection(HOST, port)
                continue
            if status == 200:
                ok.append((time.perf_counter() - start) * 1000)
                served.append(float(headers.get("x-total-time", "nan")))
            else:
                refused[str(status)] = refused.get(str(status), 0) + 1
        await connection.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    p99 = f"{percentile(ok, 99):.1f}" if ok else "-"
    inside = f"{percentile(served, 99):.1f}" if served else "-"
    return (f"{len(ok) / seconds:.0f} 200s/s (p99 {p99} ms at the client, {inside} ms inside the server), "
            f"{_errors(refused) or 'nothing'} refused",
            ok, len(ok), refused.get("429", 0), served)


def _storm_elsewhere(port: int, seconds: float, nice: int, answer: multiprocessing.connection.Connection) -> None:
    os.nice(nice)
    answer.send(asyncio.run(retry_storm(port, seconds)))


def storm_process(port: int, seconds: float, nice: int) -> Storm:
    """The retry storm from its own process at `nice`, so it competes for the cores as a separate program would."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_storm_elsewhere, args=(port, seconds, nice, send))
    child.start()
    result = receive.recv()
    child.join()
    return result


async def capacity(port: int, seconds: float, concurrency: int = 8) -> int:
    """200s in `seconds` from `concurrency` well-behaved clients."""
    count = 0
    until = time.monotonic() + seconds

    async def client() -> None:
        nonlocal count
        connection = Connection(HOST, port)
        while time.monotonic() < until:
            status, _, _ = await connection.post("/predict", SHORT)
            count += status == 200
        await connection.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return count


def loop_cpu_s(pid: int) -> float:
    """CPU seconds of the server's main thread (its event loop), where every request and refusal is handled."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def soak(port: int, pid: int, requests: int, concurrency: int = 4) -> tuple[str, Normal]:
    result, samples, left = Normal(), [memory_mib(pid)["VmRSS"]], requests

    async def client() -> None:
        nonlocal left
        connection = Connection(HOST, port)
        while left > 0:
            left -= 1
            start = time.perf_counter()
            status, _, _ = await connection.post("/predict", SHORT)
            if status == 200:
                result.latencies_ms.append((time.perf_counter() - start) * 1000)
            else:
                result.errors[str(status)] = result.errors.get(str(status), 0) + 1
        await connection.close()

    async def sample() -> None:
        while left > 0:
            await asyncio.sleep(1.0)
            samples.append(memory_mib(pid)["VmRSS"])

    started = time.monotonic()
    await asyncio.gather(sample(), *(client() for _ in range(concurrency)))
    samples.append(memory_mib(pid)["VmRSS"])
    third = max(1, len(samples) // 3)
    return (f"{requests} requests in {time.monotonic() - started:.0f} s; RSS {samples[0]:.0f} -> "
            f"{samples[-1]:.0f} MiB (max {max(samples):.0f}; median of last third "
            f"{statistics.median(samples[-third:]):.0f})", result)


# ---- the run


async def well_behaved(port: int, seconds: float, clients: int) -> Normal:
    """`clients` clients sending short requests back to back, no attack: what queueing alone costs the p99."""
    normal = Normal()
    until = time.monotonic() + seconds
    await asyncio.gather(*(normal_traffic(port, until, normal) for _ in range(clients)))
    return normal


async def during(port: int, seconds: float, attack: Callable[[], Awaitable[str]]) -> tuple[str, Normal]:
    normal = Normal()
    results = await asyncio.gather(attack(), normal_traffic(port, time.monotonic() + seconds, normal))
    return str(results[0]), normal


def start_server(artifact: Path, log: Path, threads: int) -> Server:
    env = {**os.environ, "INFINITY_THREADS": str(threads), "INFINITY_LOG_LEVEL": "info"}
    server = Server.infinity(artifact, "--host", HOST, log=log, cwd=ROOT, env=env)
    try:
        server.wait_ready()
    except RuntimeError:
        server.kill()
        raise
    return server


async def _get(port: int, path: str) -> tuple[int, bytes, float]:
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return int(data.split(b" ", 2)[1]), data.partition(b"\r\n\r\n")[2], (time.perf_counter() - start) * 1000


def settle(port: int, limit_s: float = 120.0) -> None:
    """Wait until the server answers /health/live again, so one scenario's aftermath does not land in the next."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if asyncio.run(asyncio.wait_for(_get(port, "/health/live"), deadline - time.monotonic()))[0] == 200:
                time.sleep(1.0)
                return
        except (OSError, asyncio.TimeoutError, IndexError, ValueError):
            time.sleep(0.5)


def log_news(log: Path, offset: int) -> tuple[str, int]:
    text = log.read_bytes()[offset:].decode(errors="replace")
    errors = sum(line.startswith("ERROR") for line in text.splitlines())
    tracebacks = text.count("Traceback")
    return f"log: {errors} ERROR lines, {tracebacks} tracebacks", offset + len(text.encode())


SCENARIOS = ("header-flood", "slowloris", "idle-flood", "stalled-bodies", "stalled-lockout", "disconnect-storm",
             "concurrency",
             "retry-storm", "soak")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench abuse", description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--seconds", type=float, default=12.0, help="length of each scenario")
    parser.add_argument("--soak", type=int, default=10_000, help="requests in the soak")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attacker-nice", type=int, default=0,
                        help="niceness of the retry storm's own process (19: clients that take only idle CPU, "
                             "as if they ran on other machines)")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    parser.add_argument("--only", help=f"comma-separated scenarios to run (of {', '.join(SCENARIOS)}); "
                                       "the baseline always runs")
    args = parser.parse_args(argv)
    chosen = set(SCENARIOS if args.only is None else args.only.split(","))
    if not chosen <= set(SCENARIOS):
        parser.error(f"unknown scenarios: {', '.join(sorted(chosen - set(SCENARIOS)))}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))

    log = Path(tempfile.mkdtemp(prefix="bench-abuse-")) / "server.log"
    server = start_server(args.artifact, log, args.threads)
    port, process = server.port, server.process
    rows: list[tuple[str, str, str, str, str]] = []
    offset = 0
    seconds = args.seconds

    def record(name: str, tried: str, did: str, normal: Normal) -> None:
        nonlocal offset
        news, offset = log_news(log, offset)
        rows.append((name, tried, f"{did}; {news}", *normal.row()))
        print(f"{name}: {did}; {news}; normal {normal.row()}", file=sys.stderr, flush=True)
        settle(port)

    try:
        _, normal = asyncio.run(during(port, seconds, lambda: asyncio.sleep(0, "-")))
        record("baseline", "nothing", "-", normal)
        unloaded_p99 = percentile(normal.latencies_ms, 99)
        if "header-flood" in chosen:
            did, normal = asyncio.run(during(port, seconds, lambda: header_flood(port, seconds)))
            record("header flood", "one request head with a 128 MiB header", did, normal)
        if "slowloris" in chosen:
            did, normal = asyncio.run(during(port, seconds, lambda: slowloris(port, seconds)))
            record("slowloris", "200 heads, one byte a second", did, normal)
        if "idle-flood" in chosen:
            did, normal = asyncio.run(during(port, seconds, lambda: idle_flood(port, seconds)))
            record("idle flood", "3,000 connections that send nothing", did, normal)
        if "stalled-bodies" in chosen:
            did, normal = asyncio.run(during(port, max(seconds, STALL_S), lambda: stalled_bodies(port, seconds)))
            record("stalled bodies", "40 requests whose body stops after 12 bytes", did, normal)
        if "stalled-lockout" in chosen:
            did, normal = asyncio.run(during(port, seconds, lambda: stalled_lockout(port, seconds)))
            record("stalled-body lock-out", "210 clients whose heads (Connection: close, chunked, Expect) announce a "
                   "body that never comes; each reconnects once answered",
                   did, normal)
        if "disconnect-storm" in chosen:
            did, normal = asyncio.run(during(port, seconds, lambda: disconnect_storm(port, seconds)))
            _, metrics, _ = asyncio.run(_get(port, "/metrics"))
            failures = [line for line in metrics.decode().splitlines()
                        if line.startswith("infinity_failures_total") and float(line.rsplit(" ", 1)[1]) > 0]
            record("disconnect storm", "up to 400 clients hang up mid-body or before the answer",
                   f"{did}; failures counted: {', '.join(failures) or 'none'}", normal)
        if "concurrency" in chosen:
            for clients in (2, 4, 6, 8):
                normal = asyncio.run(well_behaved(port, seconds / 2, clients))
                p99 = percentile(normal.latencies_ms, 99) if normal.latencies_ms else float("inf")
                record(f"concurrency {clients}", f"{clients} well-behaved clients back to back, no attack",
                       f"{len(normal.latencies_ms) / (seconds / 2):.0f} req/s; p99 / unloaded p99 = "
                       f"{p99 / unloaded_p99:.1f}", normal)
        if "retry-storm" in chosen:
            cpu = loop_cpu_s(process.pid)
            served = asyncio.run(capacity(port, seconds / 2))
            per_200 = (loop_cpu_s(process.pid) - cpu) / max(1, served)
            cpu = loop_cpu_s(process.pid)
            did, admitted, count, refused, inside_ms = storm_process(port, seconds, args.attacker_nice)
            per_refusal = (loop_cpu_s(process.pid) - cpu - count * per_200) / max(1, refused)
            # the 200s' share is an estimate: only when 429s dominate is the remainder theirs
            separable = refused > 10 * count and per_refusal > 0
            refusal_cost = f"{per_refusal * 1e6:.0f} us" if separable else "not separable"
            full = served / (seconds / 2)
            p99 = percentile(admitted, 99) if admitted else float("inf")
            inside = percentile(inside_ms, 99) if inside_ms else float("inf")
            record("retry storm",
                   f"300 clients re-sending at once, no back-off, in a process at nice {args.attacker_nice}",
                   f"{did}; capacity at concurrency 8: {full:.0f}/s; 200s/s / capacity = "
                   f"{count / seconds / full:.2f}; p99 of 200s / unloaded p99 = {p99 / unloaded_p99:.1f} at the "
                   f"client, {inside / unloaded_p99:.1f} inside the server; "
                   f"event-loop CPU per 200 at concurrency 8 {per_200 * 1e6:.0f} us, per 429 in the storm "
                   f"{refusal_cost}", Normal(admitted))
        if "soak" in chosen:
            did, normal = asyncio.run(soak(port, process.pid, args.soak))
            record("soak", f"{args.soak} short requests, concurrency 4", did, normal)
    finally:
        server.stop(60)
    table = ["| scenario | tried | what the server did | normal p50 ms | normal p99 ms | normal errors |",
             "|---|---|---|---|---|---|"]
    table += ["| " + " | ".join(row) + " |" for row in rows]
    print("\n".join(table))
    if args.out:
        args.out.write_text("\n".join(table) + "\n")
    return 0
