"""Multi-vector embeddings (ColBERT): a sentence-transformers MultiVectorEncoder's token vectors, against its
encode_document."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from infinity.engine.tokenization import Encoded, TextInput
from infinity.manifest import EXPANSIONS, ROLES, MultiVector, QueryExpansion, TaskFacts, TaskName
from optimize.checkpoint import Checkpoint, Module, dense_width, hidden_size, read_json
from optimize.measure import agreement
from optimize.measure.agreement import Outputs
from optimize.tasks.base import OptimizerTask, SourceModel, with_modules

if TYPE_CHECKING:
    pass

MULTI_VECTOR_KEYS = {"skiplist_words", "skiplist_tasks", "keep_only_token_ids"}
EXPANSION_KEYS = {"strategy", "attend", "token", "length"}
DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # the names MultiVectorEncoder.encode_document looks for


class MultiVectorTask(OptimizerTask):
    name = TaskName.MULTI_VECTOR
    metrics = agreement.MULTI_VECTOR_METRICS
    thresholds = {"token_cosine_mean": 0.99, "maxsim_spearman_mean": 0.95}
    continuous = True

    def facts(self, checkpoint: Checkpoint, pooling: str | None,
              reranker: str | dict[str, str] | None) -> tuple[TaskFacts, list[Module]]:
        """A sentence-transformers MultiVectorEncoder: its Transformer's per-role lengths and query expansion, the
        Dense projections and Normalize the graph includes, and its MultiVectorMask's skiplist, which the server
        applies."""
        path, modules, tokenizer = checkpoint.path, checkpoint.modules, checkpoint.tokenizer
        kinds = [m.kind for m in modules]
        st = read_json(path / "config_sentence_transformers.json")
        if st.get("model_type") == "ColBERT":
            raise ValueError(f"{path.name} is a PyLate ColBERT save; load it with sentence-transformers' "
                             "MultiVectorEncoder and save it again (model.save(dir)), then optimize that directory")
        if "MultiVectorMask" not in kinds:
            raise ValueError(f"{path.name} is not a multi-vector model (no sentence-transformers MultiVectorEncoder "
                             "with a MultiVectorMask module)")
        if kinds[0] != "Transformer" or any(kind not in ("Dense", "MultiVectorMask", "Normalize")
                                            for kind in kinds[1:]):
            raise ValueError(f"{path.name}: a multi-vector model of a Transformer, Dense, MultiVectorMask and "
                             f"Normalize modules can be exported, not {' + '.join(kinds)}")
        backbone = read_json(modules[0].path / "sentence_bert_config.json")
        mask = read_json(modules[kinds.index("MultiVectorMask")].path / "config.json")
        unknown = sorted(set(mask) - MULTI_VECTOR_KEYS)
        if unknown:
            raise ValueError(f"the MultiVectorMask config has keys this optimizer does not know: {', '.join(unknown)}")
        if mask.get("keep_only_token_ids"):
            raise ValueError("the MultiVectorMask keeps only some token ids (keep_only_token_ids, for image "
                             "documents), which a text server cannot reproduce")
        roles = mask.get("skiplist_tasks") or ["document"]
        roles = [roles] if isinstance(roles, str) else list(roles)
        if any(role not in ROLES for role in roles):
            raise ValueError(f"the MultiVectorMask skiplist applies to {roles}; the server knows {', '.join(ROLES)}")
        head = [m for m in modules[1:] if m.kind != "MultiVectorMask"]
        if any(m.kind == "Normalize" for m in head[:-1]):
            raise ValueError(f"{path.name}: Normalize before another module cannot be exported")
        declared = {str(k): str(v) for k, v in (st.get("prompts") or {}).items()}
        document = next((declared[name] for name in DOCUMENT_PROMPTS if name in declared), None)
        named = {role: text for role, text in (("query", declared.get("query")), ("document", document)) if text}
        dense = [m for m in head if m.kind == "Dense"]
        dim = dense_width(dense) if dense else hidden_size(checkpoint.config)
        rules = MultiVector(skiplist_ids=skiplist_ids(tokenizer, mask.get("skiplist_words") or []),
                            skiplist_roles=roles, query_length=backbone.get("query_length"),
                            document_length=backbone.get("document_length"),
                            expansion=expansion(backbone.get("query_expansion"), tokenizer))
        facts = TaskFacts(normalize=bool(head) and head[-1].kind == "Normalize", embedding_dim=dim, prompts=named,
                          multi_vector=rules)
        return facts, head

    def graph(self, model: Any, source: SourceModel) -> tuple[Any, str]:
        """The model with its MultiVectorEncoder's Dense projections and Normalize: (attention mask, inputs) ->
        batch x tokens x dim. Which tokens an answer keeps is the server's work."""
        from sentence_transformers import MultiVectorEncoder

        encoder = MultiVectorEncoder(str(source.path), device="cpu", trust_remote_code=source.trust_remote_code)
        modules = [module for module in list(encoder)[1:] if type(module).__name__ in ("Dense", "Normalize")]
        return with_modules(model, modules, "token_embeddings"), "token_embeddings"

    def per_token_output(self, source: SourceModel) -> bool:
        return True

    def reference(self, source: SourceModel, inputs: list[TextInput]) -> Outputs:
        from sentence_transformers import MultiVectorEncoder

        encoder = MultiVectorEncoder(str(source.path), device="cpu", trust_remote_code=source.trust_remote_code)
        return [vectors.float().numpy() for vectors in encoder.encode_document(inputs, batch_size=8)]

    def reference_name(self, source: SourceModel) -> str:
        return "sentence-transformers MultiVectorEncoder.encode_document, PyTorch FP32"

    def measure(self, reference: Outputs, candidate: Outputs, inputs: list[TextInput]) -> dict[str, float]:
        return agreement.multi_vector(reference, candidate)

    def rows(self, vectors: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(vectors)

    def served_values(self, answer: Any, row: np.ndarray, item: Encoded) -> Any:
        return answer[0]


def skiplist_ids(tokenizer: Any, words: list[str]) -> list[int]:
    """The skiplist's words as token ids; a word that is not one token is left out (it would drop every unknown
    token), as sentence-transformers leaves it out."""
    ids = []
    for word in words:
        token_id = tokenizer.convert_tokens_to_ids(word)
        if token_id is not None and (token_id != tokenizer.unk_token_id or word == tokenizer.unk_token):
            ids.append(int(token_id))
    return sorted(set(ids))


def expansion(config: dict[str, Any] | None, tokenizer: Any) -> QueryExpansion | None:  # JSON as read
    if not config:
        return None
    unknown = sorted(set(config) - EXPANSION_KEYS)
    if unknown:
        raise ValueError(f"the query_expansion config has keys this optimizer does not know: {', '.join(unknown)}")
    strategy, length = config.get("strategy"), config.get("length")
    if strategy not in EXPANSIONS or not isinstance(length, int) or length < 1:
        raise ValueError(f"query_expansion needs a strategy ({', '.join(EXPANSIONS)}) and a length of at least 1, "
                         f"not {strategy!r} and {length!r}")
    token = config.get("token")
    token_id = tokenizer.convert_tokens_to_ids(token) if token is not None else (
        tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.eos_token_id)
    if token_id is None:
        raise ValueError("query_expansion names no token, and the tokenizer has neither a mask nor an end token")
    return QueryExpansion(strategy=strategy, attend=bool(config.get("attend", False)), token_id=int(token_id),
                          length=length)
