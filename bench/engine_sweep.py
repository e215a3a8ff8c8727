"""In-process sweep (no HTTP): cores x sequence length x batch size, exact token counts.

    python -m bench engine-sweep <artifact> --cores 1 2 --seq 8 128 --batch 1 8

Each call is the whole in-process pipeline: validate, tokenize, pad, run, post-process.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import orjson

from bench.inprocess import predict
from bench.stats import summarize
from bench.texts import text_with_tokens
from infinity.engine.model import LoadedModel


def measure(model: LoadedModel, text: str, batch: int, seconds: float, max_calls: int) -> dict[str, float]:
    inputs = [text] * batch if batch > 1 else text
    for _ in range(3):
        predict(model, inputs)
    latencies: list[float] = []
    start = time.perf_counter()
    while len(latencies) < max_calls and time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        predict(model, inputs)
        latencies.append((time.perf_counter() - t0) * 1000)
    wall = time.perf_counter() - start
    summary = summarize(latencies, wall, len(latencies))
    summary["sequences_per_s"] = summary["throughput_rps"] * batch
    return summary


def sweep(artifact: Path, cores: list[int], seqs: list[int], batches: list[int], seconds: float = 2.0,
          max_calls: int = 500, spin_wait: bool = True) -> list[dict[str, float]]:
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    rows = []
    for n in [c for c in cores if c <= available]:
        model = LoadedModel.load(artifact, threads=n, spin_wait=spin_wait)
        tokenizer_json = str(artifact / model.manifest.tokenizer.file)
        for seq in [s for s in seqs if s <= model.manifest.tokenizer.max_length]:
            text = text_with_tokens(tokenizer_json, seq)
            for batch in batches:
                row = {"cores": n, "seq": seq, "batch": batch, **measure(model, text, batch, seconds, max_calls)}
                rows.append(row)
                print(f"cores {n} seq {seq:>3} batch {batch:>2}: p50 {row['p50_ms']:8.2f} ms  "
                      f"{row['sequences_per_s']:8.1f} seq/s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--cores", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seq", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256, 384, 512])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--seconds", type=float, default=2.0, help="time budget per configuration")
    parser.add_argument("--spin-wait", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    rows = sweep(args.artifact, args.cores, args.seq, args.batch, args.seconds, spin_wait=args.spin_wait)
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
