"""INT8 recipes for MiniLM side by side: in-process speed, parity as served on the held-out texts, batch invariance.

    python -m bench.recipes                                  # writes bench/results/recipes.md
    python -m bench.recipes --extra "earlier artifact=path/model.onnx"

Speed: every variant in this one process, taking turns over ROUNDS rounds on the same inputs (2 threads, no
spinning); each cell is the median of the per-round medians. Parity: the optimizer's own served check (each
held-out input alone and inside mixed-length batches up to the server's limits, the worse of the two).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.run import RESULTS, WORK
from infinity.manifest import Manifest
from optimize.heldout import heldout_inputs
from optimize.parity import THRESHOLDS
from optimize.speed import SHAPES, cpu_session, host_cpu_name, median_ms

ROUNDS = 5
TASK = "feature-extraction"
PLAIN = "per-tensor dynamic, full INT8 (no split, no search)"
DEFAULT = "per-token u8 x 7-bit s8, SmoothQuant 0.5, one-sided GELU inputs (default, every CPU target)"


def minilm() -> str:
    from tests.models import minilm_dir
    return str(minilm_dir())


def build_variants(out: Path) -> tuple[Path, dict[str, Path]]:
    """(the fp32 artifact whose tokenizer and manifest serve every variant, variant name -> model.onnx)"""
    from optimize.export import export_onnx
    from optimize.outliers import activation_ranges
    from optimize.per_token import per_token_candidates, quantize_per_token
    from optimize.pipeline import OptimizeOptions, optimize
    from optimize.presets import PER_TENSOR_NO_VNNI
    from optimize.quantize import quantize
    from optimize.reference import OnnxRunner, calibration_inputs
    from optimize.source import load_source
    from infinity.tokenization import TextTokenizer

    out.mkdir(parents=True, exist_ok=True)
    artifacts = {}
    for name, precision, activations in (("fp32", "fp32", None), ("per_token", "int8", "per_token")):
        path = out / name
        if not (path / "manifest.json").is_file():
            optimize(OptimizeOptions(model=minilm(), task=TASK, out=path, target="avx2", precision=precision,
                                     activations=activations, allow_failed_parity=True, threads=2))
        artifacts[name] = path
    fused = artifacts["fp32"] / "model.onnx"
    variants = {"fp32 (fused)": fused, DEFAULT: artifacts["per_token"] / "model.onnx"}

    plain_int8 = out / "per_tensor_full.onnx"
    if not plain_int8.is_file():
        quantize(fused, plain_int8, PER_TENSOR_NO_VNNI)
    variants[PLAIN] = plain_int8

    manifest = Manifest.load(artifacts["fp32"])
    eight_bit = out / "per_token_w8.onnx"
    if not eight_bit.is_file():
        tokenizer = TextTokenizer(artifacts["fp32"] / "tokenizer.json", manifest.tokenizer.max_length,
                                  manifest.tokenizer.pad_id)
        runner = OnnxRunner(tokenizer, TASK, manifest.task, 2)
        nodes = per_token_candidates(fused)
        ranges = activation_ranges(fused, nodes, (f for _, f in runner.batches(calibration_inputs(TASK))), 2)
        quantize_per_token(fused, eight_bit, ranges, weight_bits=8)
    variants["per-token u8 x 8-bit s8 (saturates VPMADDUBSW without VNNI)"] = eight_bit

    nbits = out / "matmul_nbits.onnx"
    if not nbits.is_file():
        exported = out / "exported.onnx"
        export_onnx(load_source(minilm(), TASK), exported)
        matmul_nbits(exported, nbits)
    variants["MatMulNBits 8-bit weights, accuracy_level 4 (all 36 MatMuls, unfused export)"] = nbits
    return artifacts["fp32"], variants


def matmul_nbits(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(str(src)), bits=8, block_size=32, is_symmetric=True,
                                     accuracy_level=4)
    quantizer.process()
    quantizer.model.save_model_to_file(str(dst))


def parity_rows(served_dir: Path, variants: dict[str, Path]) -> dict[str, dict[str, float]]:
    from optimize.reference import torch_reference
    from optimize.served import load_candidate, served_parity
    from optimize.source import load_source

    manifest = Manifest.load(served_dir)
    inputs = heldout_inputs(TASK)
    reference = torch_reference(load_source(minilm(), TASK), inputs)
    rows = {}
    for name, path in variants.items():
        checked = served_parity(load_candidate(served_dir, manifest, path, threads=2), inputs, reference,
                                THRESHOLDS[TASK])
        rows[name] = {"alone": checked.modes["alone"]["cosine_min"], "batched": checked.modes["batched"]["cosine_min"],
                      "mean": checked.result.metrics["cosine_mean"],
                      "invariance": checked.batch_invariance["max_abs_diff"], "passed": float(checked.result.passed)}
    return rows


def speed_rows(variants: dict[str, Path], rounds: int = ROUNDS) -> dict[str, dict[str, float]]:
    sessions = {name: cpu_session(path, threads=2, spin_wait=False) for name, path in variants.items()}
    samples = {name: {shape: [] for shape in SHAPES} for name in sessions}
    for _ in range(rounds):
        for name, session in sessions.items():
            for shape, (batch, sequence) in SHAPES.items():
                samples[name][shape].append(median_ms(session, sequence, batch, runs=9 if batch * sequence <= 64 else 4))
    return {name: {shape: statistics.median(v) for shape, v in shapes.items()} for name, shapes in samples.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--extra", action="append", default=[], metavar="NAME=MODEL.ONNX",
                        help="another MiniLM graph to compare in the same run, e.g. the artifact an earlier "
                             "commit's recipe built (per-tensor with outlier split: multiverse optimize --activations "
                             "per_tensor builds it, searching for parity as served)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    served_dir, variants = build_variants(WORK / "recipes")
    for item in args.extra:
        name, _, path = item.partition("=")
        variants[name] = Path(path)
    parity = parity_rows(served_dir, variants)
    speed = speed_rows(variants, args.rounds)
    base = speed[PLAIN]
    lines = [f"# INT8 recipes on all-MiniLM-L6-v2 ({host_cpu_name()}, {len(heldout_inputs(TASK))} held-out texts)", "",
             "In-process ms, 2 threads, median of round-robin rounds (x = plain per-tensor INT8 / this); parity as "
             "served: cosine_min alone / batched (mean); invariance: max |alone - batched| of the served vector.", "",
             "| recipe | b1 seq 8 | b1 seq 64 | b1 seq 256 | b8 x 64 | cosine_min alone / batched (mean) | "
             "invariance | passes |",
             "|---|---|---|---|---|---|---|---|"]
    for name in variants:
        ms = " | ".join(f"{speed[name][s]:.1f} (x{base[s] / speed[name][s]:.2f})" for s in SHAPES)
        p = parity[name]
        lines.append(f"| {name} | {ms} | {p['alone']:.4f} / {p['batched']:.4f} ({p['mean']:.4f}) | "
                     f"{p['invariance']:.3g} | {'yes' if p['passed'] else 'no'} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "recipes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
