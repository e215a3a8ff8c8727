"""What the source model directory says about itself: task facts, tokenizer, limits."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infinity.manifest import (
    EXPANSIONS,
    POOLINGS,
    ROLES,
    SPLADE,
    SPLADE_SETTINGS,
    TASKS,
    Hybrid,
    MultiVector,
    QueryExpansion,
    Reranker,
    TaskFacts,
)

SANE_MAX_LENGTH = 100_000
# sentence-transformers module classes the exported graph reproduces, by the last part of their type name
MODULES = ("Transformer", "Pooling", "Dense", "Normalize", "MLMTransformer", "SpladePooling", "MultiVectorMask")
BACKBONES = ("Transformer", "MLMTransformer")  # a Transformer whose task is fill-mask is read as MLMTransformer
# how a model card names its hub id in its usage example
CARD_ID = re.compile(r"""(?:SentenceTransformer|CrossEncoder|from_pretrained)\(\s*["']([\w.-]+/[\w.-]+)["']""")


@dataclass(frozen=True)
class Module:
    """One entry of a sentence-transformers modules.json."""
    kind: str   # one of MODULES
    path: Path  # its folder


@dataclass
class SourceModel:
    path: Path
    task: str
    config: Any              # transformers PretrainedConfig
    tokenizer: Any           # transformers fast tokenizer
    facts: TaskFacts
    max_length: int
    sentence_transformers: bool
    model_id: str | None = None  # the hub id, where known
    head: list[Module] = field(default_factory=list)  # modules after pooling that the graph includes
    trust_remote_code: bool = False  # the model's own code (config.json's auto_map) is what runs

    @property
    def model_type(self) -> str:
        return str(self.config.model_type)


def resolve_path(model: str) -> Path:
    """A local directory, or a hub id already in the local cache (never downloads when offline)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    from huggingface_hub import snapshot_download
    try:
        return Path(snapshot_download(model, local_files_only=os.environ.get("HF_HUB_OFFLINE") == "1"))
    except Exception as exc:  # the hub client raises many unrelated types
        raise FileNotFoundError(f"{model!r} is neither a local model directory nor a reachable hub id "
                                f"({exc})") from None


def load_source(model: str, task: str, pooling: str | None = None, model_id: str | None = None,
                trust_remote_code: bool = False, reranker: str | dict[str, str] | None = None) -> SourceModel:
    """`reranker`: a causal LM's ranking prompt, by name (RERANKERS), as a JSON file, or as its fields."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    path = resolve_path(model)
    remote = runs_remote_code(path, trust_remote_code)
    config = AutoConfig.from_pretrained(path, trust_remote_code=remote)
    if getattr(config, "is_encoder_decoder", False):  # before anything else: no pooling or head would help
        raise ValueError(f"model type {config.model_type!r} is an encoder-decoder; multiverse exports encoder "
                         "models (see docs/models.md for the supported families)")
    tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True, trust_remote_code=remote)
    if not tokenizer.is_fast:
        raise ValueError(f"{model}: no fast tokenizer available; the server needs tokenizer.json")
    st_config = _read_json(path / "sentence_bert_config.json")
    is_st = (path / "modules.json").is_file()
    max_length = _max_length(config, tokenizer, st_config)
    modules = read_modules(path) if is_st else []
    if task == "feature-extraction":
        facts, head = _embedding_facts(path, config, modules, pooling)
    elif task == "sparse-embedding":
        facts, head = _sparse_facts(path, config, modules, pooling), []
    elif pooling is not None:
        raise ValueError(f"--pooling is for feature-extraction and sparse-embedding, not {task}")
    elif task == "multi-vector":
        facts, head = _multi_vector_facts(path, config, modules, tokenizer)
    elif task == "hybrid-embedding":
        facts, head = _hybrid_facts(path, config, modules, tokenizer), []
    elif task == "ranking" and _causal(config):
        facts, head = TaskFacts(score_activation="sigmoid", reranker=reranker_prompt(path, tokenizer, reranker)), []
    else:
        facts, head = _task_facts(task, config), []
    if reranker is not None and facts.reranker is None:
        raise ValueError("--reranker-template is for ranking with a causal language model (a *ForCausalLM "
                         f"checkpoint); {path.name} is a {task} {config.model_type} model")
    return SourceModel(path, task, config, tokenizer, facts, max_length, is_st,
                       model_id=model_id or hub_id(model, path), head=head, trust_remote_code=remote)


# a checkpoint's head, as config.json's architectures name it: the task it serves where only one fits
HEAD_TASKS = {"ForTokenClassification": ("token-classification",),
              "ForSequenceClassification": ("sequence-classification", "ranking")}


def detect_task(model: str, pooling: str | None = None) -> tuple[str, str]:
    """(task, why) where the directory says which: sentence-transformers' config and modules.json name the kind of
    model (a CrossEncoder: ranking with one score, else sequence-classification; SpladePooling: sparse-embedding;
    MultiVectorMask: multi-vector; else feature-extraction), --pooling splade asks for sparse vectors, a
    token-classification head serves that task. A classifier head alone is a sequence classifier or a
    cross-encoder: refused in one line naming both."""
    path = resolve_path(model)
    if pooling == SPLADE:
        return "sparse-embedding", f"--pooling {SPLADE}"
    saved_as = _read_json(path / "config_sentence_transformers.json").get("model_type")
    if saved_as == "CrossEncoder":
        labels = len(_read_json(path / "config.json").get("id2label") or {"0": ""})
        return ("ranking", "its sentence-transformers config (a CrossEncoder with one score)") if labels == 1 else (
            "sequence-classification", f"its sentence-transformers config (a CrossEncoder with {labels} labels)")
    if (path / "modules.json").is_file():
        kinds = {m.kind for m in read_modules(path)}
        if kinds & {"SpladePooling", "MLMTransformer"}:
            return "sparse-embedding", "its modules.json (a SparseEncoder: SpladePooling)"
        if "MultiVectorMask" in kinds:
            return "multi-vector", "its modules.json (a MultiVectorEncoder: MultiVectorMask)"
        return "feature-extraction", "its modules.json (a SentenceTransformer)"
    architectures = _read_json(path / "config.json").get("architectures") or []
    for suffix, tasks in HEAD_TASKS.items():
        heads = [name for name in architectures if str(name).endswith(suffix)]
        if heads and len(tasks) == 1:
            return tasks[0], f"its config.json ({heads[0]})"
        if heads:
            raise ValueError(f"{path.name} is a {heads[0]} checkpoint: pass --task {' or --task '.join(tasks)} "
                             "(a cross-encoder that scores query-document pairs is ranking)")
    return "feature-extraction", "the default"


def hub_id(model: str, path: Path) -> str | None:
    """The model's hub id: as given, from its place in the hub cache, or from its model card's usage example."""
    if not Path(model).expanduser().is_dir() and re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        return model
    cached = next((part for part in path.parts if part.startswith("models--")), None)
    if cached:
        return cached.removeprefix("models--").replace("--", "/", 1)
    card = path / "README.md"
    found = CARD_ID.search(card.read_text(encoding="utf-8", errors="replace")) if card.is_file() else None
    return found.group(1) if found else None


def read_modules(path: Path) -> list[Module]:
    """modules.json, each entry checked: a module the graph cannot reproduce is refused by name."""
    modules = []
    for entry in json.loads((path / "modules.json").read_text(encoding="utf-8")):
        kind = str(entry.get("type", "")).rpartition(".")[2]
        if kind not in MODULES:
            raise ValueError(f"{path / 'modules.json'} lists the module {entry.get('type')!r}, which cannot be "
                             f"exported (known: {', '.join(MODULES)})")
        folder = path / entry.get("path", "")
        task = _read_json(folder / "sentence_bert_config.json").get("transformer_task")
        if kind == "Transformer" and task == "fill-mask":
            kind = "MLMTransformer"
        modules.append(Module(kind, folder))
    if not modules or modules[0].kind not in BACKBONES or any(m.kind in BACKBONES for m in modules[1:]):
        raise ValueError(f"{path / 'modules.json'} must start with its one Transformer module")
    return modules


def runs_remote_code(path: Path, trust_remote_code: bool) -> bool:
    """Whether the model's own code must run: only when its config maps to code (auto_map) for an architecture
    transformers does not implement itself; then only with the user's consent."""
    config = _read_json(path / "config.json")
    auto_map = config.get("auto_map")
    if not auto_map or _native(config):
        return False
    if not trust_remote_code:
        architectures = ", ".join(config.get("architectures") or []) or config.get("model_type", "?")
        raise ValueError(f"{path.name}: config.json maps the model to its own code ({architectures}, auto_map), which "
                         "transformers does not implement natively; pass --trust-remote-code to run that code")
    return True


def _native(config: dict[str, Any]) -> bool:
    import transformers
    from transformers import CONFIG_MAPPING

    architectures = config.get("architectures") or []
    return (config.get("model_type") in CONFIG_MAPPING and bool(architectures)
            and all(hasattr(transformers, name) for name in architectures))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _max_length(config: Any, tokenizer: Any, st_config: dict[str, Any]) -> int:
    candidates = [getattr(config, "max_position_embeddings", None) or SANE_MAX_LENGTH]
    if config.model_type in ("roberta", "xlm-roberta", "camembert", "mpnet"):
        candidates[0] -= 2  # positions start after the padding index
    if 0 < tokenizer.model_max_length < SANE_MAX_LENGTH:
        candidates.append(tokenizer.model_max_length)
    if st_config.get("max_seq_length"):
        candidates.append(int(st_config["max_seq_length"]))
    return int(min(candidates))


def _embedding_facts(path: Path, config: Any, modules: list[Module],
                     flag: str | None) -> tuple[TaskFacts, list[Module]]:
    """Pooling as the model declares it (or as --pooling says where it declares none), and the modules after it."""
    kinds = [m.kind for m in modules]
    if "MultiVectorMask" in kinds:
        raise ValueError(f"{path.name} is a multi-vector (ColBERT) model: it answers a vector per token; pass "
                         "--task multi-vector")
    if "SpladePooling" in kinds or "MLMTransformer" in kinds or flag == SPLADE:
        raise ValueError(f"{path.name} is a masked-LM with SPLADE pooling: its output is sparse, one weight per "
                         "vocabulary entry; pass --task sparse-embedding")
    if flag is not None and any(mode not in POOLINGS for mode in flag.split("+")):
        raise ValueError(f"--pooling {flag!r}: use one of {', '.join(POOLINGS)} (or several joined by +)")
    if "Pooling" not in kinds:
        if flag is None:
            raise ValueError(f"{path.name} declares no pooling (no sentence-transformers Pooling module); pass "
                             f"--pooling with one of {', '.join(POOLINGS)}, as its model card says")
        if modules[1:]:
            raise ValueError(f"{path.name}: modules after the Transformer but no Pooling module "
                             f"({', '.join(kinds[1:])})")
        pooling, after = flag, []
    else:
        at = kinds.index("Pooling")
        pooling, include_prompt = pooling_mode(_read_json(modules[at].path / "config.json"))
        if flag is not None and flag != pooling:
            raise ValueError(f"--pooling {flag} contradicts the model's own Pooling config ({pooling})")
        if not include_prompt:
            raise ValueError("the Pooling config excludes prompt tokens (include_prompt=false), which the server "
                             "cannot reproduce")
        if any(kind != "Transformer" for kind in kinds[:at]):
            raise ValueError(f"{path.name}: a module before Pooling cannot be exported ({', '.join(kinds[:at])})")
        after = modules[at + 1:]
    if any(m.kind == "Pooling" for m in after):
        raise ValueError(f"{path.name}: more than one Pooling module")
    normalize = bool(after) and after[-1].kind == "Normalize"
    head = after[:-1] if normalize else after
    prompts, default = _prompts(path)
    facts = TaskFacts(pooling=pooling, pooled_in_graph=bool(head), normalize=normalize,
                      embedding_dim=_embedding_dim(config, pooling, head), prompts=prompts,
                      default_prompt_name=default)
    return facts, head


def _prompts(path: Path) -> tuple[dict[str, str], str | None]:
    """The model's named prompts and its default prompt's name, from config_sentence_transformers.json."""
    st = _read_json(path / "config_sentence_transformers.json")
    prompts = {str(k): str(v) for k, v in (st.get("prompts") or {}).items()}
    default = st.get("default_prompt_name") or None
    if default is not None and default not in prompts:
        raise ValueError(f"default_prompt_name {default!r} is not one of the model's prompts ({', '.join(prompts)})")
    return prompts, default


SPLADE_KEYS = {*SPLADE_SETTINGS, "embedding_dimension", "word_embedding_dimension", "chunk_size"}


def _sparse_facts(path: Path, config: Any, modules: list[Module], flag: str | None) -> TaskFacts:
    """SPLADE over a masked-LM's logits: a sentence-transformers SparseEncoder's own SpladePooling settings, or
    (for a bare masked-LM directory, with --pooling splade) max pooling over relu."""
    kinds = [m.kind for m in modules]
    if flag is not None and flag != SPLADE:
        raise ValueError(f"--pooling {flag}: sparse-embedding pools with {SPLADE} only")
    if not modules:
        if flag is None:
            raise ValueError(f"{path.name} declares no SPLADE pooling (no sentence-transformers SparseEncoder "
                             f"modules); pass --pooling {SPLADE} to serve its masked-LM logits as SPLADE vectors")
        settings = {key: values[0] for key, values in SPLADE_SETTINGS.items()}
    elif kinds != ["MLMTransformer", "SpladePooling"]:
        raise ValueError(f"{path.name}: sparse-embedding reads a SparseEncoder of a masked-LM Transformer and "
                         f"SpladePooling, not {' + '.join(kinds)}")
    else:
        pooling = _read_json(modules[1].path / "config.json")
        unknown = sorted(set(pooling) - SPLADE_KEYS)
        if unknown:
            raise ValueError(f"the SpladePooling config has keys this optimizer does not know: {', '.join(unknown)}")
        settings = {key: str(pooling.get(key, values[0])) for key, values in SPLADE_SETTINGS.items()}
        bad = [f"{key}={value}" for key, value in settings.items() if value not in SPLADE_SETTINGS[key]]
        if bad:
            raise ValueError(f"the SpladePooling config has {', '.join(bad)}, which this optimizer does not know")
    prompts, default = _prompts(path)
    return TaskFacts(pooling=SPLADE, splade=settings, pooled_in_graph=True, embedding_dim=int(config.vocab_size),
                     prompts=prompts, default_prompt_name=default)


MULTI_VECTOR_KEYS = {"skiplist_words", "skiplist_tasks", "keep_only_token_ids"}
EXPANSION_KEYS = {"strategy", "attend", "token", "length"}
DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # the names MultiVectorEncoder.encode_document looks for


def _multi_vector_facts(path: Path, config: Any, modules: list[Module],
                        tokenizer: Any) -> tuple[TaskFacts, list[Module]]:
    """A sentence-transformers MultiVectorEncoder: its Transformer's per-role lengths and query expansion, the
    Dense projections and Normalize the graph includes, and its MultiVectorMask's skiplist, which the server
    applies."""
    kinds = [m.kind for m in modules]
    st = _read_json(path / "config_sentence_transformers.json")
    if st.get("model_type") == "ColBERT":
        raise ValueError(f"{path.name} is a PyLate ColBERT save; load it with sentence-transformers' "
                         "MultiVectorEncoder and save it again (model.save(dir)), then optimize that directory")
    if "MultiVectorMask" not in kinds:
        raise ValueError(f"{path.name} is not a multi-vector model (no sentence-transformers MultiVectorEncoder "
                         "with a MultiVectorMask module)")
    if kinds[0] != "Transformer" or any(kind not in ("Dense", "MultiVectorMask", "Normalize") for kind in kinds[1:]):
        raise ValueError(f"{path.name}: a multi-vector model of a Transformer, Dense, MultiVectorMask and Normalize "
                         f"modules can be exported, not {' + '.join(kinds)}")
    backbone = _read_json(modules[0].path / "sentence_bert_config.json")
    mask = _read_json(modules[kinds.index("MultiVectorMask")].path / "config.json")
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
    prompts = {role: text for role, text in (("query", declared.get("query")), ("document", document)) if text}
    dense = [m for m in head if m.kind == "Dense"]
    dim = int(_read_json(dense[-1].path / "config.json")["out_features"]) if dense else _hidden_size(config)
    rules = MultiVector(skiplist_ids=_skiplist_ids(tokenizer, mask.get("skiplist_words") or []),
                        skiplist_roles=roles, query_length=backbone.get("query_length"),
                        document_length=backbone.get("document_length"),
                        expansion=_expansion(backbone.get("query_expansion"), tokenizer))
    facts = TaskFacts(normalize=bool(head) and head[-1].kind == "Normalize", embedding_dim=dim, prompts=prompts,
                      multi_vector=rules)
    return facts, head


def _skiplist_ids(tokenizer: Any, words: list[str]) -> list[int]:
    """The skiplist's words as token ids; a word that is not one token is left out (it would drop every unknown
    token), as sentence-transformers leaves it out."""
    ids = []
    for word in words:
        token_id = tokenizer.convert_tokens_to_ids(word)
        if token_id is not None and (token_id != tokenizer.unk_token_id or word == tokenizer.unk_token):
            ids.append(int(token_id))
    return sorted(set(ids))


def _expansion(config: dict[str, Any] | None, tokenizer: Any) -> QueryExpansion | None:
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


M3_HEADS = ("colbert_linear", "sparse_linear")  # bge-m3's extra weight files, beside the encoder's


def m3_heads(path: Path) -> dict[str, Any]:
    """bge-m3's ColBERT and sparse heads as torch Linear layers, from their weight files."""
    import torch

    heads = {}
    for name in M3_HEADS:
        state = torch.load(path / f"{name}.pt", map_location="cpu", weights_only=True)
        out_features, in_features = state["weight"].shape
        layer = torch.nn.Linear(in_features, out_features, bias="bias" in state)
        layer.load_state_dict(state)
        heads[name] = layer.eval()
    return heads


def _hybrid_facts(path: Path, config: Any, modules: list[Module], tokenizer: Any) -> TaskFacts:
    """bge-m3 (FlagEmbedding's M3 layout): the encoder's first token normalized (dense), relu of sparse_linear per
    token (sparse), colbert_linear normalized per token (ColBERT)."""
    missing = [f"{name}.pt" for name in M3_HEADS if not (path / f"{name}.pt").is_file()]
    if missing:
        raise ValueError(f"{path.name} has no {' or '.join(missing)}: hybrid-embedding reads bge-m3's sparse and "
                         "ColBERT heads from those weight files beside the encoder")
    kinds = [m.kind for m in modules]
    if "Pooling" in kinds:
        pooling, _ = pooling_mode(_read_json(modules[kinds.index("Pooling")].path / "config.json"))
        if pooling != "cls":
            raise ValueError(f"{path.name} pools its dense vector by {pooling}; bge-m3's dense vector is its first "
                             "token's, the one hybrid-embedding serves")
    hidden = _hidden_size(config)
    heads = m3_heads(path)
    colbert, sparse = heads["colbert_linear"], heads["sparse_linear"]
    if colbert.in_features != hidden or sparse.in_features != hidden or sparse.out_features != 1:
        raise ValueError(f"{path.name}: colbert_linear.pt and sparse_linear.pt must read the {hidden}-wide hidden "
                         "state, and sparse_linear must give one weight per token")
    unused = sorted({int(i) for i in (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                      tokenizer.unk_token_id) if i is not None})
    prompts, default = _prompts(path)
    return TaskFacts(pooling="cls", normalize=True, embedding_dim=hidden, prompts=prompts,
                     default_prompt_name=default,
                     hybrid=Hybrid(hidden_size=hidden, colbert_dim=colbert.out_features, unused_ids=unused))


# Ranking prompts of causal rerankers, as their model cards give them.
RERANKERS: dict[str, dict[str, str]] = {
    "qwen3": {
        "prefix": "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
                  "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
                  "<|im_start|>user\n",
        "suffix": "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "template": "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
        "instruction": "Given a web search query, retrieve relevant passages that answer the query",
        "true_token": "yes", "false_token": "no"},
}
RERANKER_FIELDS = ("prefix", "suffix", "template", "instruction", "true_token", "false_token")


def _causal(config: Any) -> bool:
    return any(str(name).endswith("ForCausalLM") for name in getattr(config, "architectures", None) or [])


def reranker_prompt(path: Path, tokenizer: Any, given: str | dict[str, str] | None) -> Reranker:
    """A causal reranker's prompt: never guessed, its tokens checked against the tokenizer."""
    if given is None:
        raise ValueError(f"{path.name} is a causal language model: ranking with it needs its prompt; pass "
                         f"--reranker-template with {' or '.join(RERANKERS)} (its model card's prompt) or a JSON file "
                         f"with {', '.join(RERANKER_FIELDS)}")
    if isinstance(given, dict):
        fields = given
    elif given in RERANKERS:
        fields = RERANKERS[given]
    elif Path(given).is_file():
        fields = _read_json(Path(given))
    else:
        raise ValueError(f"--reranker-template {given!r} is neither {' nor '.join(RERANKERS)} nor a JSON file")
    missing = [name for name in RERANKER_FIELDS if not isinstance(fields.get(name), str)]
    if missing:
        raise ValueError(f"the reranker template lacks {', '.join(missing)} (each a string)")
    try:
        fields["template"].format(instruction="", query="", document="")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"the reranker template may name only {{instruction}}, {{query}} and {{document}}: "
                         f"{exc!r}") from None
    ids = []
    for role in ("true_token", "false_token"):
        token_id = tokenizer.convert_tokens_to_ids(fields[role])
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"the reranker's {role} {fields[role]!r} is not one token of {path.name}'s tokenizer")
        ids.append(int(token_id))
    return Reranker(prefix=fields["prefix"], suffix=fields["suffix"], template=fields["template"],
                    instruction=fields["instruction"], true_token=fields["true_token"],
                    false_token=fields["false_token"], true_token_id=ids[0], false_token_id=ids[1])


