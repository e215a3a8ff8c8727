"""Engines beyond ONNX Runtime, measured beside the artifact on all-MiniLM-L6-v2: speed, parity, batch invariance.

    pip install openvino nncf   # not in any extra: no engine but ONNX Runtime is served
    HF_HUB_OFFLINE=1 python -m bench.engines   # after bench.recipes (its artifacts); writes results/engines.md

Candidates: OpenVINO fp32; bf16 where the CPU has AVX512-BF16 or AMX; INT8 weights (nncf.compress_weights, asym and
sym) with OpenVINO's runtime dynamic quantization of activations in groups of 32 along each row. Beside them the
artifact and onnxruntime's quantize_dynamic of the same fused graph. Speed: in-process, 2 threads, the engines
taking turns call by call, median (min) ms. Parity: the held-out texts against sentence-transformers in PyTorch
FP32, each text alone and in shuffled batches of 8, cosine_min of each; "moves": the largest difference of a
vector alone vs batched. An engine that is not bit-identical may only be chosen if it moves no more than its own
fp32 does.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from bench.recipes import CELLS, TASK, Runner, minilm, ort_runner, timed_cells
from bench.run import WORK, publish
from infinity.engine.hostinfo import cpu_flags, cpu_name
from infinity.engine.tokenization import TextTokenizer, pad_batch
from infinity.manifest import Manifest
from infinity.tasks.feature_extraction import l2_normalize, pool

THREADS = 2


def _openvino(model: object, extra: dict[str, object]) -> Runner:
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": THREADS, "PERFORMANCE_HINT": "LATENCY",
                                                      "NUM_STREAMS": 1, **extra})
    names = {i.get_any_name() for i in compiled.inputs}
    request = compiled.create_infer_request()
    return lambda feeds: request.infer({k: v for k, v in feeds.items() if k in names})[0].copy()


def runners(recipes: Path, plain: Path) -> dict[str, Runner]:
    import nncf
    import openvino as ov

    artifact = recipes / "per_token_icelake"
    found = {"the artifact (onnxruntime, per-token INT8)":
             ort_runner(artifact / "model.onnx", THREADS) if artifact.is_dir() else None}
    dynamic = next(recipes.glob("quantize_dynamic_*.onnx"), None)
    found["onnxruntime quantize_dynamic"] = ort_runner(dynamic, THREADS) if dynamic else None
    core = ov.Core()
    found["OpenVINO fp32"] = _openvino(core.read_model(str(plain)), {"INFERENCE_PRECISION_HINT": "f32"})
    if {"avx512_bf16", "amx_bf16"} & cpu_flags():
        found["OpenVINO bf16"] = _openvino(core.read_model(str(plain)), {"INFERENCE_PRECISION_HINT": "bf16"})
    for mode in ("INT8_ASYM", "INT8_SYM"):
        compressed = nncf.compress_weights(core.read_model(str(plain)), mode=getattr(nncf.CompressWeightsMode, mode))
        found[f"OpenVINO {mode} weights, dynamic quantization group 32"] = _openvino(
            compressed, {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 32, "INFERENCE_PRECISION_HINT": "f32"})
    return {name: run for name, run in found.items() if run is not None}


def parity(engines: dict[str, Runner], tokenizer: TextTokenizer, pad_id: int) -> dict[str, tuple[float, float, float]]:
    from optimize.stages.s1_load import load_source
    from optimize.stages.s4_reference import torch_reference
    from optimize.tasks import task_for

    texts = task_for(TASK).heldout()
    reference = np.stack(torch_reference(load_source(minilm(), TASK), texts))
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    encoded = tokenizer.encode(texts)
    order = list(range(len(encoded)))
    random.Random(7).shuffle(order)

    def embed(run: Runner, items: list) -> np.ndarray:
        batch = pad_batch(items, pad_id)
        feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                 "token_type_ids": batch.token_type_ids}
        return l2_normalize(pool(run(feeds), batch.attention_mask, "mean"))

    rows = {}
    for name, run in engines.items():
        alone = np.stack([embed(run, [item])[0] for item in encoded])
        batched = np.zeros_like(alone)
        for start in range(0, len(order), 8):
            chosen = order[start:start + 8]
            batched[chosen] = embed(run, [encoded[i] for i in chosen])
        rows[name] = (float((alone * reference).sum(1).min()), float((batched * reference).sum(1).min()),
                      float(np.abs(alone - batched).max()))
    return rows


def main() -> None:
    from optimize.stages.s1_load import load_source
    from optimize.stages.s2_export import export_onnx

    recipes = WORK / "recipes"
    served = recipes / "fp32"
    if not (served / "manifest.json").is_file():
        raise SystemExit("run `python -m bench.recipes` first: its artifacts are the ONNX Runtime rows")
    plain = recipes / "exported.onnx"
    if not plain.is_file():
        export_onnx(load_source(minilm(), TASK), plain)
    manifest = Manifest.load(served)
    tokenizer = TextTokenizer(served / "tokenizer.json", manifest.tokenizer.max_length, manifest.tokenizer.pad_id)
    engines = runners(recipes, plain)
    checked = parity(engines, tokenizer, manifest.tokenizer.pad_id)
    timed = timed_cells(engines, lambda batch, sequence: max(5, min(60, 40_000 // (batch * sequence))))
    flags = " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx", "avx_vnni"))))
    lines = [f"# Engines on all-MiniLM-L6-v2 ({cpu_name()}; {flags or 'no AVX-512 or AMX flags'})", "",
             f"In-process, {THREADS} threads, median (min) ms, engines in turns; held-out cosine_min alone / batched "
             "against sentence-transformers; moves: largest |alone - batched|.", "",
             "| engine | " + " | ".join(f"b{b} s{s}" for b, s in CELLS) + " | cosine_min alone / batched | moves |",
             "|---|" + "---|" * (len(CELLS) + 2)]
    for name in engines:
        cells = " | ".join(f"{timed[name][c][0]:.2f} ({timed[name][c][1]:.2f})" for c in CELLS)
        alone, batched, moves = checked[name]
        lines.append(f"| {name} | {cells} | {alone:.4f} / {batched:.4f} | {moves:.2g} |")
    publish("engines.md", lines)


if __name__ == "__main__":
    main()
