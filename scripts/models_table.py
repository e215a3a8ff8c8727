"""The supported-models table of docs/models.md, from the artifacts tests/test_matrix.py built.

    INFINITY_TEST_ARTIFACTS=/tmp/artifacts python -m pytest tests/test_matrix.py
    python scripts/models_table.py /tmp/artifacts
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infinity.manifest import Manifest  # noqa: E402
from tests.models import FAMILIES  # noqa: E402

EXAMPLES = {
    "bert": "bge-*-en-v1.5, e5-*-v2, all-MiniLM, mxbai-embed-large, ms-marco cross-encoders",
    "distilbert": "distilbert classifiers, msmarco-distilbert",
    "roberta": "all-roberta-large-v1, roberta classifiers",
    "xlm-roberta": "multilingual-e5, bge-m3, bge-reranker-base/v2-m3",
    "camembert": "sentence-camembert",
    "electra": "electra classifiers, ms-marco-electra",
    "albert": "albert classifiers",
    "mpnet": "all-mpnet-base-v2, multi-qa-mpnet",
    "deberta-v2": "DeBERTa-v3 classifiers and NLI, mxbai-rerank v1",
    "modernbert": "gte-modernbert, modernbert-embed, gte-reranker-modernbert",
    "nomic_bert": "nomic-embed-text-v1.5 (as transformers implements it)",
    "gte": "gte-multilingual (as transformers implements it)",
    "jina_embeddings_v3": "jina-embeddings-v3 (as transformers implements it)",
}
TASKS = ("feature-extraction", "sequence-classification")


def cell(path: Path, key: str) -> str:
    if not (path / "manifest.json").is_file():
        return "not built"
    manifest = Manifest.load(path)
    metric = manifest.parity.metrics.get(key)
    return f"{'passed' if manifest.parity.passed else 'failed'} ({key} {metric:.4f})"


def main(root: Path) -> None:
    print("| family | example models | tasks | fused by onnxruntime (tiny model, 2 layers) | attention fused | "
          "INT8 parity, embeddings | INT8 parity, classification |")
    print("|---|---|---|---|---|---|---|")
    for family in FAMILIES:
        fp32 = root / f"tiny-{family}-feature-extraction-icelake-fp32"
        manifest = Manifest.load(fp32)
        fusion = manifest.optimization.fusion
        fused = ", ".join(f"{op} {n}" for op, n in sorted(fusion.items())) or "nothing"
        attention = "yes" if fusion.get("Attention", 0) >= 2 else f"{fusion.get('Attention', 0)} of 2"
        print(f"| {family} | {EXAMPLES[family]} | embeddings, classification | {fused} | {attention} | "
              f"{cell(root / f'tiny-{family}-feature-extraction-icelake-int8', 'cosine_min')} | "
              f"{cell(root / f'tiny-{family}-sequence-classification-icelake-int8', 'top1_agreement')} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
