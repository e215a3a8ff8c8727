"""Throughput by cores: each server pinned to 1, 2, 4, 8 cores, as one engine with every thread or as several
engines (replicas, each its own process on its own cores), beside the vanilla server pinned the same way.

    python -m bench cores minilm=ARTIFACT ... [--vanilla minilm=MODEL_DIR ...] [--cores 1 2 4 8]
                          [--layouts 1x8 8x1 ...] [--seq 8 64 256] [--concurrency 1 8] [--corpus corpus.json]
                          [--seconds 1.5] [--json results.json]

One physical core each: the servers run on the first CPU of as many cores as the cell has, the load generator
(uvloop clients in up to four processes) on CPUs of other cores. A cell is one text of exactly `seq` tokens per
request, `concurrency` keep-alive connections spread over a layout's engines, each sending its next request as
its answer arrives, for `seconds`; the bulk cell sends the corpus (`python -m bench corpus`) in batches of
`--bulk-batch` texts from `--bulk-clients` connections. A connection's rate is its requests (or real tokens) over
the time it waited for answers; a cell's is the sum over its connections, so a slow cell needs only a request or
two per connection. `--vanilla-device cuda --vanilla-dtype float16` runs the vanilla server on a GPU.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from bench.corpus import load as load_corpus
from bench.loadgen import Connection
from bench.process import Server, cpu_list, free_port
from bench.stats import percentile
from bench.texts import text_with_tokens

MAX_CLIENT_PROCESSES = 4


@dataclass(frozen=True)
class Layout:
    engines: int
    threads: int

    @property
    def cores(self) -> int:
        return self.engines * self.threads

    def __str__(self) -> str:
        return f"{self.engines}x{self.threads}"

    @classmethod
    def parse(cls, text: str) -> Layout:
        engines, _, threads = text.partition("x")
        return cls(int(engines), int(threads))


def default_layouts(cores: int) -> list[Layout]:
    """One engine with every core, one engine a core, and two engines splitting the cores from eight up."""
    layouts = [Layout(1, cores)]
    if cores > 1:
        layouts.append(Layout(cores, 1))
    if cores >= 8 and cores % 2 == 0:
        layouts.append(Layout(2, cores // 2))
    return layouts


def core_groups(cpus: set[int]) -> list[list[int]]:
    """The CPUs of each physical core (hyperthread siblings together), ordered by their first CPU."""
    groups: dict[tuple[str, str], list[int]] = {}
    for cpu in sorted(cpus):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
        except OSError:
            key = ("", str(cpu))
        groups.setdefault(key, []).append(cpu)
    return sorted(groups.values())


def placement(cores: int, client_cpus: str | None = None) -> tuple[list[int], list[int]]:
    """(one CPU on each of the first `cores` physical cores, for the servers; the CPUs for the load generator)."""
    groups = core_groups(os.sched_getaffinity(0))
    if client_cpus is not None:
        clients = sorted(cpu_list(client_cpus))
        groups = [g for g in groups if not set(g) & set(clients)]
    if len(groups) < cores:
        raise ValueError(f"{cores} cores asked for, {len(groups)} physical cores free here")
    servers = [group[0] for group in groups[:cores]]
    if client_cpus is None:
        rest = [cpu for group in groups[cores:] for cpu in group]
        # on a host with no core to spare, the clients share the servers' siblings, then the servers' CPUs
        clients = rest or [cpu for group in groups[:cores] for cpu in group[1:]] or servers
    return servers, clients


@dataclass
class Cell:
    model: str
    server: str  # "ours" or "vanilla"
    layout: str  # engines x threads; vanilla: one process with every thread
    cores: int
    kind: str  # "seq" or "bulk"
    seq: int = 0
    concurrency: int = 0
    req_s: float = 0.0
    tokens_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class Load:
    """What one client process is given: its connections' ports, the bodies each connection cycles through."""
    ports: list[int]
    bodies: list[tuple[bytes, int]]  # (JSON body, real tokens)
    connections: list[int]  # indices among the cell's connections
    total: int  # the cell's connections: connection i sends bodies i, i + total, ...
    seconds: float
    min_requests: int


