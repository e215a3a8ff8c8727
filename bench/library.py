"""The bulk corpus embedded in Python, as a Python user would pick an engine: infinity.Model beside
sentence-transformers' encode (PyTorch FP32, the baseline), FastEmbed (its ONNX engine, the same model from a local
directory, `parallel` off and on) and this server over HTTP (the bulk job: batches of 64 from 2 clients), plus
`infinity embed` on the same corpus as a JSONL file, in one run. infinity.Model and the server run with one engine
(their default) and with `--engines` (default: one per physical core, each on one thread).

    python -m bench library ARTIFACT --model MODEL_DIR [--fastembed-dir ONNX_DIR] [--rounds 3] [--corpus FILE]
                            [--engines N]

Each engine runs in a process of its own (its peak RSS is that process's), in a shuffled order each round, and is
timed from its first text to its last vector, after it has loaded and embedded a few texts. FastEmbed runs in
bench/work/fastembed-venv (`python3 -m venv bench/work/fastembed-venv && bench/work/fastembed-venv/bin/pip install
fastembed==0.9.1`) on an ONNX export of the model (`python -m bench peer model MODEL_DIR DIR` writes one, model.onnx).
Reported per engine: the median seconds, real tokens per second (the artifact's tokenizer), peak RSS, cosine_min to
sentence-transformers FP32, and the fastest infinity.Model's time over each engine's, per round."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bulk import BulkJob, cosine_min, send_all, token_count
from bench.corpus import build as build_corpus
from bench.corpus import load as load_corpus
from bench.process import Server
from bench.run import WORK

FASTEMBED = WORK / "fastembed-venv" / "bin" / "python"
WARM = 8  # texts embedded before the clock starts


def run_api(artifact: str, texts: list[str], threads: int | None, engines: int) -> np.ndarray:
    from infinity import Model

    with Model(artifact, threads=threads, engines=engines) as model:
        model.embed(texts[:WARM])
        started = time.perf_counter()
        vectors = model.embed(texts)
        report(time.perf_counter() - started)
    return vectors


def run_sentence_transformers(model: str, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(model, device="cpu")
    encoder.encode(texts[:WARM])
    started = time.perf_counter()
    vectors = encoder.encode(texts, batch_size=32)
    report(time.perf_counter() - started)
    return np.asarray(vectors, np.float32)


FASTEMBED_RUN = """
import json, resource, sys, time
import numpy as np
from fastembed import TextEmbedding

directory, corpus, out, parallel = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
texts = json.load(open(corpus))
model = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=directory)
parallel = None if parallel == "none" else int(parallel)
list(model.embed(texts[:8]))
started = time.perf_counter()
vectors = np.asarray(list(model.embed(texts, batch_size=256, parallel=parallel)), np.float32)
seconds = time.perf_counter() - started
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
np.save(out, vectors)
print(json.dumps({"seconds": seconds, "rss_mib": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                                     children) / 1024}))
"""


WHOLE = """
import json, resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
seconds = time.perf_counter() - started
if done.returncode:
    sys.exit(done.stderr)