def _task_facts(task: str, config: Any) -> TaskFacts:
    id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    if task == "ranking":
        if len(id2label) != 1:
            raise ValueError(f"ranking needs a cross-encoder with one output label; this model has {len(id2label)}")
        return TaskFacts(score_activation="sigmoid", id2label=id2label)
    if task == "sequence-classification":
        multi = getattr(config, "problem_type", None) == "multi_label_classification" or len(id2label) == 1
        return TaskFacts(id2label=id2label, score_activation="sigmoid" if multi else "softmax")
    return TaskFacts(id2label=id2label, score_activation="softmax")


LEGACY_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
POOLING_KEYS = {"pooling_mode", "include_prompt", "embedding_dimension", "word_embedding_dimension", *LEGACY_MODES}


def pooling_mode(config: dict[str, Any]) -> tuple[str, bool]:
    """A Pooling config.json, old (one boolean per mode) or new ("pooling_mode"), -> ("a+b", include_prompt)."""
    unknown = sorted(set(config) - POOLING_KEYS)
    if unknown:
        raise ValueError(f"the Pooling config has keys this optimizer does not know: {', '.join(unknown)}")
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in LEGACY_MODES.items() if config.get(key)] or ["mean"]
    else:
        modes = [mode] if isinstance(mode, str) else list(mode)
    bad = [m for m in modes if m not in POOLINGS]
    if bad or not modes:
        raise ValueError(f"unknown pooling mode {bad or modes} in the Pooling config (known: {', '.join(POOLINGS)})")
    return "+".join(modes), bool(config.get("include_prompt", True))


def _embedding_dim(config: Any, pooling: str, head: list[Module]) -> int:
    dense = [m for m in head if m.kind == "Dense"]
    if dense:
        return int(_read_json(dense[-1].path / "config.json")["out_features"])
    return _hidden_size(config) * len(pooling.split("+"))


def _hidden_size(config: Any) -> int:
    return int(getattr(config, "hidden_size", None) or config.dim)
