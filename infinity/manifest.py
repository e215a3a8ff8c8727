"""The artifact manifest: the contract between the optimizer and the server.

The optimizer writes it, the server trusts nothing else. Plain dataclasses, JSON on disk.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from infinity.manifest_schema import conform

SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"


class Named(str, Enum):
    """A closed set of names written into the manifest as plain strings; a member reads, compares and prints as
    its name."""

    def __str__(self) -> str:
        return str(self.value)


class TaskName(Named):
    FEATURE_EXTRACTION = "feature-extraction"
    SPARSE_EMBEDDING = "sparse-embedding"
    MULTI_VECTOR = "multi-vector"
    HYBRID_EMBEDDING = "hybrid-embedding"
    SEQUENCE_CLASSIFICATION = "sequence-classification"
    TOKEN_CLASSIFICATION = "token-classification"
    RANKING = "ranking"


class Precision(Named):
    INT8 = "int8"
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"  # a float graph OpenVINO runs in bfloat16 on AMX tiles (infinity/engine/openvino.py)


class Activations(Named):
    """INT8 activation scales: one per row (token), or one per padded batch (onnxruntime's dynamic INT8)."""
    PER_TOKEN = "per_token"
    PER_TENSOR = "per_tensor"


class WeightType(Named):
    QINT8 = "QInt8"
    QUINT8 = "QUInt8"


class WeightRounding(Named):
    """Each weight to its nearest code, or codes whose errors cancel on the input's calibration rows (GPTQ)."""
    NEAREST = "nearest"
    COMPENSATED = "compensated"


# sentence-transformers' pooling modes; several are concatenated in order, written "cls+mean"
POOLINGS = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
SPLADE = "splade"  # sparse-embedding's one pooling: a masked-LM's logits to one weight per vocabulary entry
# sentence-transformers' SpladePooling settings: how tokens are pooled, and the activation before log1p
SPLADE_SETTINGS = {"pooling_strategy": ("max", "sum"), "activation_function": ("relu", "log1p_relu")}
# a SPLADE graph's output that answers each vocabulary entry's largest logit through relu: the server takes log1p
SPLADE_MAX_LOGITS = "max_logits"
ACTIVATIONS = ("sigmoid", "softmax", "none")


class ManifestError(ValueError):
    """The artifact is missing, malformed, or does not match its manifest."""


@dataclass
class Source:
    model: str
    task: TaskName
    revision: str | None = None
    model_type: str | None = None
    model_id: str | None = None  # the hub id clients see, where the optimizer knew it
    library_versions: dict[str, str] = field(default_factory=dict)
    trust_remote_code: bool = False  # the model's own code (its config's auto_map) ran to export it


@dataclass
class Target:
    name: str
    providers: list[str]
    required_cpu_flags: list[str] = field(default_factory=list)
    provider_options: dict[str, dict[str, str | int | bool]] = field(default_factory=dict)


@dataclass
class ModelFile:
    file: str
    sha256: str
    precision: Precision
    opset: int
    inputs: dict[str, list[str | int]]
    outputs: dict[str, list[str | int]]
    size_bytes: int = 0  # the graph and its external data together
    external_data: dict[str, str] = field(default_factory=dict)  # weights file beside the graph -> sha256


@dataclass
class TokenizerFile:
    file: str
    sha256: str
    max_length: int
    pad_id: int
    extra_files: list[str] = field(default_factory=list)


RANGES = ("normalized", "unnormalized")  # the embedding_ranges of a feature-extraction artifact


@dataclass
class Reranker:
    """A causal LM that ranks: each (query, document) is `prefix + template + suffix` with the template filled in,
    and its score is the log-odds of `true_token` over `false_token` at the last token (sigmoid: P(yes))."""
    prefix: str
    suffix: str
    template: str       # with {instruction}, {query} and {document}
    instruction: str
    true_token: str
    false_token: str
    true_token_id: int
    false_token_id: int


ROLES = ("query", "document")  # what a multi-vector input is: late interaction treats the two sides apart
EXPANSIONS = ("fixed", "min")


@dataclass
class QueryExpansion:
    """ColBERT's query expansion: a query shorter than `length` tokens is filled up to it with `token_id`, which the
    model reads (`attend`) or not, and whose vectors are answered. "fixed": queries are also cut to `length`."""
    strategy: str
    attend: bool
    token_id: int
    length: int


@dataclass
class MultiVector:
    """A late-interaction (ColBERT) model's rules around its per-token vectors, as its sentence-transformers
    MultiVectorEncoder applies them: each role's prompt (TaskFacts.prompts, keyed by role) and maximum length, the
    token ids dropped from the answers of the roles in `skiplist_roles`, and the query expansion."""
    skiplist_ids: list[int] = field(default_factory=list)
    skiplist_roles: list[str] = field(default_factory=lambda: ["document"])
    query_length: int | None = None
    document_length: int | None = None
    expansion: QueryExpansion | None = None

    def max_length(self, role: str) -> int | None:
        if role == "query" and self.expansion is not None and self.expansion.strategy == "fixed":
            return self.expansion.length
        return self.query_length if role == "query" else self.document_length


@dataclass
class Hybrid:
    """bge-m3's three heads over one pass, side by side in each token's row of the graph's one output: the last
    hidden state (`hidden_size`; the dense vector is the first token's), the sparse weight (relu of its
    sparse_linear), and the ColBERT vector (its colbert_linear, normalized; `colbert_dim`)."""
    hidden_size: int
    colbert_dim: int
    unused_ids: list[int] = field(default_factory=list)  # no sparse weight: the tokenizer's cls, eos, pad and unk


@dataclass
class TaskFacts:
    pooling: str | None = None          # feature-extraction: one of POOLINGS, or several joined by "+"; sparse: SPLADE
    splade: dict[str, str] | None = None  # sparse-embedding: SpladePooling's settings (SPLADE_SETTINGS), in the graph
    pooled_in_graph: bool = False       # the graph answers pooled vectors (pooling and Dense modules inside it)
    normalize: bool = False             # default for feature-extraction
    prompts: dict[str, str] = field(default_factory=dict)  # name -> text put before an input
    default_prompt_name: str | None = None
    id2label: dict[int, str] | None = None
    score_activation: str | None = None  # "sigmoid" | "softmax" | "none" (ranking / classification default)
    embedding_dim: int | None = None
    # feature-extraction: each dimension's [minimums, maximums] over the vectors of the calibration texts, "normalized"
    # and "unnormalized", for int8 and uint8 answers (sentence-transformers' quantize_embeddings ranges)
    embedding_ranges: dict[str, list[list[float]]] | None = None
    reranker: Reranker | None = None  # ranking with a causal LM: its prompt and the tokens whose odds are the score
    multi_vector: MultiVector | None = None  # multi-vector: which token vectors a query or document answers
    hybrid: Hybrid | None = None  # hybrid-embedding: where each head's numbers are in the graph's output


@dataclass
class Outliers:
    """Per-tensor INT8: the outlier input channels split off into float side paths (channels over `ratio` x the
    median range, at most `max_channels` per MatMul), the Attention inputs smoothed instead, or why none were."""
    applied: bool = False
    reason: str = ""
    ratio: float | None = None
    max_channels: int | None = None
    nodes: int = 0
    channels: int = 0
    per_node: dict[str, int] = field(default_factory=dict)
    smoothing_alpha: float | None = None
    smoothed: list[str] = field(default_factory=list)
    calibration_inputs: int = 0


@dataclass
class Quantization:
    """How the INT8 graph was made, and why: the recipe, the settings the target chose, what the search did.

    Args:
        activations: "per_token" (one activation scale per row: batch-invariant) or "per_tensor" (one per padded
            batch, onnxruntime's dynamic quantization).
        weight_bits: 8, or 7 where the target's dot product adds u8 x s8 pairs into int16 (reduce_range).
        weight_bits_why: the target's reason for those bits.
        candidates, kept_float: quantizable nodes, and how many of them parity kept in float.
        calibrated_roles: per-token: the roles of the inputs quantized with one calibrated scale for every row
            ("normalized": a LayerNorm's output, "context": an attention's); the rest get a scale per row.
        smoothing: per-token: inputs quantized, smoothed, smoothing folded into weights, one-sided GELU inputs,
            inputs with a calibrated scale.
        smoothing_alphas: per-token: the strengths each input's smoothing was chosen among (besides none), by
            simulated INT8 error on its calibration rows; empty: smoothing_alpha for every input.
        smoothing_strengths: per-token: how many inputs were smoothed with each alpha ("none": not smoothed).
        weight_rounding: per-token: "nearest" (each weight to its nearest code) or "compensated" (codes rounded so
            their errors cancel on the input's calibration rows, GPTQ), with `rounding_damping` x the mean diagonal
            added to those rows' Gram matrix.
        outliers: per-tensor: the outlier channels split off into float side paths (or why none were).
        latency_ms: in-process ms per shape, "fp32" and "final", measured on `latency_host` at build time with idle
            workers spinning as the server's do by default.
        embedding_tables_int8: word-embedding tables of 64 MiB or more stored as INT8 rows with a scale per row.
    """
    activations: Activations = Activations.PER_TOKEN
    weight_type: WeightType = WeightType.QINT8
    weight_bits: int = 8
    weight_bits_why: str = ""
    per_channel: bool = True
    reduce_range: bool = False
    op_types: list[str] = field(default_factory=list)
    split_outliers: bool = False
    smoothing_alpha: float = 0.5
    smoothing_alphas: list[float] = field(default_factory=list)
    smoothing_strengths: dict[str, int] = field(default_factory=dict)
    weight_rounding: WeightRounding = WeightRounding.NEAREST
    rounding_damping: float = 0.0
    calibrated_roles: list[str] = field(default_factory=list)
    batch_invariant: bool = False
    candidates: int = 0
    kept_float: int = 0
    trials: int = 0
    calibration_inputs: int = 0
    recipe_from: str | None = None
    why: str = ""
    full_int8_metrics: dict[str, float] = field(default_factory=dict)
    smoothing: dict[str, int] = field(default_factory=dict)
    outliers: Outliers = field(default_factory=Outliers)
    float_weight_params: dict[str, int] = field(default_factory=dict)
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    latency_ms_seq128: dict[str, float] = field(default_factory=dict)
    latency_host: str = ""
    embedding_tables_int8: list[str] = field(default_factory=list)  # word-embedding tables stored as INT8 rows


@dataclass
class Optimization:
    fusion: dict[str, int] = field(default_factory=dict)
    fusion_gaps: list[str] = field(default_factory=list)
    fusion_model_type: str | None = None  # onnxruntime transformer optimizer's model type; None: not fused
    quantization: Quantization | None = None
    kept_float: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    exported_bytes: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class Parity:
    reference: str
    probe_size: int
    metrics: dict[str, float]
    thresholds: dict[str, float]
    passed: bool
    failures: list[str] = field(default_factory=list)
    host_cpu_flags: list[str] = field(default_factory=list)
    overridden: bool = False
    probe_set: str = ""  # which texts: the held-out validation set, never the ones the optimizer tuned on
    modes: dict[str, dict[str, float]] = field(default_factory=dict)  # metrics per way of serving: alone, batched
    batch_invariance: dict[str, float] = field(default_factory=dict)  # an input's answer alone vs inside a batch
    provider: str = ""  # the onnxruntime execution provider the held-out answers came from


@dataclass
class Manifest:
    source: Source
    target: Target
    model: ModelFile
    tokenizer: TokenizerFile
    task: TaskFacts
    optimization: Optimization
    parity: Parity
    schema_version: int = SCHEMA_VERSION
    created_at: str = ""

    def to_dict(self) -> dict[str, Any]:  # as written to manifest.json
        return dataclasses.asdict(self)

    @property
    def public_model_id(self) -> str:
        """The source model as clients may see it: its hub id where known, else what the optimizer was given
        (a hub id as is, a local path as its last component only)."""
        return self.source.model_id or public_model_id(self.source.model)

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        if not isinstance(data, dict):
            raise ManifestError("manifest is malformed: it must be a JSON object")
        version = data.get("schema_version")
        if type(version) is not int:
            raise ManifestError(f"manifest schema_version must be the integer {SCHEMA_VERSION}, not {version!r}")
        if version != SCHEMA_VERSION:
            raise ManifestError(f"manifest schema version {version} is not supported (expected {SCHEMA_VERSION})")
        optimization = data.get("optimization")
        quantization = optimization.get("quantization") if isinstance(optimization, dict) else None
        if isinstance(optimization, dict) and isinstance(quantization, dict):
            data = {**data, "optimization": {**optimization, "quantization": _current(quantization)}}
        try:
            manifest = conform(cls, data, "")
        except ValueError as exc:
            raise ManifestError(f"manifest is malformed: {exc}") from None
        check_facts(manifest)
        return manifest

    def save(self, directory: Path) -> None:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        (Path(directory) / MANIFEST_FILE).write_text(text + "\n", encoding="utf-8")

    @classmethod
    def load(cls, directory: Path | str) -> Manifest:
        return cls.from_dict(read_json(directory, MANIFEST_FILE, ManifestError, "not an artifact directory"))


def read_json(directory: Path | str, name: str, error: type[ManifestError], missing: str) -> Any:
    """The JSON file `name` in `directory`, or one line that says what is wrong with it."""
    path = Path(directory) / name
    if not path.is_file():
        raise error(f"no {name} in {directory}: {missing}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise error(f"{path} is not valid JSON: {exc}") from None


def _current(quantization: dict[str, Any]) -> dict[str, Any]:  # JSON as read
    """A quantization record as it is written now, from any earlier one: the first named its activation scheme
    "mode" ("dynamic": one scale per padded batch) and then beside "activations" too; both wrote "activation_type",
    which was always QUInt8."""
    record = {k: v for k, v in quantization.items() if k not in ("mode", "activation_type")}
    if "activations" not in record and quantization.get("mode") == "dynamic":
        record["activations"] = Activations.PER_TENSOR.value
    return record


def public_model_id(model: str) -> str:
    if PurePosixPath(model).is_absolute() or PureWindowsPath(model).is_absolute() or model.startswith(("~", ".")):
        return PurePosixPath(model.replace("\\", "/").rstrip("/")).name or "model"
    return model


def _inside(name: str, where: str) -> None:
    """A file the manifest names must be a plain relative path: nothing absolute, nothing climbing out."""
    if (not name.strip() or "\x00" in name or "\\" in name or PurePosixPath(name).is_absolute()
            or PureWindowsPath(name).is_absolute() or ".." in PurePosixPath(name).parts):
        raise ManifestError(f"manifest field {where} must name a file inside the artifact directory, not {name!r}")


def check_facts(manifest: Manifest) -> None:
    """What the types alone do not say; every failure is one line naming the field."""
    _inside(manifest.model.file, "model.file")
    for name in manifest.model.external_data:
        _inside(name, "model.external_data")
    _inside(manifest.tokenizer.file, "tokenizer.file")
    for index, name in enumerate(manifest.tokenizer.extra_files):
        _inside(name, f"tokenizer.extra_files[{index}]")
    digests = [("model.sha256", manifest.model.sha256), ("tokenizer.sha256", manifest.tokenizer.sha256),
               *((f"model.external_data[{name!r}]", digest) for name, digest in manifest.model.external_data.items())]
    for where, digest in digests:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ManifestError(f"manifest field {where} must be 64 lowercase hex digits, not {digest!r}")
    if not manifest.target.providers:
        raise ManifestError("manifest field target.providers must name at least one execution provider")
    facts, sparse = manifest.task, manifest.source.task == TaskName.SPARSE_EMBEDDING
    checks = [
        ("tokenizer.max_length", manifest.tokenizer.max_length >= 1, "at least 1"),
        ("tokenizer.pad_id", manifest.tokenizer.pad_id >= 0, "at least 0"),
        ("task.pooling", facts.pooling == SPLADE, f"{SPLADE} for sparse-embedding") if sparse else
        ("task.pooling", facts.pooling is None or all(mode in POOLINGS for mode in facts.pooling.split("+")),
         f"one of {', '.join(POOLINGS)} (or several joined by +)"),
        ("task.splade", facts.splade is None or (set(facts.splade) == set(SPLADE_SETTINGS) and all(
            facts.splade[key] in values for key, values in SPLADE_SETTINGS.items())),
         "pooling_strategy (max or sum) and activation_function (relu or log1p_relu)"),
        ("task.default_prompt_name", facts.default_prompt_name in (None, *facts.prompts),
         f"one of the prompts ({', '.join(facts.prompts) or 'none'})"),
        ("task.score_activation", facts.score_activation in (None, *ACTIVATIONS), f"one of {', '.join(ACTIVATIONS)}"),
        ("task.embedding_dim", facts.embedding_dim is None or facts.embedding_dim >= 1, "at least 1"),
        ("task.id2label", all(key >= 0 for key in facts.id2label or {}), "keyed by label indexes from 0"),
        ("task.embedding_ranges", facts.embedding_ranges is None or (
            set(facts.embedding_ranges) == set(RANGES) and all(
                len(ranges) == 2 and len(ranges[0]) == len(ranges[1]) and all(a <= b for a, b in zip(*ranges))
                for ranges in facts.embedding_ranges.values())),
         f"{' and '.join(RANGES)}, each two lists of one number per dimension, minimums then maximums"),
    ]
    if manifest.source.task == TaskName.HYBRID_EMBEDDING:
        hybrid = facts.hybrid
        checks.append(("task.hybrid", hybrid is not None and hybrid.hidden_size >= 1 and hybrid.colbert_dim >= 1,
                       "the widths of the hidden state and the ColBERT vector, at least 1 each"))
    if manifest.source.task == TaskName.MULTI_VECTOR:
        multi = facts.multi_vector
        expansion = multi.expansion if multi is not None else None
        checks += [
            ("task.multi_vector", multi is not None and set(multi.skiplist_roles) <= set(ROLES) and all(
                length is None or length >= 1 for length in (multi.query_length, multi.document_length)),
             f"the model's per-token rules, with skiplist_roles among {', '.join(ROLES)}"),
            ("task.multi_vector", expansion is None or (expansion.strategy in EXPANSIONS and expansion.length >= 1),
             f"a query expansion whose strategy is one of {', '.join(EXPANSIONS)} and whose length is at least 1"),
            ("task.prompts", set(facts.prompts) <= set(ROLES), f"keyed by role ({', '.join(ROLES)})"),
        ]
    for where, ok, expected in checks:
        if not ok:
            value = facts.id2label if where == "task.id2label" else _field(manifest, where)
            raise ManifestError(f"manifest field {where} must be {expected}, not {value!r}")


def _field(manifest: Manifest, where: str) -> Any:
    section, name = where.split(".")
    return getattr(getattr(manifest, section), name)
