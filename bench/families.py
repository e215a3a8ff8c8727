"""Full-size encoder shapes (each family's default config, random weights): what fuses, fp32 vs INT8 in-process.

    python -m bench.families [family ...]

Random weights say nothing about INT8 accuracy; they do give each family's real graph and its real cost.
Batch 8 x 128 tokens, the two graphs taking turns; prints one markdown row per family.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

FAMILIES = ("bert", "mpnet", "deberta-v2", "modernbert", "nomic_bert", "gte")
# deberta-v3-base's attention (the v2 default config is the older absolute-position variant)
OVERRIDES = {"deberta-v2": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                                relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                                norm_rel_ebd="layer_norm", share_att_key=True, position_buckets=256,
                                max_relative_positions=-1, type_vocab_size=0)}


def build(family: str, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from tests.models import minilm_dir

    config = AutoConfig.for_model(family, pad_token_id=0, **OVERRIDES.get(family, {}))
    torch.manual_seed(0)
    AutoModel.from_config(config).eval().save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(out)


def main(families: list[str]) -> None:
    import onnxruntime as ort

    from optimize.presets import resolve_target
    from optimize.stages.s1_load import load_source
    from optimize.stages.s2_export import export_onnx
    from optimize.stages.s3_fuse import fuse
    from optimize.stages.s5_quantize.per_token import quantize_per_token
    from optimize.stages.s6_validate.latency import cpu_session, median_ms

    bits = resolve_target("icelake").quantization.weight_bits
    print(f"onnxruntime {ort.__version__}; batch 8 x 128 tokens; median ms of 3 rounds x 5 runs")
    print("| family | params | fused | fp32 ms | INT8 ms | INT8 speed-up |")
    print("|---|---|---|---|---|---|")
    for family in families:
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            build(family, work / "model")
            source = load_source(str(work / "model"), "feature-extraction", pooling="mean")  # random: no card
            export_onnx(source, work / "exported.onnx")
            fusion = fuse(work / "exported.onnx", work / "fp32.onnx", source.config)
            quantize_per_token(work / "fp32.onnx", work / "int8.onnx", None, weight_bits=bits)
            sessions = {name: cpu_session(work / f"{name}.onnx") for name in ("fp32", "int8")}
            samples: dict[str, list[float]] = {name: [] for name in sessions}
            for _ in range(3):
                for name, session in sessions.items():
                    samples[name].append(median_ms(session, sequence=128, batch=8, runs=5))
            fp32, int8 = (statistics.median(samples[name]) for name in ("fp32", "int8"))
            from transformers import AutoModel
            params = sum(p.numel() for p in AutoModel.from_pretrained(work / "model").parameters()) / 1e6
            fused = ", ".join(f"{op} {n}" for op, n in sorted(fusion.stats.items())) or "nothing"
            print(f"| {family} | {params:.0f}M | {fused} | {fp32:.0f} | {int8:.0f} | {fp32 / int8:.2f}x |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(FAMILIES))
