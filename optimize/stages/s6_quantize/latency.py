"""A quick latency reading, so the cost of nodes kept in float is recorded next to the gain in accuracy."""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from infinity.settings import SPIN_WAIT_US


def cpu_session(model: Path | bytes, threads: int = 0, spin_wait: bool = True,
                spin_wait_us: int = SPIN_WAIT_US) -> Any:
    """A graph (a file, or serialized) loaded as the server loads it; `spin_wait_us`: how long idle workers
    busy-wait, as the server's --spin-wait-us."""
    import onnxruntime as ort

    from infinity.engine.session import DISABLED_OPTIMIZERS, session_options

    return ort.InferenceSession(model if isinstance(model, bytes) else str(model),
                                session_options(threads, spin_wait, spin_wait_us),
                                providers=["CPUExecutionProvider"], disabled_optimizers=DISABLED_OPTIMIZERS)


def median_ms(session: Any, sequence: int = 128, batch: int = 1, runs: int = 15) -> float:
    """Median wall time of one run on a batch of `sequence` tokens, after a warm-up."""
    ids = np.full((batch, sequence), 5, dtype=np.int64)  # any id inside the smallest vocabulary
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
    for _ in range(3):
        session.run(None, feeds)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        samples.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(samples), 3)


def median_latency_ms(model_path: Path, sequence: int = 128, threads: int = 0) -> float:
    return median_ms(cpu_session(model_path, threads), sequence)


SHAPES = {"b1_seq8": (1, 8), "b1_seq64": (1, 64), "b1_seq256": (1, 256), "b8_seq64": (8, 64)}


def latency_table(model_paths: dict[str, Path], threads: int = 0, rounds: int = 3,
                  max_length: int | None = None) -> dict[str, dict[str, float]]:
    """Median ms per shape (those within the model's `max_length`) for each model, the models taking turns so
    drift lands on all of them; idle workers spin as long as the server's do by default."""
    shapes = {name: shape for name, shape in SHAPES.items() if max_length is None or shape[1] <= max_length}
    sessions = {name: cpu_session(path, threads) for name, path in model_paths.items()}
    samples: dict[str, dict[str, list[float]]] = {name: {shape: [] for shape in shapes} for name in sessions}
    for _ in range(rounds):
        for name, session in sessions.items():
            for shape, (batch, sequence) in shapes.items():
                samples[name][shape].append(median_ms(session, sequence, batch, runs=5 if batch * sequence > 64 else 9))
    return {name: {shape: round(statistics.median(v), 2) for shape, v in shapes.items()}
            for name, shapes in samples.items()}
