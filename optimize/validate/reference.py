"""Task-level outputs of the original model (PyTorch FP32) and of an ONNX graph, on the same probes."""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from infinity.engine.tokenization import TextInput
from infinity.tasks.base import activate
from optimize.source import SourceModel, read_modules

# one answer per input: a vector, a probability row, a token x label matrix, a score; for hybrid-embedding a
# HybridAnswer
Outputs = list[Any]


class HybridAnswer(NamedTuple):
    dense: np.ndarray    # the normalized vector
    sparse: np.ndarray   # 2 x n: token ids in order, and their weights
    colbert: np.ndarray  # one normalized vector per token but the first


def ranking_group_sizes(inputs: list[TextInput]) -> list[int]:
    """Sizes of the runs of consecutive pairs that share a query: each run is ranked on its own."""
    sizes: list[int] = []
    previous = None
    for pair in inputs:
        query = pair[0] if isinstance(pair, tuple) else pair
        if query == previous:
            sizes[-1] += 1
        else:
            sizes.append(1)
        previous = query
    return sizes


def torch_reference(source: SourceModel, inputs: list[TextInput]) -> Outputs:
    import torch

    if source.task == "feature-extraction":
        # sentence-transformers' own pooling, never the server's: parity then checks the server's pooling too
        model = sentence_transformer(source)
        return list(model.encode(inputs, batch_size=8, convert_to_numpy=True))
    if source.task == "sparse-embedding":
        vectors = sparse_encoder(source).encode(inputs, batch_size=8, convert_to_tensor=True,
                                                convert_to_sparse_tensor=False)
        return list(vectors.float().numpy())
    if source.task == "multi-vector":
        from sentence_transformers import MultiVectorEncoder
        encoder = MultiVectorEncoder(str(source.path), device="cpu", trust_remote_code=source.trust_remote_code)
        return [vectors.float().numpy() for vectors in encoder.encode_document(inputs, batch_size=8)]
    if source.task == "hybrid-embedding":
        return m3_reference(source, inputs)
    if source.facts.reranker is not None:
        return causal_reranker_scores(source, inputs)
    if source.task == "ranking":
        from sentence_transformers import CrossEncoder
        model = CrossEncoder(str(source.path), device="cpu", max_length=source.max_length,
                             trust_remote_code=source.trust_remote_code)
        return list(np.asarray(model.predict(inputs, batch_size=8), dtype=np.float32).reshape(-1))

    from optimize.export import input_names, load_torch_model
    model = load_torch_model(source)
    names = input_names(model)
    results: dict[int, np.ndarray] = {}
    # batches of like lengths, as sentence-transformers' encode makes them: the least padding
    by_length = sorted(range(len(inputs)), key=lambda i: len("".join(inputs[i])))
    singles = [i for i in by_length if not isinstance(inputs[i], tuple)]
    pairs = [i for i in by_length if isinstance(inputs[i], tuple)]
    for indices in (singles, pairs):
        for start in range(0, len(indices), 8):
            chunk = indices[start:start + 8]
            texts = [inputs[i] for i in chunk]
            args: tuple[list[str], ...] = (
                ([t[0] for t in texts if isinstance(t, tuple)], [t[1] for t in texts if isinstance(t, tuple)])
                if indices is pairs else ([t for t in texts if isinstance(t, str)],))
            enc = source.tokenizer(*args, padding=True, truncation=True, max_length=source.max_length,
                                   return_tensors="pt")
            with torch.no_grad():
                out = model(**{name: enc[name] for name in names})
            mask = enc["attention_mask"].numpy()
            if source.task == "sequence-classification":
                rows = list(activate(out.logits.numpy(), source.facts.score_activation or "softmax"))
            else:
                probs = activate(out.logits.numpy(), "softmax")  # what the server answers from
                rows = [probs[row, : int(mask[row].sum())] for row in range(len(chunk))]
            results.update(zip(chunk, rows))
    return [results[i] for i in range(len(inputs))]