def _drive(load: Load, cpu: int, results: multiprocessing.connection.Connection) -> None:
    os.sched_setaffinity(0, {cpu})
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    until = time.monotonic() + load.seconds

    async def connection(index: int) -> tuple[list[float], int, dict[str, int]]:
        client = Connection("127.0.0.1", load.ports[index % len(load.ports)])
        latencies, tokens, errors, turn = [], 0, {}, index
        try:
            while True:
                body, body_tokens = load.bodies[turn % len(load.bodies)]
                turn += load.total
                start = time.monotonic()
                try:
                    status, _, _ = await client.post("/predict", body)
                except (OSError, ConnectionError, asyncio.IncompleteReadError) as exc:
                    status = 0
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    await client.close()
                end = time.monotonic()
                if status == 200:
                    latencies.append(end - start)
                    tokens += body_tokens
                elif status:
                    errors[str(status)] = errors.get(str(status), 0) + 1
                if end >= until and (len(latencies) >= load.min_requests or sum(errors.values()) > 100):
                    return latencies, tokens, errors
        finally:
            await client.close()

    async def every() -> list[tuple[list[float], int, dict[str, int]]]:
        return list(await asyncio.gather(*(connection(i) for i in load.connections)))

    results.send(run(every()))
    results.close()


def drive(ports: list[int], bodies: list[tuple[bytes, int]], concurrency: int, seconds: float,
          client_cpus: list[int], min_requests: int = 1) -> tuple[float, float, list[float], dict[str, int]]:
    """(requests/s, real tokens/s, latencies in ms, errors) of `concurrency` closed-loop connections."""
    processes = min(concurrency, len(client_cpus), MAX_CLIENT_PROCESSES)
    context = multiprocessing.get_context("fork")
    pipes, children = [], []
    for p in range(processes):
        load = Load(ports, bodies, list(range(p, concurrency, processes)), concurrency, seconds, min_requests)
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_drive, args=(load, client_cpus[p], send))
        child.start()
        send.close()
        pipes.append(receive)
        children.append(child)
    per_connection = [item for pipe in pipes for item in pipe.recv()]
    for child in children:
        child.join()
    req_s = tokens_s = 0.0
    latencies: list[float] = []
    errors: dict[str, int] = {}
    for waits, tokens, failed in per_connection:
        busy = sum(waits)
        if busy:
            req_s += len(waits) / busy
            tokens_s += tokens / busy
        latencies += [w * 1000 for w in waits]
        for name, count in failed.items():
            errors[name] = errors.get(name, 0) + count
    return req_s, tokens_s, latencies, errors


def warm(ports: list[int], body: bytes) -> None:
    async def once(port: int) -> None:
        client = Connection("127.0.0.1", port)
        try:
            await client.post("/predict", body)
        finally:
            await client.close()

    for port in ports:
        asyncio.run(once(port))


@dataclass
class Group:
    """The servers of one measured setup: a layout's engines, or one vanilla process."""
    model: str
    server: str
    layout: str
    cores: int
    ports: list[int]
    tokenizer: Path
    max_length: int


def start_ours(artifact: Path, layout: Layout, cpus: list[int], serve_args: Sequence[str]) -> list[Server]:
    servers = []
    for engine in range(layout.engines):
        own = set(cpus[engine * layout.threads:(engine + 1) * layout.threads])
        servers.append(Server.infinity(artifact, "--threads", str(layout.threads), *serve_args, cpus=own))
    return servers


def start_vanilla(model_dir: Path, cores: int, cpus: list[int], device: str, dtype: str) -> Server:
    port = free_port()
    return Server([sys.executable, "-m", "bench", "vanilla-server", str(model_dir), "--port", str(port), "--threads",
                   str(cores), "--task", "feature-extraction", "--device", device, "--dtype", dtype],
                  port, set(cpus[:cores]))


