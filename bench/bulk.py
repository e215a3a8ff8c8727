"""A bulk indexing job: a corpus of real passages sent as OpenAI embedding requests of many texts each, from a few
clients at once, to this server and (optionally) a peer server, one at a time, in the same run.

    python -m bench bulk ARTIFACT [--model MODEL_DIR] [--batch 64] [--clients 2] [--rounds 3] [--corpus FILE]
                         [--peer "COMMAND with {port}" --peer-path /embeddings --peer-dir DIR] [--grpc]

Each round starts every server afresh, in a shuffled order, and times the whole corpus: from the first request to
the last answer. Reported per server: seconds, real tokens per second (the artifact's tokenizer, cut at its maximum
length), every answer's cosine with the original model's (sentence-transformers, PyTorch FP32, when --model is
given), and for this server the padded tokens it ran per real one (from /metrics) and whether a sample of texts sent
alone answers bit for bit what it answered inside the bulk requests. ratio = peer seconds / ours, per round.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.corpus import build as build_corpus
from bench.corpus import load as load_corpus
from bench.loadgen import Connection
from bench.process import Server, free_port

SAMPLE = 48  # texts sent alone again, to compare with their answers inside the bulk requests


@dataclass
class BulkJob:
    texts: list[str]
    batch: int
    clients: int

    def bodies(self) -> list[tuple[int, bytes]]:
        return [(start, orjson.dumps({"input": self.texts[start:start + self.batch], "model": "any"}))
                for start in range(0, len(self.texts), self.batch)]


@dataclass
class Run:
    server: str
    seconds: float
    vectors: np.ndarray
    padded_per_real: float | None = None
    alone_identical: bool | None = None
    errors: dict[str, int] = field(default_factory=dict)


async def send_all(port: int, path: str, job: BulkJob) -> tuple[float, np.ndarray, dict[str, int]]:
    """The job's requests from its clients, each taking the next request as its answer arrives."""
    bodies = job.bodies()
    answers: dict[int, list[list[float]]] = {}
    errors: dict[str, int] = {}
    turn = iter(bodies)

    async def client() -> None:
        connection = Connection("127.0.0.1", port)
        try:
            for start, body in turn:
                status, _, payload = await connection.post(path, body)
                if status != 200:
                    errors[str(status)] = errors.get(str(status), 0) + 1
                    continue
                answers[start] = [row["embedding"] for row in sorted(orjson.loads(payload)["data"],
                                                                        key=lambda row: row["index"])]
        finally:
            await connection.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(job.clients)))
    seconds = time.perf_counter() - started
    rows = [vector for start, _ in bodies if start in answers for vector in answers[start]]
    return seconds, np.asarray(rows, np.float32), errors


