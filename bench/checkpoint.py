"""A trained checkpoint's INT8 graphs side by side: in-process speed in one run, and parity as served.

    python -m bench checkpoint --model DIR --served FP32_ARTIFACT NAME=MODEL.ONNX [NAME=MODEL.ONNX ...]

FP32_ARTIFACT is the model's fp32 artifact (`multiverse optimize DIR --precision fp32`): its tokenizer and task facts
serve every graph. Each graph is timed in this one process, the graphs taking turns call by call (2 threads,
workers spinning as the server's), at b1 s8, b1 s128, b8 s128 and b32 s128, each cell about 60,000 tokens a graph
(500 calls at most: the cheap cells, the noisiest, get the most); the table shows the median ms (min in brackets)
and the ratio to the first graph. Parity: each held-out input alone and inside mixed-length batches
against the model in PyTorch FP32 (sentence-transformers), cosine_min of each way and how far answers move with
their batch.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.recipes import ort_runner, speed_cells, timed_cells
from bench.run import publish
from infinity.engine.hostinfo import cpu_name
from infinity.manifest import Manifest

TASK = "feature-extraction"
SHAPES = ((1, 8), (1, 128), (8, 128), (32, 128))


def parity(model: str, served: Path, graphs: dict[str, Path]) -> dict[str, dict[str, float]]:
    from optimize.stages.s1_load import load_source
    from optimize.stages.s4_reference import torch_reference
    from optimize.stages.s5_draft.served import load_candidate, served_parity
    from optimize.tasks import task_for

    manifest = Manifest.load(served)
    inputs = task_for(TASK).heldout()
    reference = torch_reference(load_source(model, TASK), inputs)
    rows = {}
    for name, path in graphs.items():
        candidate = load_candidate(served, manifest, path, threads=2)
        checked = served_parity(task_for(TASK), candidate, inputs, reference, task_for(TASK).thresholds)
        rows[name] = {"alone": checked.modes["alone"]["cosine_min"], "batched": checked.modes["batched"]["cosine_min"],
                      "moves": checked.batch_invariance["max_abs_diff"]}
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the source model directory (the parity reference)")
    parser.add_argument("--served", type=Path, required=True, help="the model's fp32 artifact")
    parser.add_argument("--calls", type=float, default=1.0, help="scale the number of calls per cell")
    parser.add_argument("--no-parity", action="store_true")
    parser.add_argument("--out", default="checkpoint.md", help="file name under docs/results")
    parser.add_argument("graphs", nargs="+", metavar="NAME=MODEL.ONNX")
    args = parser.parse_args(argv)
    graphs = {name: Path(path) for name, path in (item.split("=", 1) for item in args.graphs)}
    speed = timed_cells({name: ort_runner(path) for name, path in graphs.items()},
                        lambda batch, sequence: max(3, int(args.calls * min(500, 60_000 // (batch * sequence) + 3))),
                        SHAPES)
    checked = {} if args.no_parity else parity(args.model, args.served, graphs)
    first = speed[next(iter(graphs))]
    lines = [f"# {Path(args.model).name}: INT8 graphs in one run ({cpu_name()})", "",
             "In-process ms, 2 threads, median of calls taken in turns (min in brackets), x = this / the first row"
             + ("; held-out cosine_min alone / batched against PyTorch FP32, and the largest |alone - batched|."
                if checked else "."), "",
             "| graph | " + " | ".join(f"b{b} s{s}" for b, s in SHAPES) + (" | cosine_min alone / batched | moves |"
                                                                         if checked else " |"),
             "|---|" + "---|" * len(SHAPES) + ("---|---|" if checked else "")]
    for name in graphs:
        row = f"| {name} | {speed_cells(speed[name], first, SHAPES)} |"
        if checked:
            p = checked[name]
            row += f" {p['alone']:.4f} / {p['batched']:.4f} | {p['moves']:.3g} |"
        lines.append(row)
    publish(args.out, lines)
