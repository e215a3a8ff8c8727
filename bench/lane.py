"""The connection's lane against the usual ASGI path, in the same run, with API keys on as deployed.

    python -m bench.lane <artifact dir> [--rounds 8] [--seconds 2] [--threads 2]

Two servers on the same artifact and cores, both with an API key: `infinity serve` as it is, and the same
server with its protocol built without the lane (every request through the parser, an ASGI task and the
Starlette stack). Per round and concurrency (1, 16, 64; one 8-token text per request, keep-alive clients), the
two take turns; the report gives median req/s and p99 per server and the lane/usual ratio per round.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

from bench.loadgen import closed_loop
from bench.process import Server, free_port

KEY = "bench-lane-key"
TEXT = "Infinity serves embeddings fast."  # 9 tokens with the MiniLM tokenizer's [CLS] and [SEP]
WITHOUT_LANE = ("import sys, infinity.http.server as server; server.lane_protocol = lambda base, lane: base; "
                "from infinity.cli import main; sys.exit(main())")
CONCURRENCY = (1, 16, 64)


def start(artifact: Path, threads: int, lane: bool) -> Server:
    port = free_port()
    entry = ["-m", "infinity"] if lane else ["-c", WITHOUT_LANE]
    server = Server([sys.executable, *entry, "serve", str(artifact), "--port", str(port), "--threads", str(threads),
                     "--api-key", KEY], port)
    server.wait_ready()
    return server


def measure(port: int, concurrency: int, seconds: float) -> dict:
    result = asyncio.run(closed_loop(port, {"inputs": TEXT}, concurrency, 1_000_000, seconds,
                                     headers=f"authorization: Bearer {KEY}\r\n")).summary()
    if result["errors"]:
        raise RuntimeError(f"HTTP errors: {result['errors']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    servers = {"lane": start(args.artifact, args.threads, True), "usual": start(args.artifact, args.threads, False)}
    try:
        for server in servers.values():
            measure(server.port, 16, 1.0)  # warm
        rows: dict[tuple[str, int], list[dict]] = {(name, c): [] for name in servers for c in CONCURRENCY}
        for round_ in range(args.rounds):
            order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
            for concurrency in CONCURRENCY:
                for name in order:
                    rows[(name, concurrency)].append(measure(servers[name].port, concurrency, args.seconds))
    finally:
        for server in servers.values():
            server.stop()

    def median(name: str, concurrency: int, field: str) -> float:
        return statistics.median(row[field] for row in rows[(name, concurrency)])

    print(f"{args.rounds} rounds of {args.seconds:g} s per cell, API keys on, one 9-token text per request")
    print("| path | " + " | ".join(f"c{c} req/s | c{c} p99 ms" for c in CONCURRENCY) + " |")
    print("|---|" + "---|---|" * len(CONCURRENCY))
    for name in servers:
        cells = " | ".join(f"{median(name, c, 'throughput_rps'):.0f} | {median(name, c, 'p99_ms'):.2f}"
                           for c in CONCURRENCY)
        print(f"| {name} | {cells} |")
    for c in CONCURRENCY:
        ratios = [a["throughput_rps"] / b["throughput_rps"] for a, b in zip(rows[("lane", c)], rows[("usual", c)])]
        p99 = [a["p99_ms"] / b["p99_ms"] for a, b in zip(rows[("lane", c)], rows[("usual", c)])]
        print(f"c{c}: lane/usual req/s per round {', '.join(f'{r:.2f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.2f}; p99 lane/usual median {statistics.median(p99):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
