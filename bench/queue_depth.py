"""What queue depth means in latency: a server under closed-loop load at rising concurrency, its
`infinity_queue_depth` gauge sampled every 50 ms, beside the clients' latency and throughput. The figures an
autoscaler's queue-depth target is set from (deploy/kubernetes/autoscaling/keda-queue-depth.yaml).

    python -m bench queue <artifact> [--concurrency 1 4 16 64] [--seconds 8] [--tokens 64]"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time
import urllib.request
from pathlib import Path

from bench.loadgen import closed_loop
from bench.process import Server
from infinity.engine.hostinfo import cpu_name

WORD = "lantern "  # one token each in MiniLM's vocabulary


def depth(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("infinity_queue_depth "):
                return float(line.split()[1])
    return 0.0


def measure(port: int, concurrency: int, seconds: float, text: str) -> dict[str, float]:
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(depth(port))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = asyncio.run(closed_loop(port, {"inputs": text}, concurrency, 10 ** 9, seconds))
    stop.set()
    sampler.join()
    summary = result.summary()
    return {"concurrency": concurrency, "queue_depth_mean": statistics.fmean(samples) if samples else 0.0,
            "queue_depth_max": max(samples, default=0.0), "req_s": float(summary["throughput_rps"]),  # type: ignore
            "p50_ms": float(summary["p50_ms"]), "p99_ms": float(summary["p99_ms"]),  # type: ignore[arg-type]
            "errors": sum(result.errors.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench queue", description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request's one text, about")
    args = parser.parse_args(argv)
    server = Server.infinity(args.artifact, "--public-metadata")
    port = server.port
    try:
        server.wait_ready()
        text = WORD * max(1, args.tokens - 2)
        rows = [measure(port, c, args.seconds, text) for c in args.concurrency]
    finally:
        server.stop()
    print(f"{cpu_name()} ({os.cpu_count()} CPUs); {args.artifact.name}; one text of about {args.tokens} tokens per "
          f"request; {args.seconds:.0f} s per concurrency")
    print("| concurrency | queue depth, mean (max) | req/s | p50 ms | p99 ms | errors |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['concurrency']} | {row['queue_depth_mean']:.1f} ({row['queue_depth_max']:.0f}) | "
              f"{row['req_s']:.0f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['errors']:.0f} |")
    return 0
