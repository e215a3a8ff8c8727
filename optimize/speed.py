"""A quick latency reading, so the cost of nodes kept in float is recorded next to the gain in accuracy."""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np


def cpu_session(model_path: Path, threads: int = 0, spin_wait: bool = True) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    if not spin_wait:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def median_ms(session: Any, sequence: int = 128, batch: int = 1, runs: int = 15) -> float:
    """Median wall time of one run on a batch of `sequence` tokens, after a warm-up."""
    ids = np.full((batch, sequence), 1000, dtype=np.int64)
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
