"""Single short texts over TEI's gRPC services against HTTP, one server, same run: N clients each sending one text
and waiting for its answer, over HTTP /embed, unary tei.v1 Embed, and one EmbedStream per client.

    python -m bench grpc ARTIFACT [--clients 16] [--seconds 10] [--rounds 3]

The server runs with --grpc-port; every round runs the three paths in a shuffled order. Reported: answers per second
(median of rounds), the ratio of each gRPC path to HTTP, and the server's CPU time per answer (its process's user and
system time: the clients share the host's cores, and grpc's Python client costs them more than the HTTP one). The
texts are 8-token sentences (6 words and the model's two special tokens), a different one each request.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson

from bench.loadgen import Connection
from bench.process import Server, free_port

WORDS = ("river", "stone", "quiet", "garden", "light", "window", "paper", "summer", "green", "north", "table", "cloud")


def cpu_seconds(pid: int) -> float:
    """A process's user and system time, every thread's (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def text(i: int) -> str:
    rng = random.Random(i)
    return " ".join(rng.choice(WORDS) for _ in range(6))


async def closed_loop(clients: int, seconds: float, send: Callable[[int, int], Awaitable[None]]) -> int:
    """Answers in `seconds` from `clients` each sending its next text when its last is answered."""
    deadline = time.perf_counter() + seconds
    counts = [0] * clients

    async def client(c: int) -> None:
        while time.perf_counter() < deadline:
            await send(c, c * 1_000_000 + counts[c])
            counts[c] += 1

    await asyncio.gather(*(client(c) for c in range(clients)))
    return sum(counts)


async def over_http(port: int, clients: int, seconds: float) -> int:
    connections = [Connection("127.0.0.1", port) for _ in range(clients)]

    async def send(c: int, i: int) -> None:
        status, _, _ = await connections[c].post("/embed", orjson.dumps({"inputs": text(i)}))
        assert status == 200, status

    try:
        return await closed_loop(clients, seconds, send)
    finally:
        for connection in connections:
            await connection.close()


async def over_grpc(address: str, clients: int, seconds: float, streamed: bool) -> int:
    import grpc

    from tests.tei_client import generated

    pb, rpc = generated()
    async with grpc.aio.insecure_channel(address) as channel:
        embed = rpc.EmbedStub(channel)
        if not streamed:
            async def send(c: int, i: int) -> None:
                await embed.Embed(pb.EmbedRequest(inputs=text(i)), timeout=60)
            return await closed_loop(clients, seconds, send)
        streams = [embed.EmbedStream(timeout=seconds + 60) for _ in range(clients)]

        async def one(c: int, i: int) -> None:
            await streams[c].write(pb.EmbedRequest(inputs=text(i)))
            await streams[c].read()

        answered = await closed_loop(clients, seconds, one)
        for stream in streams:
            await stream.done_writing()
        return answered


def main() -> None:
    from infinity.engine.hostinfo import cpu_name

    parser = argparse.ArgumentParser(prog="python -m bench grpc", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    grpc_port = free_port()
    server = Server.infinity(args.artifact, "--grpc-port", str(grpc_port),
                             *(["--threads", str(args.threads)] if args.threads else []))
    address = f"127.0.0.1:{grpc_port}"
    paths: dict[str, Callable[[float], Awaitable[int]]] = {
        "HTTP /embed": lambda seconds: over_http(server.port, args.clients, seconds),
        "gRPC Embed (unary)": lambda seconds: over_grpc(address, args.clients, seconds, False),
        "gRPC EmbedStream": lambda seconds: over_grpc(address, args.clients, seconds, True)}
    rates: dict[str, list[float]] = {name: [] for name in paths}
    costs: dict[str, list[float]] = {name: [] for name in paths}
    try:
        server.wait_ready()
        for run in paths.values():  # every path warmed once
            asyncio.run(run(1.0))
        print(f"# {cpu_name()}: {args.clients} clients, 8-token texts, {args.seconds:g} s a path, {args.rounds} rounds",
              flush=True)
        for round_ in range(args.rounds):
            order = list(paths)
            random.Random(round_).shuffle(order)
            for name in order:
                before = cpu_seconds(server.pid)
                answered = asyncio.run(paths[name](args.seconds))
                rates[name].append(answered / args.seconds)
                costs[name].append((cpu_seconds(server.pid) - before) / answered * 1e6)
                print(f"round {round_ + 1} {name}: {rates[name][-1]:,.0f} answers/s, server CPU "
                      f"{costs[name][-1]:.0f} us an answer", flush=True)
    finally:
        server.stop()
    http = statistics.median(rates["HTTP /embed"])
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"{name}: median {rate:,.0f} answers/s, {rate / http:.2f}x HTTP, server CPU "
              f"{statistics.median(costs[name]):.0f} us an answer")
    sys.stdout.flush()
