"""Where a graph's time goes: onnxruntime's profiler, kernel time per operator type, per cell.

    python -m bench profile artifact=artifacts/minilm/model.onnx before=old/model.onnx [--cells 1x8 1x256]

Each node's median over the runs, summed by operator type (robust to other processes' spikes), in ms per run, with
the session loaded as the server loads it (2 threads, no spinning, the same disabled fusions).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

THREADS = 2


def profile(model: Path, batch: int, sequence: int, runs: int) -> tuple[dict[str, float], float]:
    """(ms of kernel time per run by operator type, median ms per run)"""
    import onnxruntime as ort

    from infinity.engine.session import DISABLED_OPTIMIZERS

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="profile-") as scratch:
        options.profile_file_prefix = str(Path(scratch) / "profile")
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"],
                                       disabled_optimizers=DISABLED_OPTIMIZERS)
        ids = np.full((batch, sequence), 1000, np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
        for _ in range(runs):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    durations: dict[str, list[float]] = defaultdict(list)
    kinds: dict[str, str] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            durations[event["name"]].append(event["dur"])
            kinds[event["name"]] = event["args"]["op_name"]
    by_type: dict[str, float] = defaultdict(float)
    for name, values in durations.items():
        by_type[kinds[name]] += statistics.median(values) / 1000
    totals = [e["dur"] / 1000 for e in events if e.get("name") == "model_run"]
    return dict(by_type), statistics.median(totals[len(totals) // 2:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", metavar="NAME=MODEL.ONNX")
    parser.add_argument("--cells", nargs="+", default=["1x8", "1x256"], metavar="BATCHxSEQUENCE")
    parser.add_argument("--top", type=int, default=9)
    args = parser.parse_args(argv)
    for cell in args.cells:
        batch, sequence = (int(v) for v in cell.split("x"))
        runs = max(5, min(200, 50_000 // (batch * sequence * 10)))
        print(f"\n## b{batch} s{sequence} ({runs} runs): kernel ms per run by operator type")
        for item in args.models:
            name, _, path = item.partition("=")
            by_type, run = profile(Path(path), batch, sequence, runs)
            top = ", ".join(f"{op} {ms:.2f}" for op, ms in sorted(by_type.items(), key=lambda kv: -kv[1])[:args.top])
            print(f"- {name}: run {run:.2f}, kernels {sum(by_type.values()):.2f}: {top}")
