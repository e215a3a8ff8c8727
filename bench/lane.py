"""Two servers on the same artifact and cores, in the same run.

    python -m bench lane <artifact dir> [--compare paths|options|same] [--concurrency 1 16 64] [--rounds 8]
                         [--seconds 2] [--threads 2] [--serve-args "--no-spin-wait ..."]
                         [--server-cpus 0-3 --client-cpus 8]

`paths` (the default): both with an API key, `infinity serve` as it is ("lane") and the same server with its
lane turned off ("usual": every request through the parser, an ASGI task and the Starlette stack).
`options`: `infinity serve` with JSON logs, OTLP traces (to a collector process that takes every export)
and an API key all on ("on"), each alone ("json", "otlp", "key"), and all off ("off"). `same`: five identical
servers, to see the bench's own bias. Each round starts every server afresh, in a shuffled order; per round and
concurrency (one 9-token text per request, keep-alive clients), the servers take turns; the report gives median
req/s and p99 per server, and each server's ratio to the last one ("usual", "off", "e") per round.
`--server-cpus` and `--client-cpus` pin the servers and the load generator (with the collector) to CPUs of their
own, as on a server host whose clients run elsewhere; by default every process may run on every CPU.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.loadgen import closed_loop
from bench.process import Server, cpu_list, free_port

KEY = "bench-lane-key"
TEXT = "Infinity serves embeddings fast."  # 9 tokens with the MiniLM tokenizer's [CLS] and [SEP]
WITHOUT_LANE = ("import sys, infinity.http.server as server; server.LANE = False; "
                "from infinity.cli import main; sys.exit(main())")
CONCURRENCY = (1, 16, 64)


def start(artifact: Path, threads: int, lane: bool, *options: str, common: Sequence[str] = (),
          cpus: set[int] | None = None) -> Server:
    port = free_port()
    entry = ["-m", "infinity"] if lane else ["-c", WITHOUT_LANE]
    server = Server([sys.executable, *entry, "serve", str(artifact), "--port", str(port), "--threads", str(threads),
                     *common, *options], port, cpus)
    server.wait_ready()
    return server


class Collector:
    """An OTLP/HTTP endpoint that takes every export, in a process of its own, as a collector beside the server
    would be (in this one it would take the load generator's time)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process = subprocess.Popen([sys.executable, "-c", f"import bench.lane; bench.lane.collect({self.port})"])
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class Accept(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as collectors answer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def collect(port: int) -> None:
    ThreadingHTTPServer(("127.0.0.1", port), Accept).serve_forever()


Spec = tuple[bool, tuple[str, ...]]  # through the lane, and the server's options


def specs_for(compare: str, collector: Collector) -> dict[str, Spec]:
    """The servers to compare, the baseline last."""
    if compare == "paths":
        return {"lane": (True, ("--api-key", KEY)), "usual": (False, ("--api-key", KEY))}
    if compare == "same":
        return {name: (True, ()) for name in ("a", "b", "c", "d", "e")}
    options = {"json": ("--json-logs",), "otlp": ("--otlp-endpoint", collector.url), "key": ("--api-key", KEY)}
    return {"on": (True, tuple(arg for each in options.values() for arg in each)),
            **{name: (True, each) for name, each in options.items()}, "off": (True, ())}


def start_all(specs: dict[str, Spec], artifact: Path, threads: int, common: Sequence[str],
              rng: random.Random, cpus: set[int] | None = None) -> dict[str, Server]:
    """Each server started afresh, in a shuffled order, and warmed: a process's place in the start order moved
    its throughput by up to a tenth (five identical servers started once, `--compare same`)."""
    names = list(specs)
    rng.shuffle(names)
    started: dict[str, Server] = {}
    try:
        for name in names:
            started[name] = start(artifact, threads, specs[name][0], *specs[name][1], common=common, cpus=cpus)
        for server in started.values():
            measure(server.port, 16, 1.0)
    except BaseException:  # none left running on the cores the next run measures
        for server in started.values():
            server.stop()
        raise
    return {name: started[name] for name in specs}


def measure(port: int, concurrency: int, seconds: float) -> dict:
    result = asyncio.run(closed_loop(port, {"inputs": TEXT}, concurrency, 1_000_000, seconds,
                                     headers=f"authorization: Bearer {KEY}\r\n")).summary()
    if result["errors"]:
        raise RuntimeError(f"HTTP errors: {result['errors']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--compare", choices=("paths", "options", "same"), default="paths")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--serve-args", default="", help="more `infinity serve` arguments, for every server")
    parser.add_argument("--server-cpus", type=cpu_list, help="CPUs the servers run on, as taskset lists them: 0-3")
    parser.add_argument("--client-cpus", type=cpu_list, help="CPUs the load generator and the collector run on")
    args = parser.parse_args()
    everywhere = os.sched_getaffinity(0)
    if args.client_cpus is not None:
        os.sched_setaffinity(0, args.client_cpus)  # before the collector starts: it inherits them
    collector = Collector()
    specs = specs_for(args.compare, collector)
    *others, baseline = specs
    levels = args.concurrency
    rng = random.Random(0)
    rows: dict[tuple[str, int], list[dict]] = {(name, c): [] for name in specs for c in levels}
    try:
        for round_ in range(args.rounds):
            servers = start_all(specs, args.artifact, args.threads, shlex.split(args.serve_args), rng,
                                args.server_cpus)
            try:
                order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
                for concurrency in levels:
                    for name in order:
                        rows[(name, concurrency)].append(measure(servers[name].port, concurrency, args.seconds))
            finally:
                for server in servers.values():
                    server.stop()
    finally:
        collector.stop()

    def median(name: str, concurrency: int, field: str) -> float:
        return statistics.median(row[field] for row in rows[(name, concurrency)])

    compared = {"paths": "API keys on", "same": "five identical servers (the bench's own bias)",
                "options": "JSON logs, OTLP traces and an API key on, alone, or off"}[args.compare]
    pinned = "" if args.server_cpus is None and args.client_cpus is None else \
        f", servers on CPUs {sorted(args.server_cpus or everywhere)}, load generator on " \
        f"{sorted(args.client_cpus or everywhere)}"
    print(f"{args.rounds} rounds of {args.seconds:g} s per cell, servers started afresh each round, one 9-token text "
          f"per request, {compared}{pinned}")
    print("| server | " + " | ".join(f"c{c} req/s | c{c} p99 ms" for c in levels) + " |")
    print("|---|" + "---|---|" * len(levels))
    for name in specs:
        cells = " | ".join(f"{median(name, c, 'throughput_rps'):.0f} | {median(name, c, 'p99_ms'):.2f}"
                           for c in levels)
        print(f"| {name} | {cells} |")
    for name in others:
        for c in levels:
            pairs = list(zip(rows[(name, c)], rows[(baseline, c)]))
            ratios = [a["throughput_rps"] / b["throughput_rps"] for a, b in pairs]
            p99 = [a["p99_ms"] / b["p99_ms"] for a, b in pairs]
            print(f"c{c}: {name}/{baseline} req/s per round {', '.join(f'{r:.2f}' for r in ratios)}; "
                  f"median {statistics.median(ratios):.2f}; p99 {name}/{baseline} median {statistics.median(p99):.2f}")
    return 0