def m3_reference(source: SourceModel, inputs: list[TextInput]) -> Outputs:
    """bge-m3's reference formulas over the transformers encoder: the first token's hidden state normalized; relu
    of sparse_linear per token, each token id's largest weight, the cls, eos, pad and unk ids left out; and
    colbert_linear of every token but the first, masked, normalized."""
    import torch

    from optimize.export import load_torch_model
    from optimize.source import m3_heads

    assert source.facts.hybrid is not None
    unused = set(source.facts.hybrid.unused_ids)
    model, heads = load_torch_model(source), m3_heads(source.path)
    answers: list[HybridAnswer] = []
    for start in range(0, len(inputs), 8):
        texts = [t for t in inputs[start:start + 8] if isinstance(t, str)]
        batch = source.tokenizer(texts, padding=True, truncation=True, max_length=source.max_length,
                                 return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
            dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1)
            weights = torch.relu(heads["sparse_linear"](hidden)).squeeze(-1)
            mask = batch["attention_mask"]
            colbert = heads["colbert_linear"](hidden[:, 1:]) * mask[:, 1:, None].float()
            colbert = torch.nn.functional.normalize(colbert, dim=-1)
        for row in range(len(texts)):
            best: dict[int, float] = {}
            for token, weight in zip(batch["input_ids"][row].tolist(), weights[row].tolist()):
                if token not in unused and weight > 0:
                    best[token] = max(best.get(token, 0.0), weight)
            ids = sorted(best)
            answers.append(HybridAnswer(dense[row].numpy(), np.asarray([ids, [best[i] for i in ids]], np.float64),
                                        colbert[row, :int(mask[row].sum()) - 1].numpy()))
    return answers


def causal_reranker_scores(source: SourceModel, inputs: list[TextInput]) -> Outputs:
    """A causal reranker's model-card formula: prefix + filled-in template (cut to what the prompt leaves of the
    maximum length) + suffix, padded on the left, and P(true token) against the false one at the last position."""
    import torch

    from optimize.export import load_torch_model

    reranker, tokenizer = source.facts.reranker, source.tokenizer
    assert reranker is not None
    model = load_torch_model(source)
    prefix = tokenizer.encode(reranker.prefix, add_special_tokens=False)
    suffix = tokenizer.encode(reranker.suffix, add_special_tokens=False)
    scores: list[np.ndarray] = []
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        for start in range(0, len(inputs), 8):
            texts = [reranker.template.format(instruction=reranker.instruction, query=pair[0], document=pair[1])
                     for pair in inputs[start:start + 8] if isinstance(pair, tuple)]
            middle = tokenizer(texts, padding=False, truncation="longest_first", return_attention_mask=False,
                               max_length=source.max_length - len(prefix) - len(suffix))["input_ids"]
            batch = tokenizer.pad({"input_ids": [prefix + ids + suffix for ids in middle]}, padding=True,
                                  return_tensors="pt")
            with torch.no_grad():
                last = model(**batch).logits[:, -1, :]
            pair = torch.stack([last[:, reranker.false_token_id], last[:, reranker.true_token_id]], dim=1)
            scores.extend(torch.log_softmax(pair.float(), dim=1)[:, 1].exp().numpy())
    finally:
        tokenizer.padding_side = padding_side
    return [np.float32(score) for score in scores]


def sentence_transformer(source: SourceModel) -> Any:
    """The model as sentence-transformers runs it: its own modules, or (without them) the transformers model
    followed by the Pooling module the artifact declares."""
    import warnings

    from sentence_transformers import SentenceTransformer

    if source.sentence_transformers and any(m.kind == "Pooling" for m in read_modules(source.path)):
        return SentenceTransformer(str(source.path), device="cpu", trust_remote_code=source.trust_remote_code)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # sentence-transformers 3 to 5 name them only here
        from sentence_transformers.models import Pooling, Transformer  # type: ignore[import-not-found]
    backbone = Transformer(str(source.path), **backbone_options(source))
    modes = source.facts.pooling.split("+")  # type: ignore[union-attr]  # feature-extraction always has one
    pooling = Pooling(backbone.get_embedding_dimension(), pooling_mode=modes[0] if len(modes) == 1 else tuple(modes))
    return SentenceTransformer(modules=[backbone, pooling], device="cpu")


def backbone_options(source: SourceModel) -> dict[str, Any]:
    """A sentence-transformers Transformer module's arguments for a bare transformers directory."""
    trust = {"trust_remote_code": source.trust_remote_code}
    return {"max_seq_length": source.max_length, "model_args": trust, "config_args": trust}


def sparse_encoder(source: SourceModel) -> Any:
    """The model as sentence-transformers' SparseEncoder runs it: its own modules, or (a bare masked-LM) its
    logits through SpladePooling with the artifact's settings."""
    import warnings

    from sentence_transformers import SparseEncoder

    if source.sentence_transformers:
        return SparseEncoder(str(source.path), device="cpu", trust_remote_code=source.trust_remote_code)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # sentence-transformers 5 names them only here
        from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling  # type: ignore[import-not-found]
    backbone = MLMTransformer(str(source.path), **backbone_options(source))
    return SparseEncoder(modules=[backbone, SpladePooling(**(source.facts.splade or {}))], device="cpu")
