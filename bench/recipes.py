"""INT8 recipes for MiniLM side by side: in-process speed, parity as served on the held-out texts, batch invariance.

    python -m bench recipes                                  # writes docs/results/recipes.md
    python -m bench recipes --extra "earlier artifact=path/model.onnx"

Speed: every variant in this one process; for each cell the variants take turns call by call, so drift and other
processes on the cores land on all of them alike; each cell is the median (and the minimum) of those calls, 2
threads, workers busy-waiting as the server's do (`--spin-wait-us`, default the server's; 0: no spinning, written to
recipes-no-spin.md). The ratio column divides by onnxruntime's plain `quantize_dynamic` of the same fused graph.
Parity: the optimizer's own served check (each held-out input alone and inside mixed-length batches up to the
server's limits, the worse of the two).
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.run import WORK, publish
from infinity.engine.hostinfo import cpu_flags, cpu_name
from infinity.manifest import Manifest
from infinity.settings import SPIN_WAIT_US
from optimize.stages.s6_quantize.latency import cpu_session
from optimize.tasks import task_for

TASK = "feature-extraction"
CELLS = ((1, 8), (1, 64), (1, 256), (8, 64), (32, 128))
CALLS = 400_000  # tokens per cell and variant: 60 calls at 8 tokens down to 3 at 32 x 128 (floors below)
DYNAMIC = "onnxruntime quantize_dynamic of the same fused graph (per-channel s8 weights, u8 activations)"
DEFAULT = "the artifact: per-token INT8 (--target auto)"
INT8_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_int8", "avx_vnni")


def minilm() -> str:
    from tests.models import minilm_dir
    return str(minilm_dir())


def per_tensor(vnni: bool) -> Any:
    """onnxruntime's dynamic INT8 (one activation scale per padded batch), with 7-bit weights without VNNI."""
    from optimize.stages.s6_quantize.config import QuantizationConfig

    return QuantizationConfig(weight_type="QInt8", per_channel=True, reduce_range=not vnni, activations="per_tensor")


def build_variants(out: Path) -> tuple[Path, dict[str, Path]]:
    """(the fp32 artifact whose tokenizer and manifest serve every variant, variant name -> model.onnx)"""
    from infinity.engine.tokenization import TextTokenizer
    from optimize.options import OptimizeOptions
    from optimize.pipeline import optimize
    from optimize.presets import resolve_target
    from optimize.stages.s6_quantize.calibrate import Feeder, activation_bounds
    from optimize.stages.s6_quantize.per_tensor import quantize
    from optimize.stages.s6_quantize.per_token import per_token_candidates, quantize_per_token

    out.mkdir(parents=True, exist_ok=True)
    target = resolve_target("auto")
    artifacts = {}
    for name, precision in (("fp32", "fp32"), (f"per_token_{target.name}", "int8")):
        path = out / name
        if not (path / "manifest.json").is_file():
            optimize(OptimizeOptions(model=minilm(), task=TASK, out=path, target=target.name, precision=precision,
                                     allow_failed_parity=True, threads=2))
        artifacts[name] = path
    fused = artifacts["fp32"] / "model.onnx"
    artifact = artifacts[f"per_token_{target.name}"] / "model.onnx"
    variants = {"fp32 (fused)": fused, f"{DEFAULT}: {target.name}": artifact}

    built = Manifest.load(artifacts[f"per_token_{target.name}"]).optimization.quantization
    bits = 8 if built is None else built.weight_bits
    every_row = out / f"per_token_w{bits}_every_row.onnx"
    if not every_row.is_file():
        manifest = Manifest.load(artifacts["fp32"])
        tokenizer = TextTokenizer(artifacts["fp32"] / "tokenizer.json", manifest.tokenizer.max_length,
                                  manifest.tokenizer.pad_id)
        feeder = Feeder(tokenizer)
        nodes = per_token_candidates(fused)
        bounds = activation_bounds(fused, nodes, (f for _, f in feeder.batches(task_for(TASK).calibration())), 2)
        quantize_per_token(fused, every_row, bounds, weight_bits=bits)
    variants[f"per-token, {bits}-bit weights, a scale per row for every input"] = every_row

    vnni = "avx512_vnni" in cpu_flags()
    dynamic = out / f"quantize_dynamic_{'vnni' if vnni else 'reduce_range'}.onnx"
    if not dynamic.is_file():
        quantize(fused, dynamic, per_tensor(vnni))
    variants[DYNAMIC] = dynamic
    return artifacts["fp32"], variants


