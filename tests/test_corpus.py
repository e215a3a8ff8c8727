"""`infinity embed`: a corpus's vectors written with their ids, equal to infinity.Model's (and so to /predict's);
killed half-way, the same command resumes with every id exactly once; a malformed row stops the run at its line,
or is skipped and reported; the exit codes say what went wrong."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infinity import Model

ROOT = Path(__file__).resolve().parent.parent
WORDS = (ROOT / "README.md").read_text(encoding="utf-8").split()


def texts(count: int) -> list[str]:
    return [" ".join(WORDS[(i * 13) % 4000:(i * 13) % 4000 + 3 + i % 17]) + f" #{i}" for i in range(count)]


def jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def embed(*args: object, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infinity", "embed", *map(str, args), "--threads", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def vectors_of(path: Path) -> tuple[list[object], np.ndarray]:
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        return table["id"].to_pylist(), np.asarray(table["embedding"].to_pylist(), dtype=np.float32)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row["id"] for row in rows], np.asarray([row["embedding"] for row in rows])


def test_a_killed_run_resumes_with_every_id_once(minilm_int8_artifact: Path, tmp_path: Path) -> None:
    corpus = texts(10_000)
    source = jsonl(tmp_path / "corpus.jsonl", [{"id": f"doc-{i}", "text": t} for i, t in enumerate(corpus)])
    out = tmp_path / "vectors.parquet"
    command = [sys.executable, "-m", "infinity", "embed", str(minilm_int8_artifact), "--input", str(source),
               "--output", str(out), "--id-field", "id", "--block", "500", "--threads", "1"]
    run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    partial = tmp_path / "vectors.parquet.partial"
    deadline = time.monotonic() + 300
    while len(list(partial.glob("part-*.parquet"))) < 3 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.poll() is None, "the run ended before it could be killed"
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    written = sorted(partial.glob("part-*.parquet"))
    assert not out.exists() and 3 <= len(written) < 20
    resumed = embed(minilm_int8_artifact, "--input", source, "--output", out, "--id-field", "id", "--block", 500)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming after row" in resumed.stderr and not partial.exists()
    ids, vectors = vectors_of(out)
    assert ids == [f"doc-{i}" for i in range(10_000)]  # each once, in the input's order
    with Model(minilm_int8_artifact, threads=1) as model:
        sample = [0, 499, 500, 4321, 9999]
        assert np.array_equal(vectors[sample], model.embed([corpus[i] for i in sample]))


@pytest.mark.parametrize("kind", ["csv", "text", "parquet"])
def test_each_input_format_gives_the_models_vectors(kind: str, minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    corpus = texts(300)
    source = tmp_path / f"corpus.{'txt' if kind == 'text' else kind}"
    if kind == "csv":
        with source.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["key", "body"])
            writer.writerows([(f"k{i}", f'{t}, "quoted"\nand a second line') for i, t in enumerate(corpus)])
        corpus = [f'{t}, "quoted"\nand a second line' for t in corpus]
        fields = ["--text-field", "body", "--id-field", "key"]
    elif kind == "parquet":
        pq.write_table(pa.table({"text": corpus, "n": list(range(300))}), source)
        fields = ["--id-field", "n"]
    else:
        source.write_text("\n".join(corpus) + "\n", encoding="utf-8")
        fields = []
    out = tmp_path / "vectors.jsonl"
    done = embed(minilm_fp32_artifact, "--input", source, "--output", out, "--block", 128, "--precision", "int8",
                 "--dimensions", 64, *fields)
    assert done.returncode == 0, done.stderr
    ids, vectors = vectors_of(out)
    assert ids == ([f"k{i}" for i in range(300)] if kind == "csv" else list(range(300)))
    with Model(minilm_fp32_artifact, threads=1) as model:
        assert np.array_equal(vectors, model.embed(corpus, precision="int8", dimensions=64))


def test_a_malformed_row_stops_the_run_at_its_line_unless_skipped(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    lines = [json.dumps({"text": t}) for t in texts(40)]
    lines[6], lines[20] = "{not json", json.dumps({"text": "  "})
    source = tmp_path / "corpus.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "vectors.parquet"
    stopped = embed(minilm_fp32_artifact, "--input", source, "--output", out, "--block", 10)
    assert stopped.returncode == 65 and "line 7: not JSON" in stopped.stderr and not out.exists()
    skipped = embed(minilm_fp32_artifact, "--input", source, "--output", out, "--block", 10, "--skip-bad")
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped 2 malformed row(s): line 7: not JSON" in skipped.stderr and "line 21: 'text' is empty" in \
        skipped.stderr
    ids, _ = vectors_of(out)
    assert ids == [i for i in range(40) if i not in (6, 20)]


def test_what_cannot_run_says_so_with_its_exit_code(minilm_fp32_artifact: Path, artifact_for: object,
                                                    tmp_path: Path) -> None:
    source = jsonl(tmp_path / "corpus.jsonl", [{"text": t} for t in texts(20)])
    out = tmp_path / "vectors.parquet"
    missing = embed(minilm_fp32_artifact, "--input", tmp_path / "nope.jsonl", "--output", out)
    assert missing.returncode == 66 and "no such file" in missing.stderr
    wrong = embed(minilm_fp32_artifact, "--input", source, "--output", tmp_path / "vectors.csv")
    assert wrong.returncode == 2 and ".parquet or .jsonl" in wrong.stderr
    engines = embed(minilm_fp32_artifact, "--input", source, "--output", out, "--threads", 1, "--engines", 2)
    assert engines.returncode == 2 and "--engines between 1 and the threads" in engines.stderr
    refused = embed(tmp_path, "--input", source, "--output", out)
    assert refused.returncode == 78, refused.stderr
    # an earlier run's parts of another input are not taken for this one's
    partial = tmp_path / "vectors.parquet.partial"
    partial.mkdir()
    (partial / "job.json").write_text(json.dumps({"input": "elsewhere"}))
    other = embed(minilm_fp32_artifact, "--input", source, "--output", out)
    assert other.returncode == 2 and "holds the parts of another run" in other.stderr
    again = embed(minilm_fp32_artifact, "--input", source, "--output", out, "--restart")
    assert again.returncode == 0, again.stderr
    assert vectors_of(out)[0] == list(range(20))
