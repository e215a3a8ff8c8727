"""Engine-level experiments on the bench model: which graph and settings move latency at batch 1.

    python -m bench.experiments          # writes bench/results/experiments.md

Every variant runs in this one process, alternating, on the same inputs (median of repeated runs).
"""
from __future__ import annotations

from pathlib import Path

from bench.model import build_distilbert_base
from bench.run import RESULTS, WORK, prepare
from optimize.speed import cpu_session, median_ms

SEQS = (8, 128)


def build_variants(model_dir: Path, out: Path) -> dict[str, Path]:
    from optimize.export import export_onnx
    from optimize.fuse import fuse
    from optimize.presets import PRESETS, QuantizationConfig
    from optimize.quantize import quantize
    from optimize.source import load_source

    out.mkdir(parents=True, exist_ok=True)
    plain, fused = out / "plain.onnx", out / "fused.onnx"
    if not fused.is_file():
        source = load_source(str(model_dir), "sequence-classification")
        export_onnx(source, plain)
        fuse(plain, fused, source.config)
    avx2, vnni = PRESETS["avx2"].quantization, PRESETS["icelake"].quantization
    per_tensor = QuantizationConfig(weight_type="QInt8", per_channel=False, reduce_range=False)
    unsigned = QuantizationConfig(weight_type="QUInt8", per_channel=False, reduce_range=False)
    recipes = {
        "int8 fused, per-channel, reduce_range (avx2 preset)": (fused, avx2),
        "int8 fused, per-channel, full range (icelake preset)": (fused, vnni),
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
    _, artifact = prepare()
    variants["int8 served artifact (MiniLM's recipe: outlier split + float-kept roles)"] = artifact / "model.onnx"
    return variants


def main() -> None:
    model_dir = build_distilbert_base(WORK / "distilbert-base")
    variants = build_variants(model_dir, WORK / "experiments")
    rows = []
    for name, path in variants.items():
        for spin in (False, True):
            s = cpu_session(path, threads=2, spin_wait=spin)
            rows.append((name, spin, [median_ms(s, seq, runs=40 if seq <= 32 else 15) for seq in SEQS],
                         path.stat().st_size / 1e6))
            print(rows[-1], flush=True)
    base = {seq: rows[0][2][i] for i, seq in enumerate(SEQS)}
    lines = ["# Engine experiments (DistilBERT-base, batch 1, 2 threads, median ms)", "",
             "| variant | spin | " + " | ".join(f"seq {s} ms (x fp32 plain)" for s in SEQS) + " | MB |",
             "|---|---|" + "---|" * len(SEQS) + "---|"]
    for name, spin, ms, size in rows:
        cells = " | ".join(f"{v:.2f} (x{base[s] / v:.2f})" for s, v in zip(SEQS, ms))
        lines.append(f"| {name} | {'on' if spin else 'off'} | {cells} | {size:.0f} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "experiments.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