def parity_rows(served_dir: Path, variants: dict[str, Path]) -> dict[str, dict[str, float]]:
    from optimize.stages.s1_load import load_source
    from optimize.stages.s4_reference import torch_reference
    from optimize.stages.s5_draft.served import load_candidate, served_parity

    manifest = Manifest.load(served_dir)
    inputs = task_for(TASK).heldout()
    reference = torch_reference(load_source(minilm(), TASK), inputs)
    rows = {}
    for name, path in variants.items():
        checked = served_parity(task_for(TASK), load_candidate(served_dir, manifest, path, threads=2), inputs,
                                reference, task_for(TASK).thresholds)
        rows[name] = {"alone": checked.modes["alone"]["cosine_min"], "batched": checked.modes["batched"]["cosine_min"],
                      "mean": checked.result.metrics["cosine_mean"],
                      "invariance": checked.batch_invariance["max_abs_diff"], "passed": float(checked.result.passed)}
    return rows


Runner = Callable[[dict[str, np.ndarray]], Any]


def ort_runner(path: Path, threads: int = 2, spin_wait_us: int = SPIN_WAIT_US) -> Runner:
    """One graph on onnxruntime's CPU provider, fed only the inputs it takes; spin_wait_us 0: no spinning."""
    session = cpu_session(path, threads=threads, spin_wait=spin_wait_us > 0, spin_wait_us=spin_wait_us)
    names = {i.name for i in session.get_inputs()}
    return lambda feeds: session.run(None, {k: v for k, v in feeds.items() if k in names})[0]


