"""A checkpoint's shape with random weights: its config, tokenizer and sentence-transformers files, new weights.

    python -m bench shapes MODEL_DIR OUT [--seed 0]

For speed and size only: a full-size model whose weights cannot travel runs as fast as the trained one, but its
answers say nothing about fidelity (random weights have no outliers). MODEL_DIR may hold no weights at all.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.h5", "*.onnx", "*.msgpack")
CARD = "README.md"  # the trained model's card: its usage example would name the trained model


def without_weights(model: Path, out: Path) -> Path:
    """A copy of `model` without its weight files and model card."""
    skip = shutil.ignore_patterns(*WEIGHTS, CARD)
    shutil.copytree(model, out, ignore=skip)
    return out


def random_checkpoint(model: Path, out: Path, seed: int = 0) -> Path:
    """`model`'s files with weights drawn as transformers initializes them, from `seed`."""
    import torch
    from transformers import AutoConfig, AutoModel

    without_weights(model, out)
    torch.manual_seed(seed)
    network = AutoModel.from_config(AutoConfig.from_pretrained(model))
    network.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    random_checkpoint(args.model, args.out, args.seed)
    print(f"{args.out}: {args.model}'s shape, random weights (seed {args.seed})")
