"""The peer a bulk job is measured beside: infinity-emb serving optimum's dynamic INT8 of the same model, as its
users deploy it on a CPU (its optimum engine prefers a quantized ONNX file, and optimizes it at start).

    python -m bench peer setup                 # bench/work/peer-venv: infinity-emb 0.0.78 with optimum (once)
    python -m bench peer model SRC OUT         # SRC's ONNX export and its INT8 for this CPU (avx512_vnni or avx2)
    python -m bench bulk ARTIFACT --model SRC --peer "$(python -m bench peer command)" --peer-dir OUT

infinity-emb pins numpy < 2 and sentence-transformers < 4, so it lives in a virtual environment of its own.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from bench.run import WORK

VENV = (WORK / "peer-venv").absolute()
# what `pip install infinity-emb[server,optimum]` resolves (optimum 2.x: infinity-emb's own graph optimization call
# fails there, and it serves the quantized graph as optimum wrote it, as its users get it); torch's CPU build
PACKAGES = ["infinity-emb[server,optimum]==0.0.78", "torch==2.13.0"]
# infinity-emb's optimum engine: mean pooling, its own dynamic batching; /embeddings is OpenAI's route. It names
# the ONNX file by its path under the model id, which optimum then looks up inside the model directory: started in
# that directory, as ".", the two agree.
COMMAND = ("{bin}/infinity_emb v2 --model-id . --engine optimum --device cpu --port {{port}} --pooling-method mean "
           "--batch-size 32")
QUANTIZE = """
import shutil, sys
from pathlib import Path
from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTQuantizer
from optimum.onnxruntime.configuration import AutoQuantizationConfig
from transformers import AutoTokenizer

source, out, recipe = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
ORTModelForFeatureExtraction.from_pretrained(source, export=True).save_pretrained(out)
AutoTokenizer.from_pretrained(source).save_pretrained(out)
config = getattr(AutoQuantizationConfig, recipe)(is_static=False, per_channel=True)
ORTQuantizer.from_pretrained(out).quantize(save_dir=out, quantization_config=config)
for path in source.iterdir():  # the sentence-transformers files, for the record
    if path.is_file() and not (out / path.name).exists() and path.suffix != ".safetensors":
        shutil.copy(path, out / path.name)
print(f"{out}: {recipe} INT8, per channel, dynamic")
"""


def python() -> Path:
    return VENV / "bin" / "python"


def setup() -> None:
    if not python().is_file():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python()), "-m", "pip", "install", "-q", *PACKAGES], check=True)


def model(source: Path, out: Path) -> None:
    from infinity.engine.hostinfo import cpu_flags

    recipe = "avx512_vnni" if {"avx512_vnni", "avx512f"} <= cpu_flags() else "avx2"
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([str(python()), "-c", QUANTIZE, str(source), str(out), recipe], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("setup")
    made = verbs.add_parser("model")
    made.add_argument("source", type=Path)
    made.add_argument("out", type=Path)
    verbs.add_parser("command")
    args = parser.parse_args()
    if args.verb == "setup":
        setup()
    elif args.verb == "model":
        model(args.source, args.out)
    else:
        print(COMMAND.format(bin=python().parent))