def metric(port: int, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def alone_identical(port: int, texts: list[str], batched: np.ndarray, indices: list[int]) -> bool:
    async def each() -> np.ndarray:
        connection = Connection("127.0.0.1", port)
        rows = []
        try:
            for i in indices:
                _, _, payload = await connection.post("/v1/embeddings", orjson.dumps({"input": texts[i]}))
                rows.append(orjson.loads(payload)["data"][0]["embedding"])
        finally:
            await connection.close()
        return np.asarray(rows, np.float32)

    return bool(np.array_equal(asyncio.run(each()), batched[indices]))


def ours(artifact: Path, job: BulkJob, threads: int | None, sample: list[int]) -> Run:
    server = Server.infinity(artifact, "--max-inputs-per-request", str(max(job.batch, 512)),
                             *(["--threads", str(threads)] if threads else []))
    port = server.port
    try:
        server.wait_ready()
        padded, real = metric(port, "infinity_padded_tokens_total"), metric(port, "infinity_real_tokens_total")
        seconds, vectors, errors = asyncio.run(send_all(port, "/v1/embeddings", job))
        padded, real = metric(port, "infinity_padded_tokens_total") - padded, \
            metric(port, "infinity_real_tokens_total") - real
        identical = alone_identical(port, job.texts, vectors, sample) if len(vectors) == len(job.texts) else None
        return Run("ours", seconds, vectors, padded / real if real else None, identical, errors)
    finally:
        server.stop()


async def send_streamed(address: str, job: BulkJob) -> tuple[float, np.ndarray, dict[str, int]]:
    """The job's texts as tei.v1 EmbedStream messages, one text each, over one stream a client: each stream keeps up
    to a batch's worth of texts in flight, taking the next text as an answer arrives."""
    import grpc

    from tests.tei_client import generated

    pb, rpc = generated()
    answers: dict[int, np.ndarray] = {}
    errors: dict[str, int] = {}
    turn = iter(range(len(job.texts)))

    async def client(embed: Any) -> None:
        sent: asyncio.Queue[int | None] = asyncio.Queue(job.batch)

        async def messages() -> Any:
            for i in turn:
                await sent.put(i)
                yield pb.EmbedRequest(inputs=job.texts[i], truncate=True)
            await sent.put(None)

        try:
            async for answer in embed.EmbedStream(messages(), timeout=600):
                i = await sent.get()
                assert i is not None
                answers[i] = np.asarray(answer.embeddings, np.float32)
        except grpc.aio.AioRpcError as error:
            errors[error.code().name] = errors.get(error.code().name, 0) + 1

    started = time.perf_counter()
    async with grpc.aio.insecure_channel(address) as channel:
        embed = rpc.EmbedStub(channel)
        await asyncio.gather(*(client(embed) for _ in range(job.clients)))
    seconds = time.perf_counter() - started
    rows = [answers[i] for i in range(len(job.texts)) if i in answers]
    return seconds, np.asarray(rows, np.float32), errors


def ours_streamed(artifact: Path, job: BulkJob, threads: int | None) -> Run:
    grpc_port = free_port()
    server = Server.infinity(artifact, "--grpc-port", str(grpc_port), *(["--threads", str(threads)] if threads else []))
    try:
        server.wait_ready()
        seconds, vectors, errors = asyncio.run(send_streamed(f"127.0.0.1:{grpc_port}", job))
        return Run("ours, EmbedStream", seconds, vectors, errors=errors)
    finally:
        server.stop()


def peer(command: str, path: str, directory: Path | None, job: BulkJob) -> Run:
    port = free_port()
    server = Server(shlex.split(command.format(port=port)), port, cwd=directory)
    try:
        server.wait_ready(600, path="/health")
        seconds, vectors, errors = asyncio.run(send_all(port, path, job))
        return Run("peer", seconds, vectors, errors=errors)
    finally:
        server.stop()


def token_count(artifact: Path, texts: list[str]) -> int:
    from tokenizers import Tokenizer

    from infinity.manifest import Manifest

    manifest = Manifest.load(artifact)
    tokenizer = Tokenizer.from_file(str(artifact / manifest.tokenizer.file))
    tokenizer.no_padding()
    tokenizer.enable_truncation(manifest.tokenizer.max_length)
    return sum(len(encoding.ids) for encoding in tokenizer.encode_batch(texts))


def reference(model: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return np.asarray(SentenceTransformer(str(model), device="cpu").encode(texts, batch_size=32), np.float32)


def cosine_min(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("nan")
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--model", type=Path, default=None, help="the original sentence-transformers directory")
    parser.add_argument("--corpus", type=Path, default=None, help="python -m bench corpus's file (default: built)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--peer", default=None, help="the peer server's command, with {port} (bench/peer.py)")
    parser.add_argument("--peer-path", default="/embeddings")
    parser.add_argument("--peer-dir", type=Path, default=None, help="where the peer starts (its model directory)")
    parser.add_argument("--grpc", action="store_true", help="also send the corpus to this server as tei.v1 "
                        "EmbedStream messages, one text each, one stream a client (--grpc-port)")
    args = parser.parse_args()
    texts = load_corpus(args.corpus) if args.corpus else build_corpus()
    job = BulkJob(texts, args.batch, args.clients)
    tokens = token_count(args.artifact, texts)
    expected = reference(args.model, texts) if args.model else None
    sample = random.Random(0).sample(range(len(texts)), min(SAMPLE, len(texts)))
    from infinity.engine.hostinfo import cpu_name

    print(f"# {cpu_name()}: {len(texts)} texts, {tokens} tokens, batches of {args.batch} from {args.clients} "
          f"clients, {args.rounds} rounds", flush=True)
    runs: dict[str, list[Run]] = {"ours": [], "peer": [], "ours, EmbedStream": []}
    for round_ in range(args.rounds):
        order = ["ours", *(["peer"] if args.peer else []), *(["ours, EmbedStream"] if args.grpc else [])]
        random.Random(round_).shuffle(order)
        for name in order:
            if name == "ours":
                run = ours(args.artifact, job, args.threads, sample)
            elif name == "peer":
                run = peer(args.peer, args.peer_path, args.peer_dir, job)
            else:
                run = ours_streamed(args.artifact, job, args.threads)
            runs[name].append(run)
            cos = cosine_min(run.vectors, expected) if expected is not None else float("nan")
            print(f"round {round_ + 1} {name}: {run.seconds:.2f} s, {tokens / run.seconds:,.0f} tokens/s, cosine_min "
                  f"{cos:.4f}, padded/real {run.padded_per_real or float('nan'):.3f}, alone = batched "
                  f"{run.alone_identical}" + (f", errors {run.errors}" if run.errors else ""), flush=True)
    for name, done in runs.items():
        if done:
            seconds = statistics.median(run.seconds for run in done)
            print(f"{name}: median {seconds:.2f} s, {tokens / seconds:,.0f} tokens/s")
    if runs["ours, EmbedStream"]:
        ratios = [o.seconds / g.seconds for o, g in zip(runs["ours"], runs["ours, EmbedStream"])]
        print(f"EmbedStream / HTTP tokens/s per round: {', '.join(f'{r:.2f}' for r in ratios)} "
              f"(median {statistics.median(ratios):.2f})")
    if runs["peer"]:
        ratios = [p.seconds / o.seconds for o, p in zip(runs["ours"], runs["peer"])]
        print(f"ours / peer tokens/s per round: {', '.join(f'{r:.2f}' for r in ratios)} "
              f"(median {statistics.median(ratios):.2f})")
