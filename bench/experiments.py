"""Engine-level experiments on the bench model: which graph and settings move latency at batch 1.

    python -m bench.experiments          # writes bench/results/experiments.md

Every variant runs in this one process, round-robin over ROUNDS rounds, on the same inputs; each cell is
the median of the per-round medians.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from bench.model import build_distilbert_base
from bench.run import WORK, prepare, publish
from optimize.stages.s6_validate.latency import cpu_session, median_ms

SEQS = (8, 128)
ROUNDS = 5


def build_variants(model_dir: Path, out: Path) -> dict[str, Path]:
    from bench.recipes import per_tensor
    from optimize.stages.s1_load import load_source
    from optimize.stages.s2_export import export_onnx
    from optimize.stages.s3_fuse import fuse
    from optimize.stages.s5_quantize.config import QuantizationConfig
    from optimize.stages.s5_quantize.per_tensor import quantize

    out.mkdir(parents=True, exist_ok=True)
    plain, fused = out / "plain.onnx", out / "fused.onnx"
    if not fused.is_file():
        source = load_source(str(model_dir), "sequence-classification")
        export_onnx(source, plain)
        fuse(plain, fused, source.config)
    avx2, vnni = per_tensor(False), per_tensor(True)  # onnxruntime's dynamic INT8
    per_tensor = QuantizationConfig(weight_type="QInt8", per_channel=False, reduce_range=False,
                                    activations="per_tensor")
    unsigned = QuantizationConfig(weight_type="QUInt8", per_channel=False, reduce_range=False,
                                  activations="per_tensor")
    recipes = {
        "int8 fused, per-channel, reduce_range (previous avx2 preset)": (fused, avx2),
        "int8 fused, per-channel, full range (previous icelake preset)": (fused, vnni),
        "int8 fused, per-tensor, full range": (fused, per_tensor),
        "int8 fused, per-tensor, QUInt8 weights": (fused, unsigned),
        "int8 plain export (no transformer fusion), per-channel, full range": (plain, vnni),
    }
    variants = {"fp32 plain export": plain, "fp32 fused": fused}
    for index, (name, (src, config)) in enumerate(recipes.items()):
        path = out / f"variant{index}.onnx"
        if not path.is_file():
            quantize(src, path, config)
        variants[name] = path
    for fmt in ("QOperator", "QDQ"):
        path = out / f"static_{fmt.lower()}.onnx"
        if not path.is_file():
            quantize_static_for_timing(plain, path, fmt)
        variants[f"int8 static (calibrated activation scales), plain export, {fmt}"] = path
    _, artifact, _ = prepare()
    variants["int8 served artifact (MiniLM's recipe: outlier split + float-kept roles)"] = artifact / "model.onnx"
    return variants


def quantize_static_for_timing(src: Path, dst: Path, quant_format: str) -> None:
    """Static INT8 with MinMax scales from random token ids: right for timing, not for accuracy."""
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    names = [i.name for i in ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).get_inputs()]
    rng = np.random.default_rng(0)
    feeds = []
    for seq in (8, 16, 32, 64, 128) * 2:
        ids = rng.integers(1000, 29000, (1, seq), dtype=np.int64)
        inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        feeds.append({name: inputs[name] for name in names})

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(feeds)

        def get_next(self) -> dict | None:
            return next(self.items, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat[quant_format], per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    op_types_to_quantize=["MatMul", "Gemm"])


def main() -> None:
    model_dir = build_distilbert_base(WORK / "distilbert-base")
    variants = build_variants(model_dir, WORK / "experiments")
    sessions = {(name, spin): cpu_session(path, threads=2, spin_wait=spin)
                for name, path in variants.items() for spin in (False, True)}
    # Round-robin over all variants, so machine drift spreads over every row instead of landing on a few.
    readings: dict[tuple[str, bool], list[list[float]]] = {key: [[] for _ in SEQS] for key in sessions}
    for _ in range(ROUNDS):
        for key, session in sessions.items():
            time.sleep(0.05)  # the previous session's workers may still be spinning
            for i, seq in enumerate(SEQS):
                readings[key][i].append(median_ms(session, seq, runs=8 if seq <= 32 else 3))
    rows = [(name, spin, [statistics.median(r) for r in readings[(name, spin)]], variants[name].stat().st_size / 1e6)
            for name, spin in sessions]
    base = {seq: rows[0][2][i] for i, seq in enumerate(SEQS)}
    lines = ["# Engine experiments (DistilBERT-base, batch 1, 2 threads, median ms)", "",
             "| variant | spin | " + " | ".join(f"seq {s} ms (x fp32 plain)" for s in SEQS) + " | MB |",
             "|---|---|" + "---|" * len(SEQS) + "---|"]
    for name, spin, ms, size in rows:
        cells = " | ".join(f"{v:.2f} (x{base[s] / v:.2f})" for s, v in zip(SEQS, ms))
        lines.append(f"| {name} | {'on' if spin else 'off'} | {cells} | {size:.0f} |")
    publish("experiments.md", lines)


if __name__ == "__main__":
    main()
