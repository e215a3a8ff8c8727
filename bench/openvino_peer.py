"""OpenVINO as a measured peer, in-process: the model converted from PyTorch and compiled with OpenVINO's default
precision (bf16 on AMX hosts, which OpenVINO Model Server and sentence-transformers' `backend="openvino"` give an
Intel user without an option), beside our artifacts, in one process.

    python -m bench openvino bench/work/minilm bench/work/minilm-bf16 [--model SRC] [--threads 2] [--out FILE]

Speed: for each cell every engine takes turns call by call (drift lands on all alike), median ms per call; the
ratio column is OpenVINO's time over each artifact's (above 1: ours is faster). Fidelity: held-out texts against
sentence-transformers in PyTorch fp32, each text alone and in batches of 16, cosine_min of each; "moved" is the
largest |difference| between a text's answer alone and batched (0: batch-invariant).
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from infinity.engine.hostinfo import cpu_name

CELLS = ((1, 8), (1, 64), (1, 256), (16, 64), (32, 128))
TOKENS = 400_000  # per cell and engine: 50 calls at 1 x 8 down to 5 at 32 x 128 (floors below)
BATCH = 16
FLAGS = ("avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def openvino_model(source: str, threads: int) -> tuple[Any, Callable[[list[str]], dict[str, np.ndarray]]]:
    """(compiled model, tokenize): the SentenceTransformer (pooling and normalization in the graph) converted, and
    its tokenizer cut at its max_seq_length, as its encode cuts."""
    import openvino as ov
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(source, device="cpu")

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.st = st

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            features = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            return torch.nn.functional.normalize(self.st(features)["sentence_embedding"], dim=-1)

    example = {name: torch.ones(2, 16, dtype=torch.long) for name in ("input_ids", "attention_mask", "token_type_ids")}
    converted = ov.convert_model(Embed().eval(), example_input=example)
    names = [port.get_any_name() for port in converted.inputs]

    def tokenize(texts: list[str]) -> dict[str, np.ndarray]:
        tokens = st.tokenizer(texts, padding=True, truncation=True, max_length=st.max_seq_length, return_tensors="np")
        ids = tokens["input_ids"]
        return {name: (tokens[name] if name in tokens else np.zeros_like(ids)).astype(np.int64) for name in names}

    return ov.Core().compile_model(converted, "CPU", {"INFERENCE_NUM_THREADS": threads}), tokenize


def feeds(batch: int, sequence: int) -> dict[str, np.ndarray]:
    ids = np.full((batch, sequence), 2000, dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def timed(runners: dict[str, Callable[[dict[str, np.ndarray]], Any]]) -> dict[tuple[int, int], dict[str, float]]:
    table = {}
    for batch, sequence in CELLS:
        inputs = feeds(batch, sequence)
        calls = max(5, min(50, TOKENS // (batch * sequence * 8)))
        samples: dict[str, list[float]] = {name: [] for name in runners}
        for run in runners.values():
            run(inputs)
        for _ in range(calls):
            for name, run in runners.items():
                start = time.perf_counter()
                run(inputs)
                samples[name].append((time.perf_counter() - start) * 1000)
        table[(batch, sequence)] = {name: statistics.median(v) for name, v in samples.items()}
    return table


def fidelity(embed: Callable[[list[str]], np.ndarray], texts: list[str], reference: np.ndarray) -> dict[str, float]:
    alone = np.concatenate([embed([text]) for text in texts])
    batched = np.concatenate([embed(texts[i:i + BATCH]) for i in range(0, len(texts), BATCH)])

    def cosine_min(answers: np.ndarray) -> float:
        answers = answers / np.linalg.norm(answers, axis=-1, keepdims=True)
        return float((answers * reference).sum(-1).min())

    return {"alone": cosine_min(alone), "batched": cosine_min(batched), "moved": float(np.abs(alone - batched).max())}


def main() -> None:
    from bench.inprocess import predict
    from infinity.engine.model import LoadedModel
    from optimize.measure.texts import heldout_inputs
    from tests.models import minilm_dir

    parser = argparse.ArgumentParser(prog="python -m bench openvino", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", nargs="+", type=Path)
    parser.add_argument("--model", default=None, help="the source model (default: the bundled MiniLM)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--texts", type=int, default=100, help="held-out texts for fidelity")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here (markdown)")
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    from infinity.engine.hostinfo import cpu_flags

    source = args.model or str(minilm_dir())
    compiled, tokenize = openvino_model(source, args.threads)
    request = compiled.create_infer_request()
    loaded = [LoadedModel.load(path, threads=args.threads) for path in args.artifacts]
    models = {f"ours: {path.name} ({m.manifest.target.name} {m.manifest.model.precision})": m
              for path, m in zip(args.artifacts, loaded)}
    peer = f"OpenVINO {compiled.get_property('INFERENCE_PRECISION_HINT').get_type_name()} (its default)"

    def ours(model: LoadedModel) -> Callable[[dict[str, np.ndarray]], Any]:
        session = model.engine.session
        names = [i.name for i in session.get_inputs()]
        return lambda inputs: session.run(None, {name: inputs[name] for name in names})

    wanted = [port.get_any_name() for port in compiled.inputs]
    runners = {peer: lambda inputs: request.infer({name: inputs[name] for name in wanted}),
               **{name: ours(m) for name, m in models.items()}}
    speed = timed(runners)

    def openvino_embed(texts: list[str]) -> np.ndarray:
        return np.asarray(request.infer(tokenize(texts))[0])

    texts = [t for t in heldout_inputs("singles") if isinstance(t, str)][:args.texts]
    reference = SentenceTransformer(source, device="cpu").encode(texts, normalize_embeddings=True)
    faithful = {peer: fidelity(openvino_embed, texts, reference)}
    for name, model in models.items():
        faithful[name] = fidelity(lambda batch, model=model: np.asarray(predict(model, batch), dtype=np.float32),
                                  texts, reference)

    flags = " ".join(f for f in FLAGS if f in cpu_flags()) or "none of " + ", ".join(FLAGS)
    lines = [f"{cpu_name()} ({flags}), {args.threads} threads; {args.model or 'all-MiniLM-L6-v2'}; "
             f"{len(texts)} held-out texts", "",
             "| engine | " + " | ".join(f"b{b} s{s} ms" for b, s in CELLS) + " | cosine_min alone / batched | moved |",
             "|---|" + "---|" * (len(CELLS) + 2)]
    for name in runners:
        cells = " | ".join(f"{speed[cell][name]:.2f}" + ("" if name == peer else
                                                          f" ({speed[cell][peer] / speed[cell][name]:.2f}x)")
                           for cell in CELLS)
        f = faithful[name]
        lines.append(f"| {name} | {cells} | {f['alone']:.4f} / {f['batched']:.4f} | {f['moved']:.2g} |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
