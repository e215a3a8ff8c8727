"""Named hardware targets: one typed definition each, and why it is chosen that way."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from infinity.hostinfo import cpu_flags

WEIGHT_TYPES = ("QInt8", "QUInt8")
PRECISIONS = ("int8", "fp32", "fp16")


@dataclass(frozen=True)
class QuantizationConfig:
    """Dynamic INT8: u8 activations quantized at run time, weights quantized offline."""
    weight_type: str = "QInt8"
    per_channel: bool = True
    reduce_range: bool = False
    op_types: tuple[str, ...] = ("MatMul", "Attention")
    split_outliers: bool = True  # outlier input channels of each MatMul go through a small float MatMul

    def __post_init__(self) -> None:
        if self.weight_type not in WEIGHT_TYPES:
            raise ValueError(f"weight_type must be one of {WEIGHT_TYPES}, not {self.weight_type!r}")
        if not self.op_types:
            raise ValueError("op_types must name at least one operator")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["op_types"] = list(self.op_types)
        data["activation_type"] = "QUInt8"
        return data


@dataclass(frozen=True)
class TargetPreset:
    name: str
    why: str
    providers: tuple[str, ...]
    precisions: tuple[str, ...]
    required_cpu_flags: tuple[str, ...] = ()
    quantization: QuantizationConfig | None = None
    provider_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.precisions) - set(PRECISIONS)
        if unknown:
            raise ValueError(f"unknown precisions {sorted(unknown)} in preset {self.name}")
        if "int8" in self.precisions and self.quantization is None:
            raise ValueError(f"preset {self.name} offers int8 without a quantization config")

    @property
    def default_precision(self) -> str:
        return self.precisions[0]

    @property
    def is_gpu(self) -> bool:
        return "CPUExecutionProvider" not in self.providers[:1]


_VNNI = QuantizationConfig(weight_type="QInt8", per_channel=True, reduce_range=False)
_NO_VNNI = QuantizationConfig(weight_type="QInt8", per_channel=True, reduce_range=True)
_CPU = ("CPUExecutionProvider",)

TRT_SHAPES = {"min": (1, 1), "opt": (8, 128), "max": (32, 512)}


def tensorrt_profiles(input_names: list[str], max_length: int) -> dict[str, str]:
    """Optimization profile shapes (batch x sequence) for every model input."""
    options = {}
    for kind, (batch, seq) in TRT_SHAPES.items():
        seq = min(seq, max_length)
        options[f"trt_profile_{kind}_shapes"] = ",".join(f"{name}:{batch}x{seq}" for name in input_names)
    return options


PRESETS: dict[str, TargetPreset] = {p.name: p for p in (
    TargetPreset(
        "icelake",
        "AVX-512 VNNI: VPDPBUSD multiplies u8 activations by s8 weights without saturating, so full 8-bit "
        "range (no reduce_range) and per-channel s8 weights keep accuracy at full INT8 speed.",
        _CPU, ("int8", "fp32"), ("avx512f", "avx512_vnni"), _VNNI),
    TargetPreset(
        "cascadelake",
        "AVX-512 VNNI like Ice Lake (first VNNI generation): same u8 x s8 recipe.",
        _CPU, ("int8", "fp32"), ("avx512f", "avx512_vnni"), _VNNI),
    TargetPreset(
        "skylake",
        "AVX-512 without VNNI: u8 x s8 goes through VPMADDUBSW, whose int16 sums can saturate; "
        "7-bit weights (reduce_range) keep the pairwise sums in range.",
        _CPU, ("int8", "fp32"), ("avx512f", "avx512bw"), _NO_VNNI),
    TargetPreset(
        "avx2",
        "Generic AVX2: VPMADDUBSW path as on Skylake, so reduce_range against int16 saturation.",
        _CPU, ("int8", "fp32"), ("avx2",), _NO_VNNI),
    TargetPreset(
        "cuda",
        "NVIDIA GPUs through the CUDA execution provider: FP16 weights and math on tensor cores, "
        "inputs and outputs kept FP32/INT64 so clients see the same types.",
        ("CUDAExecutionProvider", "CPUExecutionProvider"), ("fp16", "fp32")),
    TargetPreset(
        "tensorrt",
        "TensorRT execution provider: FP16 engines built per optimization profile (sequence-length "
        "buckets) and cached on disk so restarts skip the build; CUDA EP as fallback for unsupported nodes.",
        ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"), ("fp16", "fp32"),
        provider_options={"TensorrtExecutionProvider": {
            "trt_fp16_enable": True,
            "trt_int8_enable": False,
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": "/tmp/infinity-trt-cache",
        }}),
)}

CPU_PREFERENCE = ("icelake", "skylake", "avx2")


def resolve_target(name: str, flags: frozenset[str] | None = None) -> TargetPreset:
    """A preset by name; `auto` picks the best CPU preset this host's flags allow."""
    if name == "auto":
        flags = cpu_flags() if flags is None else flags
        for candidate in CPU_PREFERENCE:
            if set(PRESETS[candidate].required_cpu_flags) <= flags:
                return PRESETS[candidate]
        raise ValueError("auto: this CPU has no AVX2; no CPU preset fits (choose a target explicitly)")
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; choose one of: auto, {', '.join(PRESETS)}") from None
