"""A quick latency reading, so the cost of nodes kept in float is recorded next to the gain in accuracy."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np


def median_latency_ms(model_path: Path, sequence: int = 128, batch: int = 1, runs: int = 15, threads: int = 0) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    ids = np.full((batch, sequence), 1000, dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
    session.run(None, feeds)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        samples.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(samples), 3)
