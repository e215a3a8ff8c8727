"""What the source model directory says about itself: task facts, tokenizer, limits."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infinity.manifest import TASKS, TaskFacts

SANE_MAX_LENGTH = 100_000


@dataclass
class SourceModel:
    path: Path
    task: str
    config: Any              # transformers PretrainedConfig
    tokenizer: Any           # transformers fast tokenizer
    facts: TaskFacts
    max_length: int
    sentence_transformers: bool
    trust_remote_code: bool = False  # the model's own code (config.json's auto_map) is what runs

    @property
    def model_type(self) -> str:
        return self.config.model_type


def resolve_path(model: str) -> Path:
    """A local directory, or a hub id already in the local cache (never downloads when offline)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    from huggingface_hub import snapshot_download
    try:
        return Path(snapshot_download(model, local_files_only=os.environ.get("HF_HUB_OFFLINE") == "1"))
    except Exception as exc:  # the hub client raises many unrelated types
        raise FileNotFoundError(f"{model!r} is neither a local model directory nor a reachable hub id ({exc})") from None


def load_source(model: str, task: str, trust_remote_code: bool = False) -> SourceModel:
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    path = resolve_path(model)
    remote = runs_remote_code(path, trust_remote_code)
    config = AutoConfig.from_pretrained(path, trust_remote_code=remote)
    tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True, trust_remote_code=remote)
    if not tokenizer.is_fast:
        raise ValueError(f"{model}: no fast tokenizer available; the server needs tokenizer.json")
    st_config = _read_json(path / "sentence_bert_config.json")
    is_st = (path / "modules.json").is_file()
    max_length = _max_length(config, tokenizer, st_config)
    facts = _task_facts(path, task, config, is_st)
    return SourceModel(path, task, config, tokenizer, facts, max_length, is_st, remote)


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


def _task_facts(path: Path, task: str, config: Any, is_st: bool) -> TaskFacts:
    id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    if task == "feature-extraction":
        pooling, normalize = "mean", False
        if is_st:
            modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
            for module in modules:
                kind = module.get("type", "")
                if kind.endswith("Pooling"):
                    pooling = _pooling_mode(_read_json(path / module.get("path", "") / "config.json"))
                elif kind.endswith("Normalize"):
                    normalize = True
        return TaskFacts(pooling=pooling, normalize=normalize, embedding_dim=_hidden_size(config))
    if task == "ranking":
        if len(id2label) != 1:
            raise ValueError(f"ranking needs a cross-encoder with one output label; this model has {len(id2label)}")
        return TaskFacts(score_activation="sigmoid", id2label=id2label)
    if task == "sequence-classification":
        multi = getattr(config, "problem_type", None) == "multi_label_classification" or len(id2label) == 1
        return TaskFacts(id2label=id2label, score_activation="sigmoid" if multi else "softmax")
    return TaskFacts(id2label=id2label, score_activation="softmax")


def _pooling_mode(pooling: dict[str, Any]) -> str:
    if pooling.get("pooling_mode_cls_token"):
        return "cls"
    if pooling.get("pooling_mode_max_tokens"):
        return "max"
    if pooling.get("pooling_mode_mean_tokens", True):
        return "mean"
    raise ValueError(f"unsupported sentence-transformers pooling config: {pooling}")


def _hidden_size(config: Any) -> int:
    return int(getattr(config, "hidden_size", None) or getattr(config, "dim"))
