"""`infinity embed ARTIFACT --input FILE --output FILE`: a corpus's vectors, in-process (infinity.Model).

The input streams in blocks of rows; each block's vectors are written as one part file beside the output
(OUTPUT.partial/), renamed into place once whole, and the parts become the output at the end. A run that was
stopped (killed, interrupted, the machine gone) resumes after its last whole part: no row is embedded twice or
written twice. A malformed row stops the run with its line number (or is skipped with --skip-bad and reported at
the end). Exit codes, for a batch scheduler: 0 done, 1 failed otherwise, 2 bad arguments, 65 a malformed row,
66 the input cannot be read, 73 the output cannot be written, 78 the artifact is refused, 130 interrupted."""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import orjson

from infinity.engine.hostinfo import physical_cores
from infinity.schema import blank
from infinity.tasks.feature_extraction import PRECISIONS

DONE, FAILED, MALFORMED, NO_INPUT, CANNOT_WRITE, REFUSED, INTERRUPTED = 0, 1, 65, 66, 73, 78, 130
FORMATS = ("jsonl", "csv", "parquet", "text")
OUTPUTS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet",
            ".txt": "text"}
PARQUET_NEEDS = "Parquet needs pyarrow: pip install 'infinity-multiverse[corpus]'"


class Malformed(Exception):
    """A row that has no text to embed: its line (or row) and why."""


