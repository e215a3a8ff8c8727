"""What a model directory holds, read the same way by every task: its sentence-transformers modules, their
configs, its prompts."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infinity.manifest import POOLINGS

# sentence-transformers module classes the exported graph reproduces, by the last part of their type name
MODULES = ("Transformer", "Pooling", "Dense", "Normalize", "MLMTransformer", "SpladePooling", "MultiVectorMask")
BACKBONES = ("Transformer", "MLMTransformer")  # a Transformer whose task is fill-mask is read as MLMTransformer


@dataclass(frozen=True)
class Module:
    """One entry of a sentence-transformers modules.json."""
    kind: str   # one of MODULES
    path: Path  # its folder


@dataclass(frozen=True)
class Checkpoint:
    """A model directory as its task reads it for the facts the manifest records."""
    path: Path
    config: Any     # transformers PretrainedConfig
    tokenizer: Any  # transformers fast tokenizer
    modules: list[Module]  # sentence-transformers modules; [] for a bare transformers directory


def read_json(path: Path) -> dict[str, Any]:  # a JSON file as read
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def read_modules(path: Path) -> list[Module]:
    """modules.json, each entry checked: a module the graph cannot reproduce is refused by name."""
    modules = []
    for entry in json.loads((path / "modules.json").read_text(encoding="utf-8")):
        kind = str(entry.get("type", "")).rpartition(".")[2]
        if kind not in MODULES:
            raise ValueError(f"{path / 'modules.json'} lists the module {entry.get('type')!r}, which cannot be "
                             f"exported (known: {', '.join(MODULES)})")
        folder = path / entry.get("path", "")
        purpose = read_json(folder / "sentence_bert_config.json").get("transformer_task")
        if kind == "Transformer" and purpose == "fill-mask":
            kind = "MLMTransformer"
        modules.append(Module(kind, folder))
    if not modules or modules[0].kind not in BACKBONES or any(m.kind in BACKBONES for m in modules[1:]):
        raise ValueError(f"{path / 'modules.json'} must start with its one Transformer module")
    return modules


def prompts(path: Path) -> tuple[dict[str, str], str | None]:
    """The model's named prompts and its default prompt's name, from config_sentence_transformers.json."""
    st = read_json(path / "config_sentence_transformers.json")
    named = {str(k): str(v) for k, v in (st.get("prompts") or {}).items()}
    default = st.get("default_prompt_name") or None
    if default is not None and default not in named:
        raise ValueError(f"default_prompt_name {default!r} is not one of the model's prompts ({', '.join(named)})")
    return named, default


LEGACY_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
POOLING_KEYS = {"pooling_mode", "include_prompt", "embedding_dimension", "word_embedding_dimension", *LEGACY_MODES}


def pooling_mode(config: dict[str, Any]) -> tuple[str, bool]:  # the config as read from JSON
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


def hidden_size(config: Any) -> int:
    return int(getattr(config, "hidden_size", None) or config.dim)


def dense_width(dense: list[Module]) -> int:
    """The output width of the last of these Dense modules."""
    return int(read_json(dense[-1].path / "config.json")["out_features"])