def token_counts(tokenizer_json: Path, max_length: int, texts: list[str]) -> list[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return [len(encoding.ids) for encoding in tokenizer.encode_batch(texts)]


def quantiles(latencies: list[float]) -> tuple[float, float]:
    return (percentile(latencies, 50), percentile(latencies, 99)) if latencies else (0.0, 0.0)


def measure(group: Group, args: argparse.Namespace, corpus: list[str], client_cpus: list[int]) -> Iterator[Cell]:
    for seq in args.seq:
        text = text_with_tokens(str(group.tokenizer), seq)
        body = orjson.dumps({"inputs": text})
        warm(group.ports, body)
        for concurrency in args.concurrency:
            req_s, tokens_s, latencies, errors = drive(group.ports, [(body, seq)], concurrency, args.seconds,
                                                       client_cpus)
            yield Cell(group.model, group.server, group.layout, group.cores, "seq", seq, concurrency, req_s,
                       tokens_s, *quantiles(latencies), len(latencies), errors)
    if corpus:
        counts = token_counts(group.tokenizer, group.max_length, corpus)
        batch = args.bulk_batch
        bodies = [(orjson.dumps({"inputs": corpus[i:i + batch]}), sum(counts[i:i + batch]))
                  for i in range(0, len(corpus), batch)]
        req_s, tokens_s, latencies, errors = drive(group.ports, bodies, args.bulk_clients, args.bulk_seconds,
                                                   client_cpus)
        yield Cell(group.model, group.server, group.layout, group.cores, "bulk", 0, args.bulk_clients, req_s,
                   tokens_s, *quantiles(latencies), len(latencies), errors)


def tokenizer_of(directory: Path) -> tuple[Path, int]:
    """(tokenizer file, longest input) of an artifact, or of a sentence-transformers directory (vanilla only)."""
    from infinity.manifest import Manifest

    if (directory / "manifest.json").is_file():
        manifest = Manifest.load(directory)
        return directory / manifest.tokenizer.file, manifest.tokenizer.max_length
    return directory / "tokenizer.json", orjson.loads((directory / "sentence_bert_config.json").read_bytes())[
        "max_seq_length"]


@contextmanager
def serving(model: str, artifact: Path, vanilla: Path | None, args: argparse.Namespace,
            server_cpus: list[int]) -> Iterator[list[Group]]:
    """Every server of one model, started together and stopped together."""
    tokenizer, max_length = tokenizer_of(artifact)
    with ExitStack() as stack:
        groups, started = [], []
        for cores in args.cores:
            for layout in args.layouts or default_layouts(cores):
                if layout.cores != cores or "ours" not in args.servers:
                    continue
                servers = start_ours(artifact, layout, server_cpus, args.serve_args.split())
                started += servers
                groups.append(Group(model, "ours", str(layout), cores, [s.port for s in servers], tokenizer,
                                    max_length))
            if vanilla is not None and "vanilla" in args.servers:
                server = start_vanilla(vanilla, cores, server_cpus, args.vanilla_device, args.vanilla_dtype)
                started.append(server)
                groups.append(Group(model, "vanilla", f"1x{cores}", cores, [server.port], tokenizer, max_length))
        for server in started:
            stack.callback(server.stop)
        for server in started:
            server.wait_ready(300)
        yield groups


def table(cells: list[Cell], model: str) -> str:
    columns = sorted({(c.seq, c.concurrency) for c in cells if c.kind == "seq"})
    bulk = any(c.kind == "bulk" for c in cells)
    head = [f"s{seq} c{conc}" for seq, conc in columns] + (["bulk tokens/s"] if bulk else [])
    lines = [f"| {model}: cores, server, engines x threads | " + " | ".join(head) + " |",
             "|---" * (len(head) + 1) + "|"]
    rows: dict[tuple[int, str, str], dict[tuple[int, int] | str, Cell]] = {}
    for cell in cells:
        if cell.model == model:
            key: tuple[int, int] | str = "bulk" if cell.kind == "bulk" else (cell.seq, cell.concurrency)
            rows.setdefault((cell.cores, cell.server, cell.layout), {})[key] = cell
    for (cores, server, layout), row in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1] != "ours", kv[0])):
        values = [f"{row[c].req_s:.1f}" if c in row else "-" for c in columns]
        if bulk:
            values.append(f"{row['bulk'].tokens_s:.0f}" if "bulk" in row else "-")
        lines.append(f"| {cores}, {server}, {layout} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifacts", nargs="+", metavar="NAME=ARTIFACT",
                        help="with --servers vanilla alone, a sentence-transformers directory will do")
    parser.add_argument("--vanilla", action="append", default=[], metavar="NAME=MODEL_DIR",
                        help="the sentence-transformers model an artifact was built from, served by the vanilla server")
    parser.add_argument("--servers", nargs="+", choices=["ours", "vanilla"], default=["ours", "vanilla"],
                        help="which to measure (the artifact still gives the vanilla server's tokenizer)")
    parser.add_argument("--cores", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--layouts", type=Layout.parse, nargs="+", default=None, metavar="ExT",
                        help="engines x threads, e.g. 1x8 2x4 8x1 (default: 1xN, Nx1, and 2x(N/2) from 8 cores)")
    parser.add_argument("--seq", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--corpus", type=Path, default=None, help="bulk cell's texts (python -m bench corpus)")
    parser.add_argument("--bulk-batch", type=int, default=32)
    parser.add_argument("--bulk-clients", type=int, default=2)
    parser.add_argument("--bulk-seconds", type=float, default=3.0)
    parser.add_argument("--client-cpus", default=None, help="CPUs for the load generator (default: other cores')")
    parser.add_argument("--serve-args", default="", help="more `infinity serve` flags, one string")
    parser.add_argument("--vanilla-device", default="cpu")
    parser.add_argument("--vanilla-dtype", default="float32")
    parser.add_argument("--json", type=Path, default=None, help="write every cell here")
    args = parser.parse_args()
    artifacts = dict(item.split("=", 1) for item in args.artifacts)
    vanilla = dict(item.split("=", 1) for item in args.vanilla)
    server_cpus, client_cpus = placement(max(args.cores), args.client_cpus)
    corpus = load_corpus(args.corpus) if args.corpus else []
    from infinity.engine.hostinfo import cpu_name

    print(f"# {cpu_name()}; servers on CPUs {server_cpus}, load generator on {client_cpus}", flush=True)
    cells: list[Cell] = []
    for model, artifact in artifacts.items():
        with serving(model, Path(artifact), Path(vanilla[model]) if model in vanilla else None, args,
                     server_cpus) as groups:
            for group in groups:
                start = time.monotonic()
                for cell in measure(group, args, corpus, client_cpus):
                    cells.append(cell)
                    rate = f"{cell.tokens_s:.0f} tokens/s" if cell.kind == "bulk" else f"{cell.req_s:.1f} req/s"
                    print(f"{model} {group.server} {group.layout} {cell.kind} s{cell.seq} c{cell.concurrency}: "
                          f"{rate}, p50 {cell.p50_ms:.1f} ms, p99 {cell.p99_ms:.1f} ms, {cell.requests} requests"
                          + (f", errors {cell.errors}" if cell.errors else ""), flush=True)
                print(f"  ({time.monotonic() - start:.0f} s)", flush=True)
                if args.json:  # after every group: a run cut short keeps what it measured
                    args.json.write_bytes(orjson.dumps([asdict(c) for c in cells], option=orjson.OPT_INDENT_2))
        print("\n" + table(cells, model) + "\n", flush=True)