print(json.dumps({"seconds": seconds, "rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def report(seconds: float) -> None:
    print(json.dumps({"seconds": seconds, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def child(args: argparse.Namespace) -> int:
    """One engine in this process: its vectors to --out, its seconds and peak RSS on stdout."""
    texts = load_corpus(args.corpus)
    if args.run == "api":
        vectors = run_api(str(args.artifact), texts, args.threads, args.engines)
    else:
        vectors = run_sentence_transformers(str(args.model), texts)
    np.save(args.out, vectors)
    return 0


def measure(command: list[str], out: Path) -> tuple[float, float, np.ndarray]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} ...: {done.stderr[-2000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return figures["seconds"], figures["rss_mib"], np.load(out)


def http(artifact: Path, texts: list[str], threads: int | None, engines: int) -> tuple[float, float, np.ndarray]:
    server = Server.infinity(artifact, *(["--threads", str(threads)] if threads else []), "--engines", str(engines))
    try:
        server.wait_ready()
        seconds, vectors, errors = asyncio.run(send_all(server.port, "/v1/embeddings", BulkJob(texts, 64, 2)))
        if errors:
            raise RuntimeError(f"the server answered errors: {errors}")
        return seconds, server.memory()["VmHWM"], vectors
    finally:
        server.stop()


def corpus_command(artifact: Path, texts: list[str], scratch: Path, threads: int | None) -> tuple[float, float,
                                                                                                   np.ndarray]:
    source = scratch / "corpus.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    out = scratch / "vectors.jsonl"
    out.unlink(missing_ok=True)
    command = [sys.executable, "-m", "infinity", "embed", str(artifact), "--input", str(source), "--output", str(out),
               "--no-progress", *(["--threads", str(threads)] if threads else [])]
    # timed whole, its load included, from a process of its own that reads the command's peak RSS
    done = subprocess.run([sys.executable, "-c", WHOLE, *command], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    seconds, rss = figures["seconds"], figures["rss_mib"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return seconds, rss, np.asarray([row["embedding"] for row in rows], np.float32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--model", type=Path, required=True, help="the sentence-transformers directory")
    parser.add_argument("--fastembed-dir", type=Path, default=None, help="an ONNX export of the model for FastEmbed")
    parser.add_argument("--corpus", type=Path, default=None, help="python -m bench corpus's file (default: built)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--engines", type=int, default=None, help="the second infinity.Model and server's engines "
                                                                  "(default: the threads, one each)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these rows (the table's names), for more "
                                                                  "rounds of a pair")
    parser.add_argument("--run", choices=("api", "st"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        return child(args)
    from infinity.engine.hostinfo import cpu_name, physical_cores

    many = args.engines or args.threads or physical_cores()
    scratch = Path(tempfile.mkdtemp(prefix="bench-library-"))
    texts = load_corpus(args.corpus) if args.corpus else build_corpus()
    corpus = scratch / "corpus.json"
    corpus.write_text(json.dumps(texts))
    tokens = token_count(args.artifact, texts)
    print(f"# {cpu_name()}: {len(texts)} texts, {tokens} tokens, {args.rounds} rounds", flush=True)
    me = [sys.executable, "-m", "bench", "library", str(args.artifact), "--model", str(args.model), "--corpus",
          str(corpus), *(["--threads", str(args.threads)] if args.threads else [])]
    engines = {
        "infinity.Model": lambda: measure([*me, "--run", "api", "--engines", "1", "--out", str(scratch / "api.npy")],
                                          scratch / "api.npy"),
        f"infinity.Model, engines={many}": lambda: measure(
            [*me, "--run", "api", "--engines", str(many), "--out", str(scratch / "api.npy")], scratch / "api.npy"),
        "sentence-transformers": lambda: measure([*me, "--run", "st", "--out", str(scratch / "st.npy")],
                                                 scratch / "st.npy"),
        "this server over HTTP": lambda: http(args.artifact, texts, args.threads, 1),
        f"this server over HTTP, --engines {many}": lambda: http(args.artifact, texts, args.threads, many),
        "infinity embed": lambda: corpus_command(args.artifact, texts, scratch, args.threads),
    }
    if args.fastembed_dir:
        for parallel in ("none", "0"):
            out = scratch / f"fastembed-{parallel}.npy"
            command = [str(FASTEMBED), "-c", FASTEMBED_RUN, str(args.fastembed_dir), str(corpus), str(out), parallel]
            engines[f"fastembed parallel={parallel}"] = lambda command=command, out=out: measure(command, out)
    if args.only:
        unknown = set(args.only) - set(engines)
        if unknown:
            parser.error(f"--only: no rows named {sorted(unknown)}; the rows: {list(engines)}")
        engines = {name: run for name, run in engines.items() if name in args.only}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    rss: dict[str, float] = {}
    vectors: dict[str, np.ndarray] = {}
    for round_ in range(args.rounds):
        order = list(engines)
        random.Random(round_).shuffle(order)
        for name in order:
            took, peak, answer = engines[name]()
            seconds[name].append(took)
            rss[name] = max(rss.get(name, 0.0), peak)
            vectors[name] = answer
            print(f"round {round_ + 1} {name}: {took:.2f} s, {tokens / took:,.0f} tokens/s, peak RSS {peak:,.0f} MiB",
                  flush=True)
    reference = vectors.get("sentence-transformers")
    fastest = min((name for name in engines if name.startswith("infinity.Model")),
                  key=lambda name: statistics.median(seconds[name]), default=next(iter(engines)))
    print(f"\n| engine | median s | tokens/s | peak RSS MiB | cosine_min to PyTorch FP32 | {fastest} / it per round |")
    print("|---|---|---|---|---|---|")
    for name in engines:
        median = statistics.median(seconds[name])
        ratios = ", ".join(f"{theirs / ours:.2f}" for ours, theirs in zip(seconds[fastest], seconds[name]))
        print(f"| {name} | {median:.2f} | {tokens / median:,.0f} | {rss[name]:,.0f} | "
              f"{'-' if reference is None else f'{cosine_min(vectors[name], reference):.4f}'} | {ratios} |")
    return 0
