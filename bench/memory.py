"""Peak resident memory of a server answering full batches: idle, after one request of `--batch` texts that
each fill `--tokens` tokens, and after `--requests` of them (a steady state that keeps growing is a leak); with
`--chunk-tokens N` (a dense embedding artifact), after one more request of `--batch` texts of N tokens each, embedded
whole in windows.

    python -m bench memory <artifact> [--batch 32] [--tokens 256] [--requests 4] [--chunk-tokens 8000]

For a sparse-embedding artifact it prints beside them the size of one batch's masked-LM logits (batch x tokens x
vocabulary floats), the most its graph may hold at once."""
from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

from bench.process import Server
from infinity.engine.hostinfo import cpu_name
from infinity.manifest import Manifest

MIB = 2 ** 20
FILLER = "antidisestablishmentarianism supercalifragilistic lantern harbor "  # many tokens per word


def shown(server: Server) -> str:
    memory = server.memory()
    return f"VmRSS {memory['VmRSS']:.0f} MiB, peak (VmHWM) {memory['VmHWM']:.0f} MiB"


def post(port: int, path: str, body: object, timeout: float = 600) -> object:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--chunk-tokens", type=int, default=0, help="then one request of texts this long, chunked")
    args = parser.parse_args(argv)
    manifest = Manifest.load(args.artifact)
    tokens = min(args.tokens, manifest.tokenizer.max_length)
    server = Server.infinity(args.artifact, "--max-batch-size", str(args.batch),
                             "--max-batch-tokens", str(args.batch * tokens),
                             "--max-chunks-per-input", str(args.chunk_tokens // 100 + 1),
                             "--max-payload-bytes", str(max(1_000_000, 40 * args.batch * args.chunk_tokens)))
    port = server.port
    try:
        server.wait_ready()
        # each text runs past `tokens`, so the batcher pads (and the tokenizer cuts) every row to the same length
        texts = [f"{i} " + FILLER * (tokens // 4 + 1) for i in range(args.batch)]
        counted = post(port, "/tokenize", {"inputs": texts[:1]})
        assert isinstance(counted, list) and len(counted[0]) > tokens
        print(f"{cpu_name()}; {args.artifact.name}: {manifest.source.task}, {manifest.model.precision}; "
              f"{args.batch} texts x {tokens} tokens per request")
        print(f"idle:                 {shown(server)}")
        for done in range(1, args.requests + 1):
            start = time.perf_counter()
            post(port, "/predict", {"inputs": texts})
            seconds = time.perf_counter() - start
            if done in (1, args.requests):
                print(f"after {done} request(s): {shown(server)} ({seconds:.2f} s for the last)")
        if args.chunk_tokens:
            per_filler = len(counted[0]) / (tokens // 4 + 1)  # type: ignore[index]
            documents = [f"{i} " + FILLER * int(args.chunk_tokens / per_filler) for i in range(args.batch)]
            length = post(port, "/tokenize", {"inputs": documents[:1]})
            start = time.perf_counter()
            post(port, "/predict", {"inputs": documents, "parameters": {"chunking": True}})
            print(f"after {args.batch} texts of {len(length[0])} tokens, chunked: "  # type: ignore[index]
                  f"{shown(server)} ({time.perf_counter() - start:.2f} s)")
        if manifest.source.task == "sparse-embedding" and manifest.task.embedding_dim:
            logits = args.batch * tokens * manifest.task.embedding_dim * 4
            print(f"one batch's logits:   {logits // MIB} MiB ({args.batch} x {tokens} x "
                  f"{manifest.task.embedding_dim} float32)")
    finally:
        server.stop()
    return 0