def timed_cells(runners: dict[str, Runner], calls: Callable[[int, int], int],
                shapes: tuple[tuple[int, int], ...] = CELLS) -> dict[str, dict[tuple[int, int], tuple[float, float]]]:
    """(median, min) ms per runner and cell (batch, sequence), the runners taking turns call by call;
    `calls(batch, sequence)`."""
    cells: dict[str, dict[tuple[int, int], tuple[float, float]]] = {name: {} for name in runners}
    for batch, sequence in shapes:
        ids = np.full((batch, sequence), 1000, dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        for run in runners.values():
            for _ in range(2):
                run(feeds)
        samples: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(calls(batch, sequence)):
            for name, run in runners.items():
                start = time.perf_counter()
                run(feeds)
                samples[name].append((time.perf_counter() - start) * 1000)
        for name, values in samples.items():
            cells[name][(batch, sequence)] = (statistics.median(values), min(values))
    return cells


def speed_rows(variants: dict[str, Path], scale: float = 1.0,
               spin_wait_us: int = SPIN_WAIT_US) -> dict[str, dict[tuple[int, int], tuple[float, float]]]:
    """(median, min) ms per variant and cell, 2 threads."""
    return timed_cells({name: ort_runner(path, spin_wait_us=spin_wait_us) for name, path in variants.items()},
                       lambda batch, sequence: max(3, int(scale * min(60, CALLS // (batch * sequence * 20) + 3))))


def gemm_floor(model: Path, calls: int = 20,
               spin_wait_us: int = SPIN_WAIT_US) -> dict[tuple[int, int], tuple[float, float]]:
    """Per cell: (ms a GEMM-bound run would take, GOP/s) for the INT8 graph's weight GEMMs, at the rate onnxruntime's
    own u8 x s8 kernel reaches on this host (its fastest call) for the graph's widest weight, with the cell's rows and
    one A scale (the kernel alone: a scale per row costs a pass over the output after it)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = onnx.load(str(model)).graph
    weights = {init.name: tuple(init.dims) for init in graph.initializer}
    shapes = [weights[n.input[1]] for n in graph.node if n.op_type == "MatMulIntegerToFloat" and n.input[1] in weights]
    depth, width = max(shapes, key=lambda shape: shape[0] * shape[1])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-63, 64, (depth, width), dtype=np.int8), "w"),
             numpy_helper.from_array(np.ones(width, np.float32), "w_scale"),
             numpy_helper.from_array(np.array(128, np.uint8), "zero")]
    node = helper.make_node("MatMulIntegerToFloat", ["a", "w", "a_scale", "w_scale", "zero"], ["y"],
                            domain="com.microsoft")
    probe = helper.make_model(helper.make_graph(
        [node], "gemm", [helper.make_tensor_value_info("a", TensorProto.UINT8, ["m", depth]),
                         helper.make_tensor_value_info("a_scale", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    session = cpu_session(probe.SerializeToString(), threads=2, spin_wait=spin_wait_us > 0, spin_wait_us=spin_wait_us)
    per_row = 2 * sum(k * n for k, n in shapes)  # ops of every weight GEMM, per token
    floors = {}
    for batch, sequence in CELLS:
        rows = batch * sequence
        feeds = {"a": rng.integers(0, 256, (rows, depth), dtype=np.uint8), "a_scale": np.array(1, np.float32)}
        session.run(None, feeds)
        samples = []
        for _ in range(max(5, calls * 256 // rows)):
            start = time.perf_counter()
            session.run(None, feeds)
            samples.append(time.perf_counter() - start)
        rate = 2 * rows * depth * width / min(samples)  # a floor: the kernel's best, which a neighbour cannot raise
        floors[(batch, sequence)] = (per_row * rows / rate * 1000, rate / 1e9)
    return floors


Cells = dict[tuple[int, int], tuple[float, float]]


def speed_cells(cells: Cells, base: Cells, shapes: tuple[tuple[int, int], ...]) -> str:
    """Markdown cells: median (min) ms and the ratio of the median to `base`'s."""
    return " | ".join(f"{cells[c][0]:.2f} ({cells[c][1]:.2f}) x{cells[c][0] / base[c][0]:.2f}" for c in shapes)


def table(variants: dict[str, Path], speed: dict, parity: dict | None, spin_wait_us: int = SPIN_WAIT_US) -> list[str]:
    flags = " ".join(sorted(f for f in cpu_flags() if f in INT8_FLAGS)) or "none of " + ", ".join(INT8_FLAGS)
    lines = [f"# INT8 recipes on all-MiniLM-L6-v2 ({cpu_name()}; INT8-relevant CPU flags: {flags})", "",
             "In-process ms, 2 threads, "
             + (f"idle workers spinning {spin_wait_us} us" if spin_wait_us else "no spinning")
             + (" (as the server does by default)" if spin_wait_us == SPIN_WAIT_US else "")
             + ": median of calls taken in turns (min in brackets), x = this / "
             "quantize_dynamic (median ratio)"
             + ("; parity as served on the held-out texts: cosine_min alone / batched (mean); invariance: "
                "max |alone - batched|." if parity else "."),
             "",
             "| recipe | " + " | ".join(f"b{b} s{s}" for b, s in CELLS) + (" | cosine_min alone / batched (mean) | "
                                                                          "invariance | passes |" if parity else " |"),
             "|---|" + "---|" * len(CELLS) + ("---|---|---|" if parity else "")]
    base = speed[DYNAMIC]
    for name in variants:
        cells = speed_cells(speed[name], base, CELLS)
        row = f"| {name} | {cells} |"
        if parity:
            p = parity[name]
            row += (f" {p['alone']:.4f} / {p['batched']:.4f} ({p['mean']:.4f}) | {p['invariance']:.3g} | "
                    f"{'yes' if p['passed'] else 'no'} |")
        lines.append(row)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--extra", action="append", default=[], metavar="NAME=MODEL.ONNX",
                        help="another MiniLM graph to compare in the same run, e.g. the artifact an earlier "
                             "commit's recipe built")
    parser.add_argument("--calls", type=float, default=1.0, help="scale the number of calls per cell")
    parser.add_argument("--no-parity", action="store_true", help="speed only (parity takes minutes)")
    parser.add_argument("--spin-wait-us", type=int, default=SPIN_WAIT_US,
                        help="how long onnxruntime's idle workers busy-wait, as the server's option (0: no spinning)")
    args = parser.parse_args(argv)
    served_dir, variants = build_variants(WORK / "recipes")
    for item in args.extra:
        name, _, path = item.partition("=")
        variants[name] = Path(path)
    parity = None if args.no_parity else parity_rows(served_dir, variants)
    speed = speed_rows(variants, args.calls, args.spin_wait_us)
    lines = table(variants, speed, parity, args.spin_wait_us)
    artifact = next(name for name in variants if name.startswith(DEFAULT))
    floors = gemm_floor(variants[artifact], spin_wait_us=args.spin_wait_us)
    lines += ["", "GEMM-bound floor of the artifact: its weight GEMMs at the u8 x s8 rate onnxruntime's "
              "MatMulIntegerToFloat reaches on this host for the graph's widest weight (same rows, its fastest call "
              "in this run); share = floor / the artifact's median.", "",
              "| | " + " | ".join(f"b{b} s{s}" for b, s in CELLS) + " |", "|---|" + "---|" * len(CELLS),
              "| u8 x s8 GOP/s | " + " | ".join(f"{floors[c][1]:.0f}" for c in CELLS) + " |",
              "| floor ms | " + " | ".join(f"{floors[c][0]:.2f}" for c in CELLS) + " |",
              "| share of the floor | " + " | ".join(f"{floors[c][0] / speed[artifact][c][0]:.0%}"
                                                    for c in CELLS) + " |"]
    publish("recipes.md" if args.spin_wait_us == SPIN_WAIT_US else (
        "recipes-no-spin.md" if not args.spin_wait_us else f"recipes-spin{args.spin_wait_us}us.md"), lines)
