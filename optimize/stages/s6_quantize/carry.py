"""Carry a parity-tested INT8 recipe (which layers and roles stay float) from one encoder to another."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from infinity.manifest import Manifest

# Graph node names of Hugging Face encoders -> the role of the weight they multiply by.
ROLE_PATTERNS = (
    (re.compile(r"layer\.(\d+)/(attention/output/dense|attention/out_lin)/"), "attention_output"),
    (re.compile(r"layer\.(\d+)/(intermediate/dense|ffn/lin1)/"), "ffn_in"),
    (re.compile(r"layer\.(\d+)/(output/dense|ffn/lin2)/"), "ffn_out"),
    (re.compile(r"layer\.(\d+)/(attention/self/(query|key|value)|attention/(q|k|v)_lin)/"), "attention_qkv"),
)
FUSED_ATTENTION = re.compile(r"^Attention_(\d+)$")  # onnxruntime names fused attention by layer order


def node_role(name: str) -> tuple[int, str] | None:
    match = FUSED_ATTENTION.match(name)
    if match:
        return int(match.group(1)), "attention_qkv"
    for pattern, role in ROLE_PATTERNS:
        match = pattern.search(name)
        if match:
            return int(match.group(1)), role
    return None


def kept_roles(artifact: Path | str) -> set[tuple[int, str]]:
    manifest = Manifest.load(artifact)
    roles = {node_role(name) for name in manifest.optimization.kept_float}
    if None in roles:
        raise ValueError(f"{artifact}: some nodes kept in float have no recognizable layer role")
    return roles  # type: ignore[return-value]


def nodes_for_roles(nodes: list[str], roles: set[tuple[int, str]]) -> list[str]:
    """Nodes in the given roles, plus task heads (pooler, classifier): small, and outside any layer."""
    return [name for name in nodes if node_role(name) in roles or node_role(name) is None]


@dataclass
class OutlierLimits:
    per_role: dict[tuple[int, str] | None, int]

    def for_nodes(self, nodes: list[str]) -> dict[str, int]:
        return {name: self.per_role[node_role(name)] for name in nodes if node_role(name) in self.per_role}


def outlier_limits(artifact: Path | str) -> OutlierLimits | None:
    """How many outlier channels the artifact split off per layer role; None where it split none off."""
    quantization = Manifest.load(artifact).optimization.quantization
    if quantization is None or not quantization.outliers.applied:
        return None
    return OutlierLimits({node_role(name): count for name, count in quantization.outliers.per_node.items()})
