"""In-process pipeline vs the same artifact over HTTP, at exact token counts, batch 1, concurrency 1.

    python -m bench overhead <artifact dir> [--seq 8 128] [--requests 200]

Both are measured in the same run, in alternating blocks per sequence length; the report is medians and ratios.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from bench.inprocess import predict
from bench.loadgen import closed_loop
from bench.process import Server
from bench.texts import text_with_tokens
from infinity.engine.model import LoadedModel


def compare(port: int, model: LoadedModel, text: str, requests: int, block: int = 25) -> dict[str, float]:
    """In-process pipeline p50 vs HTTP p50 for one text, in alternating blocks of `block` calls each.

    Short blocks, not one long run per side: on a shared machine the speed drifts over seconds, and
    both medians must see the same drift.
    """
    for _ in range(10):
        predict(model, text)
    asyncio.run(closed_loop(port, {"inputs": text}, 1, 10, 60))
    local: list[float] = []
    remote: list[float] = []
    compute: list[float] = []
    for _ in range(max(1, requests // block)):
        # A pause between sides: a process's idle worker threads keep spinning for a moment after each run.
        time.sleep(0.05)
        for _ in range(block):
            start = time.perf_counter()
            predict(model, text)
            local.append((time.perf_counter() - start) * 1000)
        time.sleep(0.05)
        result = asyncio.run(closed_loop(port, {"inputs": text}, 1, block, 60))
        if result.errors:
            raise RuntimeError(f"HTTP errors: {result.errors}")
        remote += result.latencies_ms
        compute += result.compute_ms
    a, b = statistics.median(local), statistics.median(remote)
    return {"in_process_p50_ms": a, "http_p50_ms": b, "compute_p50_ms": statistics.median(compute),
            "ratio": b / a, "requests": len(remote)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--seq", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--spin-wait", action=argparse.BooleanOptionalAction, default=True,
                        help="let ONNX Runtime workers busy-wait briefly, both sides (the server's default)")
    args = parser.parse_args()

    flags = [*(["--threads", str(args.threads)] if args.threads else []),
             *([] if args.spin_wait else ["--no-spin-wait"])]
    server = Server.infinity(args.artifact, *flags)
    port = server.port
    try:
        model = LoadedModel.load(args.artifact, threads=args.threads, spin_wait=args.spin_wait)
        server.wait_ready()
        print(f"{'seq':>5} {'in-process p50 ms':>18} {'HTTP p50 ms':>12} {'x-compute p50':>14} "
              f"{'HTTP/in-process':>16}")
        for seq in args.seq:
            text = text_with_tokens(str(args.artifact / model.manifest.tokenizer.file), seq)
            row = compare(port, model, text, args.requests)
            print(f"{seq:>5} {row['in_process_p50_ms']:>18.2f} {row['http_p50_ms']:>12.2f} "
                  f"{row['compute_p50_ms']:>14.2f} {row['ratio']:>16.2f}")
    finally:
        server.stop()
    return 0
