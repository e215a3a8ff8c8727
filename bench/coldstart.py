"""Cold starts: from exec of `infinity serve` to its first `/predict` answer, the median of several starts, with the
server's own account of where the time went (its `ready in` log line) and its peak memory.

    python -m bench coldstart minilm=<artifact> mpnet=<artifact> [--runs 5] [--cache warm|artifact|all]
                              [--source before=<checkout> --source after=.]

--cache says what is in the page cache at each exec: `warm` everything (a restart on the same machine), `artifact`
the artifact's files evicted (posix_fadvise; a model volume read for the first time), `all` the whole page cache
dropped (root; Python and its libraries read from disk too, as in a container's first start). --source runs the
`infinity` package of another checkout (PYTHONPATH) with this interpreter, so two versions are compared in one run,
taking turns in a shuffled order. Each checkout's `infinity` package is compiled to bytecode first, as `pip install`
does in the image."""
from __future__ import annotations

import argparse
import compileall
import http.client
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.process import Server
from infinity.engine.hostinfo import cpu_name

READY_LINE = re.compile(r"ready in (?P<total>[\d.]+) s[^:]*: (?P<phases>.*)")
PHASE = re.compile(r"(?P<name>[a-z][a-z -]*?) (?P<seconds>[\d.]+)")
BODY = json.dumps({"inputs": "The first request after a cold start."}).encode()
POLL_S = 0.005


@dataclass
class Start:
    first_answer_s: float
    peak_rss_mib: int
    phases: dict[str, float] = field(default_factory=dict)


def evict(artifact: Path, cache: str) -> None:
    if cache == "all":
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    elif cache == "artifact":
        for path in artifact.iterdir():
            with path.open("rb") as handle:
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def answered(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/predict", BODY, {"content-type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False
    finally:
        connection.close()


def phases(log: str) -> dict[str, float]:
    """The server's `ready in` line, where its version writes one: total and each phase, in seconds."""
    found = READY_LINE.search(log)
    if not found:
        return {}
    parts = {m["name"].strip(): float(m["seconds"]) for m in PHASE.finditer(found["phases"])}
    return {"ready (server's count)": float(found["total"]), **parts}


def start_once(artifact: Path, source: Path, cache: str, timeout: float = 300) -> Start:
    evict(artifact, cache)
    env = {**os.environ, "PYTHONPATH": str(source.resolve())}
    log = Path(tempfile.mkdtemp(prefix="bench-coldstart-")) / "server.log"
    began = time.perf_counter()
    server = Server.infinity(artifact, "--host", "127.0.0.1", log=log, cwd=source, env=env)
    try:
        while not answered(server.port):
            if server.process.poll() is not None or time.perf_counter() - began > timeout:
                raise RuntimeError(f"the server of {artifact} exited or never answered: {server.logged()[-2000:]}")
            time.sleep(POLL_S)
        first = time.perf_counter() - began
        peak = int(server.memory()["VmHWM"])
    finally:
        server.stop(60)
    text = server.logged()
    shutil.rmtree(log.parent, ignore_errors=True)
    return Start(first, peak, phases(text))


def report(results: dict[tuple[str, str], list[Start]], cache: str, runs: int) -> str:
    lines = [f"cold starts on {cpu_name()} ({os.cpu_count()} CPUs), page cache: {cache}, median of {runs}", "",
             "| source | artifact | exec to first answer, s (median, min-max) | peak RSS, MiB | server's phases, s |",
             "|---|---|---|---|---|"]
    for (source, artifact), starts in results.items():
        firsts = [s.first_answer_s for s in starts]
        names = [name for name in starts[0].phases]
        split = ", ".join(f"{name} {statistics.median(s.phases.get(name, 0.0) for s in starts):.3f}"
                          for name in names) or "-"
        lines.append(f"| {source} | {artifact} | {statistics.median(firsts):.3f} ({min(firsts):.3f}-"
                     f"{max(firsts):.3f}) | {statistics.median(s.peak_rss_mib for s in starts):.0f} | {split} |")
    return "\n".join(lines)


def named(text: str) -> tuple[str, Path]:
    name, _, path = text.rpartition("=")
    return name or Path(path).name, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench coldstart", description=__doc__.split("\n\n")[0])
    parser.add_argument("artifacts", nargs="+", type=named, metavar="NAME=ARTIFACT")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cache", choices=["warm", "artifact", "all"], default="warm")
    parser.add_argument("--source", action="append", type=named, metavar="NAME=CHECKOUT",
                        help="a checkout whose infinity package runs (repeat to compare); default this one")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sources = args.source or [("this checkout", Path(__file__).resolve().parents[1])]
    for _, source in sources:
        compileall.compile_dir(source / "infinity", quiet=1)
    cells = [(source, artifact) for source in sources for artifact in args.artifacts]
    results: dict[tuple[str, str], list[Start]] = {(s[0], a[0]): [] for s, a in cells}
    shuffle = random.Random(args.seed)
    for run in range(args.runs):
        for (source_name, source), (artifact_name, artifact) in shuffle.sample(cells, len(cells)):
            start = start_once(artifact, source, args.cache)
            results[(source_name, artifact_name)].append(start)
            print(f"run {run + 1}: {source_name} {artifact_name} {start.first_answer_s:.3f} s", file=sys.stderr)
    print(report(results, args.cache, args.runs))
    return 0
