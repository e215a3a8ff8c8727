"""What one build is asked for: the user's options, and the plan every stage reads (the options with the target's
preset, precision and task resolved)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infinity.manifest import Precision

if TYPE_CHECKING:
    from optimize.presets import TargetPreset
    from optimize.tasks.base import OptimizerTask

Log = Callable[[str], None]


@dataclass
class OptimizeOptions:
    model: str
    task: str
    out: Path
    target: str = "auto"
    precision: str | None = None
    allow_failed_parity: bool = False
    threads: int = 0
    thresholds: dict[str, float] | None = None
    keep_float_like: Path | None = None  # reuse another artifact's float-kept layer roles instead of searching
    activations: str | None = None  # INT8: "per_token" or "per_tensor" instead of the target's own
    calibrated_scales: bool = True  # per-token INT8: False gives every input a scale per row, whatever the target
    pooling: str | None = None  # feature-extraction without a sentence-transformers Pooling config
    model_id: str | None = None  # the hub id clients see (default: found from the model's cache path or card)
    # Weights past this many bytes go to model.onnx.data beside the graph (None: 1 GiB, under protobuf's 2 GiB).
    external_data_bytes: int | None = None
    trust_remote_code: bool = False
    reranker_template: str | None = None  # ranking with a causal LM: its prompt, by name or JSON file


@dataclass(frozen=True)
class Plan:
    """One artifact's build: the options with their target, precision and task resolved, and where it logs."""
    options: OptimizeOptions
    preset: TargetPreset
    precision: Precision
    task: OptimizerTask
    log: Log
