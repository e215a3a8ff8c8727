"""Short requests at scale: what the server delivers over HTTP against what the engine does in-process.

    python -m bench short <artifact dir> [--rounds 5] [--seq 8]

Per round, in this order and on one machine state: the in-process pipeline (tokenize + model +
post-process) at batch 1 and at batch 8, then the server over HTTP at concurrency 1, the bare server
(`bench.bare`) at concurrency 1, and the server at concurrency 16, one input per request. The figures:
- concurrency 16 req/s over the in-process batch-8 sequences/s (the ceiling for batched traffic);
- HTTP p50 at concurrency 1 minus the in-process batch-1 p50 (what a request pays for being served);
- the same for the bare server, which adds nothing but HTTP framing and one thread hand-off: this host's
  floor under the previous figure, and our p50 above the bare server's, the cost of the server itself.
Each is taken within a round and the median over rounds is reported: the machine drifts between rounds.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bench.inprocess import predict
from bench.loadgen import closed_loop
from bench.process import Server, free_port
from bench.stats import summarize
from bench.texts import text_with_tokens
from infinity.engine.model import LoadedModel


def in_process(model: LoadedModel, texts: list[str], seconds: float, max_calls: int) -> list[float]:
    """Milliseconds per call of the whole pipeline on `texts` as one batch."""
    inputs = texts[0] if len(texts) == 1 else texts
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(latencies) < max_calls and time.perf_counter() < deadline:
        start = time.perf_counter()
        predict(model, inputs)
        latencies.append((time.perf_counter() - start) * 1000)
    return latencies


def short_requests(port: int, model: LoadedModel, tokenizer_json: str, seq: int = 8, rounds: int = 5,
                   seconds: float = 2.0, bare_port: int | None = None) -> dict:
    """bare_port: a `bench.bare` server on the same artifact, timed at concurrency 1 right after ours."""
    text = text_with_tokens(tokenizer_json, seq)
    batch = [text] * 8
    payload = {"inputs": text}
    in_process(model, [text], 0.5, 50)
    asyncio.run(closed_loop(port, payload, 16, 200, 5))
    if bare_port is not None:
        asyncio.run(closed_loop(bare_port, payload, 1, 200, 2))
    rows = []
    for _ in range(rounds):
        time.sleep(0.2)  # a pause between sides: idle ONNX Runtime workers keep spinning for a moment
        single = summarize(in_process(model, [text], seconds, 2000), 1, 1)
        eight = in_process(model, batch, seconds, 2000)
        time.sleep(0.2)
        c1 = asyncio.run(closed_loop(port, payload, 1, 2000, seconds)).summary()
        bare = asyncio.run(closed_loop(bare_port, payload, 1, 2000, seconds)).summary() if bare_port else None
        c16 = asyncio.run(closed_loop(port, payload, 16, 20000, seconds)).summary()
        if c1["errors"] or c16["errors"] or (bare and bare["errors"]):
            raise RuntimeError(f"HTTP errors: {c1['errors']} {c16['errors']} {bare and bare['errors']}")
        engine8 = 8 * len(eight) / (sum(eight) / 1000)
        row = {"in_process_p50_ms": single["p50_ms"], "in_process_batch8_seq_s": engine8,
               "http_c1_p50_ms": c1["p50_ms"], "http_c16_rps": c16["throughput_rps"],
               "http_c16_p50_ms": c16["p50_ms"], "http_c16_p99_ms": c16["p99_ms"],
               "c16_over_engine8": c16["throughput_rps"] / engine8,
               "c1_overhead_ms": c1["p50_ms"] - single["p50_ms"],
               "c16_p99_over_p50": c16["p99_ms"] / c16["p50_ms"]}
        if bare is not None:
            row.update({"bare_c1_p50_ms": bare["p50_ms"], "bare_overhead_ms": bare["p50_ms"] - single["p50_ms"],
                        "c1_over_bare_ms": c1["p50_ms"] - bare["p50_ms"]})
        rows.append(row)
    summary = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    return {"seq": seq, "rounds": rows, "median": summary}


def table(name: str, result: dict) -> list[str]:
    m = result["median"]
    bare = (f"{m['bare_overhead_ms']:.2f} | {m['c1_over_bare_ms']:.2f}" if "bare_overhead_ms" in m else "- | -")
    return [f"| {name} | {result['seq']} | {m['in_process_p50_ms']:.2f} | {m['http_c1_p50_ms']:.2f} | "
            f"{m['c1_overhead_ms']:.2f} | {bare} | {m['in_process_batch8_seq_s']:.0f} | {m['http_c16_rps']:.0f} | "
            f"{m['c16_over_engine8']:.2f} | {m['c16_p99_over_p50']:.2f} |"]


HEADER = ["| model | seq | in-process p50 ms | HTTP c1 p50 ms | c1 overhead ms (goal <= 0.25) | "
          "bare server's c1 overhead ms (this host's floor) | ours over the bare server ms | "
          "in-process batch 8 seq/s | HTTP c16 req/s | c16 / batch 8 (goal >= 0.90) | c16 p99/p50 (goal <= 3) |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]


@contextlib.contextmanager
def servers(artifact: Path, threads: int) -> Iterator[tuple[int, int]]:
    """Our server and the bare one on the same artifact and cores, ready: their ports."""
    ours, bare = free_port(), free_port()
    started = [Server.infinity(artifact, "--threads", str(threads), port=ours),
               Server([sys.executable, "-m", "bench", "bare", str(artifact), "--port", str(bare),
                       "--threads", str(threads)], bare)]
    try:
        for server in started:
            server.wait_ready()
        yield ours, bare
    finally:
        for server in started:
            server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with servers(args.artifact, args.threads) as (port, bare_port):
        model = LoadedModel.load(args.artifact, threads=args.threads)
        result = short_requests(port, model, str(args.artifact / model.manifest.tokenizer.file), args.seq,
                                args.rounds, args.seconds, bare_port)
    print("\n".join(HEADER + table(args.artifact.name, result)))
    return 0
