"""How near an INT8 artifact runs to this host's integer GEMM ceiling, by shape, in one run.

    python -m bench efficiency ARTIFACT [--cells 16x64 1x256] [--threads 2] [--seconds 1] [--rounds 5]

ceiling: onnxruntime's own integer GEMM alone, u8 activations x s8 weights as the artifact's GEMMs take them, at the
model's FFN shape (batch x sequence rows, hidden x intermediate weights), in integer operations per second (two per
multiply-add). model: the artifact's session, loaded as the server loads it, on a cell of that many rows of that
many real tokens; its useful integer work per token is every weight GEMM in the graph (2 x K x N) and attention's
two products (2 x 2 x sequence x hidden per layer). efficiency = the model's useful operations per second over the
ceiling's, the two timed in alternating rounds. What is left is the float work around the GEMMs (quantizing
activations, LayerNorm, GELU, softmax, casts) and the GEMMs' own shortfall at the model's smaller shapes. Each figure
is the median of its runs.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from infinity.engine.hostinfo import cpu_name
from infinity.engine.session import Engine
from infinity.manifest import Manifest

INTEGER_GEMMS = ("MatMulInteger", "MatMulIntegerToFloat")
ATTENTIONS = ("Attention", "MultiHeadAttention", "GroupQueryAttention")


@dataclass(frozen=True)
class Work:
    """A graph's integer work per token: its weight GEMMs' multiply-adds, and what attention adds per position."""
    gemm_macs: int  # per token, whatever the sequence length
    hidden: int
    layers: int
    intermediate: int

    def ops_per_token(self, sequence: int) -> float:
        return 2.0 * (self.gemm_macs + self.layers * 2 * sequence * self.hidden)


def work(graph_path: Path) -> Work:
    """Counted from the graph: each integer GEMM's weight (an initializer, K x N), and its attention nodes."""
    graph = onnx.load(str(graph_path), load_external_data=False).graph
    shapes = {tensor.name: list(tensor.dims) for tensor in graph.initializer}
    weights = [shapes[node.input[1]] for node in graph.node
               if node.op_type in INTEGER_GEMMS and node.input[1] in shapes and len(shapes[node.input[1]]) == 2]
    if not weights:
        raise SystemExit(f"{graph_path}: no integer GEMM with a weight initializer; this suite measures INT8 graphs")
    layers = sum(node.op_type in ATTENTIONS for node in graph.node) or sum(node.op_type == "Softmax"
                                                                         for node in graph.node)
    hidden = weights[0][0]
    intermediate = max(n for k, n in weights if k == hidden)
    return Work(sum(k * n for k, n in weights), hidden, layers, intermediate)


def timed(call: Callable[[], object], seconds: float, least: int = 5) -> float:
    """The median seconds of one call, over as many calls as fit in `seconds` (at least `least`)."""
    for _ in range(2):
        call()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < least or time.perf_counter() < deadline:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ceiling_run(rows: int, k: int, n: int, threads: int) -> Callable[[], object]:
    """One call of onnxruntime's MatMulIntegerToFloat, the artifact's own GEMM (u8 activations around 128 x s8
    weights, packed once as a constant), at [rows, k] x [k, n]. Plain MatMulInteger does not pack its weights and
    ran at half this speed on an AVX2 host."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    constants = [numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "b"),
                 numpy_helper.from_array(np.array(0.01, np.float32), "a_scale"),
                 numpy_helper.from_array(np.full(n, 0.01, np.float32), "b_scale"),
                 numpy_helper.from_array(np.array(128, np.uint8), "a_zero")]
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "a_scale", "b_scale", "a_zero"], ["y"],
                            domain="com.microsoft")
    model = helper.make_model(helper.make_graph(
        [node], "ceiling", [helper.make_tensor_value_info("a", TensorProto.UINT8, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])], constants),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    codes = rng.integers(0, 256, (rows, k), dtype=np.uint8)
    return lambda: session.run(None, {"a": codes})


def model_run(engine: Engine, batch: int, sequence: int) -> Callable[[], object]:
    """One call of the artifact's session on `batch` rows of `sequence` real tokens."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 2000, (batch, sequence), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    feeds = {i.name: feeds[i.name] for i in engine.session.get_inputs()}
    return lambda: engine.session.run(None, feeds)


def measure(artifact: Path, cells: list[tuple[int, int]], threads: int, seconds: float,
            rounds: int) -> list[dict[str, float]]:
    """Per cell, the model and the ceiling timed in alternating rounds (so a noisy neighbour weighs on both);
    each figure the median over its rounds."""
    manifest = Manifest.load(artifact)
    counted = work(artifact / manifest.model.file)
    engine = Engine(artifact, manifest, threads=threads)
    rows = []
    for batch, sequence in cells:
        model = model_run(engine, batch, sequence)
        gemm = ceiling_run(batch * sequence, counted.hidden, counted.intermediate, threads)
        model_s, gemm_s = [], []
        for _ in range(rounds):
            model_s.append(timed(model, seconds))
            gemm_s.append(timed(gemm, seconds))
        tokens = batch * sequence / statistics.median(model_s)
        top = 2.0 * batch * sequence * counted.hidden * counted.intermediate / statistics.median(gemm_s)
        useful = tokens * counted.ops_per_token(sequence)
        rows.append({"batch": batch, "sequence": sequence, "tokens_per_s": tokens, "model_tops": useful / 1e12,
                     "ceiling_tops": top / 1e12, "efficiency": useful / top})
    return rows


def cell(text: str) -> tuple[int, int]:
    batch, _, sequence = text.partition("x")
    return int(batch), int(sequence)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--cells", nargs="+", type=cell, default=[(16, 64), (1, 256)],
                        help="BATCHxSEQUENCE, e.g. 16x64")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=1.0, help="per figure and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    manifest = Manifest.load(args.artifact)
    print(f"# {cpu_name()}: {args.artifact} ({manifest.target.name}, {manifest.model.precision}), "
          f"{args.threads} threads")
    print("| cell | model tokens/s | model TOP/s | MatMulInteger TOP/s at the FFN shape | efficiency |")
    print("|---|---|---|---|---|")
    for row in measure(args.artifact, args.cells, args.threads, args.seconds, args.rounds):
        print(f"| b{row['batch']:.0f} s{row['sequence']:.0f} | {row['tokens_per_s']:,.0f} | {row['model_tops']:.3f} "
              f"| {row['ceiling_tops']:.3f} | {row['efficiency']:.2f} |")
