"""Load: what the source model directory says about itself (its task's facts, tokenizer, limits), and which task it
is where it says so; its tokenizer written as the artifact carries it."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from infinity.manifest import SPLADE, Precision, TaskName
from optimize.checkpoint import Checkpoint, read_json, read_modules
from optimize.options import Plan
from optimize.tasks import task_for
from optimize.tasks.base import SourceModel

SANE_MAX_LENGTH = 100_000
# how a model card names its hub id in its usage example
CARD_ID = re.compile(r"""(?:SentenceTransformer|CrossEncoder|from_pretrained)\(\s*["']([\w.-]+/[\w.-]+)["']""")


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


def load(plan: Plan, tokenizer: Path) -> tuple[SourceModel, list[str]]:
    """The source model, and its tokenizer written for the artifact into `tokenizer`, with the extra files it
    names."""
    options = plan.options
    source = load_source(options.model, plan.task.name, options.pooling, options.model_id, options.trust_remote_code,
                         options.reranker_template)
    if source.facts.reranker is not None and plan.precision == Precision.INT8:
        raise ValueError("INT8 is not built for causal rerankers yet: pass --precision fp32")
    source.tokenizer.save_pretrained(str(tokenizer))
    # the fast tokenizer's own file, as the server loads it (save_pretrained's may differ)
    source.tokenizer.backend_tokenizer.save(str(tokenizer / "tokenizer.json"))
    extra = [name for name in ("tokenizer_config.json", "special_tokens_map.json") if (tokenizer / name).is_file()]
    return source, extra


def load_source(model: str, task: str, pooling: str | None = None, model_id: str | None = None,
                trust_remote_code: bool = False, reranker: str | dict[str, str] | None = None) -> SourceModel:
    """`reranker`: a causal LM's ranking prompt, by name (tasks/ranking.py: RERANKERS), as a JSON file, or as its
    fields."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    optimizer_task = task_for(task)
    path = resolve_path(model)
    remote = runs_remote_code(path, trust_remote_code)
    config = AutoConfig.from_pretrained(path, trust_remote_code=remote)
    if getattr(config, "is_encoder_decoder", False):  # before anything else: no pooling or head would help
        raise ValueError(f"model type {config.model_type!r} is an encoder-decoder; multiverse exports encoder "
                         "models (see docs/models.md for the supported families)")
    tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True, trust_remote_code=remote)
    if not tokenizer.is_fast:
        raise ValueError(f"{model}: no fast tokenizer available; the server needs tokenizer.json")
    st_config = read_json(path / "sentence_bert_config.json")
    is_st = (path / "modules.json").is_file()
    max_length = _max_length(config, tokenizer, st_config)
    modules = read_modules(path) if is_st else []
    if pooling is not None and not optimizer_task.takes_pooling:
        raise ValueError(f"--pooling is for feature-extraction and sparse-embedding, not {task}")
    facts, head = optimizer_task.facts(Checkpoint(path, config, tokenizer, modules), pooling, reranker)
    if reranker is not None and facts.reranker is None:
        raise ValueError("--reranker-template is for ranking with a causal language model (a *ForCausalLM "
                         f"checkpoint); {path.name} is a {task} {config.model_type} model")
    return SourceModel(path, optimizer_task, config, tokenizer, facts, max_length, is_st,
                       model_id=model_id or hub_id(model, path), head=head, trust_remote_code=remote)


# a checkpoint's head, as config.json's architectures name it: the task it serves where only one fits
HEAD_TASKS = {"ForTokenClassification": (TaskName.TOKEN_CLASSIFICATION,),
              "ForSequenceClassification": (TaskName.SEQUENCE_CLASSIFICATION, TaskName.RANKING)}


def detect_task(model: str, pooling: str | None = None) -> tuple[TaskName, str]:
    """(task, why) where the directory says which: sentence-transformers' config and modules.json name the kind of
    model (a CrossEncoder: ranking with one score, else sequence-classification; SpladePooling: sparse-embedding;
    MultiVectorMask: multi-vector; else feature-extraction), --pooling splade asks for sparse vectors, a
    token-classification head serves that task. A classifier head alone is a sequence classifier or a
    cross-encoder: refused in one line naming both."""
    path = resolve_path(model)
    if pooling == SPLADE:
        return TaskName.SPARSE_EMBEDDING, f"--pooling {SPLADE}"
    saved_as = read_json(path / "config_sentence_transformers.json").get("model_type")
    if saved_as == "CrossEncoder":
        labels = len(read_json(path / "config.json").get("id2label") or {"0": ""})
        return (TaskName.RANKING, "its sentence-transformers config (a CrossEncoder with one score)") if labels == 1 \
            else (TaskName.SEQUENCE_CLASSIFICATION, f"its sentence-transformers config (a CrossEncoder with {labels} "
                  "labels)")
    if (path / "modules.json").is_file():
        kinds = {m.kind for m in read_modules(path)}
        if kinds & {"SpladePooling", "MLMTransformer"}:
            return TaskName.SPARSE_EMBEDDING, "its modules.json (a SparseEncoder: SpladePooling)"
        if "MultiVectorMask" in kinds:
            return TaskName.MULTI_VECTOR, "its modules.json (a MultiVectorEncoder: MultiVectorMask)"
        return TaskName.FEATURE_EXTRACTION, "its modules.json (a SentenceTransformer)"
    architectures = read_json(path / "config.json").get("architectures") or []
    for suffix, tasks in HEAD_TASKS.items():
        heads = [name for name in architectures if str(name).endswith(suffix)]
        if heads and len(tasks) == 1:
            return tasks[0], f"its config.json ({heads[0]})"
        if heads:
            raise ValueError(f"{path.name} is a {heads[0]} checkpoint: pass --task {' or --task '.join(tasks)} "
                             "(a cross-encoder that scores query-document pairs is ranking)")
    return TaskName.FEATURE_EXTRACTION, "the default"


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


def runs_remote_code(path: Path, trust_remote_code: bool) -> bool:
    """Whether the model's own code must run: only when its config maps to code (auto_map) for an architecture
    transformers does not implement itself; then only with the user's consent."""
    config = read_json(path / "config.json")
    auto_map = config.get("auto_map")
    if not auto_map or _native(config):
        return False
    if not trust_remote_code:
        architectures = ", ".join(config.get("architectures") or []) or config.get("model_type", "?")
        raise ValueError(f"{path.name}: config.json maps the model to its own code ({architectures}, auto_map), which "
                         "transformers does not implement natively; pass --trust-remote-code to run that code")
    return True


def _native(config: dict[str, Any]) -> bool:  # config.json as read
    import transformers
    from transformers import CONFIG_MAPPING

    architectures = config.get("architectures") or []
    return (config.get("model_type") in CONFIG_MAPPING and bool(architectures)
            and all(hasattr(transformers, name) for name in architectures))


def _max_length(config: Any, tokenizer: Any, st_config: dict[str, Any]) -> int:  # st_config: JSON as read
    candidates = [getattr(config, "max_position_embeddings", None) or SANE_MAX_LENGTH]
    if config.model_type in ("roberta", "xlm-roberta", "camembert", "mpnet"):
        candidates[0] -= 2  # positions start after the padding index
    if 0 < tokenizer.model_max_length < SANE_MAX_LENGTH:
        candidates.append(tokenizer.model_max_length)
    if st_config.get("max_seq_length"):
        candidates.append(int(st_config["max_seq_length"]))
    return int(min(candidates))