class Stop(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Row:
    id: Any
    text: str


@dataclass
class Job:
    """What makes a run's parts this run's: a resumed run must agree on every field."""
    artifact: str  # the graph's checksum
    input: str
    input_bytes: int
    input_mtime_ns: int
    input_format: str
    text_field: str
    id_field: str | None
    params: dict[str, Any]
    block: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", help="artifact directory (or bundle) of an embedding model")
    parser.add_argument("--input", required=True, type=Path, help="JSONL, CSV, Parquet or plain text (a text a line)")
    parser.add_argument("--output", required=True, type=Path, help="where the vectors go: .parquet or .jsonl, each "
                                                                    "row its id and its embedding")
    parser.add_argument("--input-format", choices=FORMATS, help="default: from the input's suffix")
    parser.add_argument("--text-field", default="text", help="the field (JSONL) or column (CSV, Parquet) holding "
                                                             "each text (default: text)")
    parser.add_argument("--id-field", help="the field or column holding each row's id (default: the row's number, "
                                           "from 0)")
    parser.add_argument("--precision", choices=PRECISIONS, help="float (default), int8, uint8, binary or ubinary")
    parser.add_argument("--dimensions", type=int, help="keep the first N dimensions (Matryoshka)")
    parser.add_argument("--prompt-name", help="the model's prompt put before each text (default: its own)")
    parser.add_argument("--no-normalize", dest="normalize", action="store_false", default=None,
                        help="vectors as pooled, not scaled to unit length")
    parser.add_argument("--block", type=int, default=4096, help="rows per part file, the unit a run resumes by "
                                                               "(default: 4096)")
    parser.add_argument("--threads", type=int, help="ONNX Runtime threads (default: the physical cores)")
    parser.add_argument("--engines", type=int, help="batches run at once, each on threads / engines of the threads "
                                                   "(default: one per thread, the most throughput)")
    parser.add_argument("--skip-bad", action="store_true", help="skip a malformed row (reported at the end) instead "
                                                                "of stopping at it")
    parser.add_argument("--restart", action="store_true", help="drop what an earlier run of this output left and "
                                                               "start again")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress line on stderr")


def run(args: argparse.Namespace) -> int:
    try:
        return embed_corpus(args)
    except Stop as exc:
        print(f"infinity embed: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("\ninfinity embed: interrupted; run the same command again to resume", file=sys.stderr)
        return INTERRUPTED


def embed_corpus(args: argparse.Namespace) -> int:
    from infinity.library import Model

    if args.block < 1:
        raise Stop(2, "--block must be at least 1")
    if args.threads is not None and args.threads < 1 or args.engines is not None and not (
            1 <= args.engines <= (args.threads or physical_cores())):
        raise Stop(2, "--threads must be at least 1, and --engines between 1 and the threads")
    source = Path(args.input)
    if not source.is_file():
        raise Stop(NO_INPUT, f"{source}: no such file")
    kind = args.input_format or SUFFIXES.get(source.suffix.lower())
    if kind is None:
        raise Stop(2, f"{source}: cannot tell the format from its suffix; pass --input-format "
                      f"({', '.join(FORMATS)})")
    out = Path(args.output)
    written = OUTPUTS.get(out.suffix.lower())
    if written is None:
        raise Stop(2, f"{out}: the output is .parquet or .jsonl")
    if "parquet" in (kind, written):
        _require_pyarrow()
    params = {name: value for name, value in (("precision", args.precision), ("dimensions", args.dimensions),
                                              ("prompt_name", args.prompt_name), ("normalize", args.normalize))
              if value is not None}
    try:
        threads = args.threads or physical_cores()
        model = Model(args.artifact, threads=threads, engines=args.engines or threads)
    except ValueError as exc:
        raise Stop(REFUSED, str(exc)) from None
    with model:
        if model.task.value not in ("feature-extraction", "hybrid-embedding"):
            raise Stop(REFUSED, f"infinity embed writes dense vectors; {args.artifact} serves {model.task.value}")
        stat = source.stat()
        job = Job(model.manifest.model.sha256, str(source.resolve()), stat.st_size, stat.st_mtime_ns, kind,
                  args.text_field, args.id_field, params, args.block)
        parts = Parts(out, written, job, args.restart)
        total = count_rows(source, kind)
        progress = Progress(total, parts.done, enabled=args.progress)
        rows = read_rows(source, kind, args.text_field, args.id_field)
        blocks = _blocks(itertools.islice(rows, parts.done, None), args.block, parts.done)
        # a block is embedded while the one before it is written and the one after it read
        with ThreadPoolExecutor(1, thread_name_prefix="infinity-embed") as pool:
            pending = None
            try:
                for start, block in _checked(blocks, args.skip_bad):
                    texts = [row.text for row in block.kept]
                    future = pool.submit(model.embed, texts, **params) if texts else None
                    if pending is not None:
                        parts.write(*pending)
                        pending = None
                    tokens = model.usage.tokens
                    pending = (start, block, future.result() if future is not None else None)
                    progress.advance(len(block.rows), model.usage.tokens - tokens)
            finally:
                if pending is not None:
                    parts.write(*pending)
        parts.finish()
        progress.end()
    if parts.skipped:
        skipped = parts.skipped
        print(f"infinity embed: skipped {len(skipped)} malformed row(s): {'; '.join(skipped[:10])}"
              + (" ..." if len(skipped) > 10 else ""), file=sys.stderr)
    print(f"infinity embed: {progress.done - len(parts.skipped)} vectors in {out}", file=sys.stderr)
    return DONE


def _require_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise Stop(FAILED, PARQUET_NEEDS) from None


# --- reading ---------------------------------------------------------------------------------------------------------

def count_rows(path: Path, kind: str) -> int:
    """The input's rows, for the progress line's total and ETA."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    if kind == "csv":
        with path.open(newline="", encoding="utf-8") as handle:
            return max(0, sum(1 for _ in csv.reader(handle)) - 1)
    with path.open("rb") as handle:
        count, last = 0, b"\n"
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            count, last = count + chunk.count(b"\n"), chunk[-1:]
        return count + (last != b"\n")


def read_rows(path: Path, kind: str, text_field: str, id_field: str | None) -> Iterator[Row | Malformed]:
    """Each row of the input, in order: a Row, or a Malformed saying where and why."""
    if kind == "parquet":
        yield from _parquet_rows(path, text_field, id_field)
        return
    with path.open(newline="" if kind == "csv" else None, encoding="utf-8", errors="strict") as handle:
        if kind == "csv":
            yield from _csv_rows(handle, text_field, id_field)
        elif kind == "jsonl":
            for number, line in enumerate(handle, 1):
                yield _json_row(line, number - 1, f"line {number}", text_field, id_field)
        else:
            for number, line in enumerate(handle, 1):
                text = line.rstrip("\r\n")
                yield Row(number - 1, text) if not blank(text) else \
                    Malformed(f"line {number}: the line is empty")


def _json_row(line: str, index: int, where: str, text_field: str, id_field: str | None) -> Row | Malformed:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return Malformed(f"{where}: not JSON ({exc})")
    if not isinstance(value, dict):
        return Malformed(f"{where}: not a JSON object")
    return _row(value, index, where, text_field, id_field)


def _row(value: dict[str, Any], index: int, where: str, text_field: str, id_field: str | None) -> Row | Malformed:
    text = value.get(text_field)
    if not isinstance(text, str):
        return Malformed(f"{where}: no {text_field!r} field holding a string")
    if blank(text):
        return Malformed(f"{where}: {text_field!r} is empty")
    if id_field is None:
        return Row(index, text)
    if value.get(id_field) is None:
        return Malformed(f"{where}: no {id_field!r} field")
    return Row(value[id_field], text)


def _csv_rows(handle: TextIO, text_field: str, id_field: str | None) -> Iterator[Row | Malformed]:
    reader = csv.DictReader(handle)
    missing = [name for name in (text_field, id_field) if name and name not in (reader.fieldnames or ())]
    if missing:
        raise Stop(MALFORMED, f"line 1: the CSV header has no {', '.join(map(repr, missing))} column "
                              f"(it has {', '.join(reader.fieldnames or ()) or 'none'})")
    for index, record in enumerate(reader):
        yield _row(record, index, f"row {index + 1}, line {reader.line_num}", text_field, id_field)


def _parquet_rows(path: Path, text_field: str, id_field: str | None) -> Iterator[Row | Malformed]:
    import pyarrow.parquet as pq

    columns = [name for name in (text_field, id_field) if name]
    handle = pq.ParquetFile(path)
    missing = [name for name in columns if name not in handle.schema_arrow.names]
    if missing:
        raise Stop(MALFORMED, f"{path}: no column {', '.join(map(repr, missing))} (it has "
                              f"{', '.join(handle.schema_arrow.names)})")
    index = 0
    for batch in handle.iter_batches(columns=columns, batch_size=8192):
        for record in batch.to_pylist():
            yield _row(record, index, f"row {index + 1}", text_field, id_field)
            index += 1


@dataclass
class Block:
    rows: list[Row | Malformed]

    @property
    def kept(self) -> list[Row]:
        return [row for row in self.rows if isinstance(row, Row)]


def _blocks(rows: Iterator[Row | Malformed], size: int, start: int) -> Iterator[tuple[int, Block]]:
    while True:
        block = list(itertools.islice(rows, size))
        if not block:
            return
        yield start, Block(block)
        start += len(block)


def _checked(blocks: Iterator[tuple[int, Block]], skip: bool) -> Iterator[tuple[int, Block]]:
    for start, block in blocks:
        bad = [str(row) for row in block.rows if isinstance(row, Malformed)]
        if bad and not skip:
            raise Stop(MALFORMED, f"{bad[0]}; fix the row, or pass --skip-bad (the blocks before its own are written: "
                                  "the same command resumes after them)")
        yield start, block


# --- writing ---------------------------------------------------------------------------------------------------------

class Parts:
    """The run's part files in OUTPUT.partial/, one per block, named by the rows they hold; the job they belong to
    in job.json."""

    def __init__(self, out: Path, kind: str, job: Job, restart: bool) -> None:
        self.out, self.kind, self.job = out, kind, job
        self.folder = out.with_name(out.name + ".partial")
        self.skipped: list[str] = []
        if restart:
            shutil.rmtree(self.folder, ignore_errors=True)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Stop(CANNOT_WRITE, f"{self.folder}: {exc.strerror}") from None
        recorded = self.folder / "job.json"
        if recorded.is_file():
            before = json.loads(recorded.read_text())
            skipped = before.pop("skipped", [])
            now = asdict(job)
            if before != now:
                changed = ", ".join(k for k in now if before.get(k) != now[k])
                raise Stop(2, f"{self.folder} holds the parts of another run ({changed} differ); pass --restart to "
                              "drop them, or another --output")
            self.skipped = skipped
        self._record()
        self.done = max((int(path.name.split("-")[2].split(".")[0]) for path in self._parts()), default=0)

    def _parts(self) -> list[Path]:
        return sorted(self.folder.glob(f"part-*.{self.kind}"))

    def _record(self) -> None:
        temporary = self.folder / "job.json.tmp"
        temporary.write_text(json.dumps({**asdict(self.job), "skipped": self.skipped}))
        os.replace(temporary, self.folder / "job.json")

    def write(self, start: int, block: Block, vectors: np.ndarray | None) -> None:
        """One block's part, whole or not at all; its skipped rows recorded first."""
        bad = [str(row) for row in block.rows if isinstance(row, Malformed) and str(row) not in self.skipped]
        if bad:
            self.skipped += bad
            self._record()
        ids = [row.id for row in block.kept]
        name = f"part-{start:012d}-{start + len(block.rows):012d}.{self.kind}"
        temporary = self.folder / f".{name}.tmp"
        if self.kind == "parquet":
            _write_parquet(temporary, ids, vectors, self.job.id_field is not None)
        else:
            with temporary.open("wb") as handle:
                for row_id, vector in zip(ids, vectors if vectors is not None else []):
                    handle.write(orjson.dumps({"id": row_id, "embedding": vector},
                                              option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        with temporary.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, self.folder / name)

    def finish(self) -> None:
        """The parts, in order, as the output (written beside it, then renamed), and the parts gone."""
        temporary = self.out.with_name(f".{self.out.name}.tmp")
        parts = self._parts()
        if self.kind == "parquet":
            import pyarrow.parquet as pq

            tables = [pq.read_table(path) for path in parts]
            tables = [table for table in tables if table.num_rows]
            if tables:
                with pq.ParquetWriter(temporary, tables[0].schema) as writer:
                    for table in tables:
                        writer.write_table(table)
            else:
                _write_parquet(temporary, [], None, self.job.id_field is not None)
        else:
            with temporary.open("wb") as handle:
                for path in parts:
                    with path.open("rb") as part:
                        shutil.copyfileobj(part, handle)
        os.replace(temporary, self.out)
        shutil.rmtree(self.folder, ignore_errors=True)


def _write_parquet(path: Path, ids: list[Any], vectors: np.ndarray | None, named: bool) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    id_column = pa.array([str(i) for i in ids], pa.string()) if named else pa.array(ids, pa.int64())
    if vectors is None or not len(vectors):
        embedding = pa.array([], pa.list_(pa.float32()))
    else:
        flat = pa.array(np.ascontiguousarray(vectors).reshape(-1))
        embedding = pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])
    pq.write_table(pa.table({"id": id_column, "embedding": embedding}), path)


# --- progress --------------------------------------------------------------------------------------------------------

class Progress:
    """One line on stderr: rows done of the total, texts and tokens per second, and the time left. Redrawn in
    place on a terminal, else printed every EVERY seconds (a batch job's log)."""
    EVERY = 10.0

    def __init__(self, total: int, done: int, enabled: bool) -> None:
        self.total, self.done, self.resumed = total, done, done
        self.enabled = enabled
        self.terminal = sys.stderr.isatty()
        self.started = self.shown = time.perf_counter()
        self.tokens = 0
        self.shown_at = -1  # the rows done when the last line was printed
        if enabled and done:
            print(f"infinity embed: resuming after row {done} of {total}", file=sys.stderr)

    def advance(self, rows: int, tokens: int) -> None:
        self.done += rows
        self.tokens += tokens
        now = time.perf_counter()
        if self.enabled and (self.terminal or now - self.shown >= self.EVERY):
            self.shown = now
            self._show(now)

    def _show(self, now: float) -> None:
        self.shown_at = self.done
        seconds = max(now - self.started, 1e-9)
        rate = (self.done - self.resumed) / seconds
        left = (self.total - self.done) / rate if rate else 0.0
        width = len(f"{self.total:,}")
        line = (f"{self.done:>{width},}/{self.total:,} texts  {rate:,.0f} texts/s  {self.tokens / seconds:,.0f} "
                f"tokens/s  ETA {int(left) // 60}:{int(left) % 60:02d}")
        print(f"\r{line}" if self.terminal else line, end="" if self.terminal else "\n", file=sys.stderr, flush=True)

    def end(self) -> None:
        if not self.enabled:
            return
        if self.shown_at != self.done:
            self._show(time.perf_counter())
        if self.terminal:
            print(file=sys.stderr)

