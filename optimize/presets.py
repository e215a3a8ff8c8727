"""Named hardware targets: one typed definition each, and why it is chosen that way."""
from __future__ import annotations

from dataclasses import dataclass, field

from infinity.bundle import choose_target
from infinity.engine.hostinfo import cpu_flags
from infinity.engine.openvino import PROVIDER as OPENVINO
from infinity.manifest import Activations, Precision, WeightRounding, WeightType
from optimize.stages.s6_quantize.config import CALIBRATED_ROLES, QuantizationConfig


@dataclass(frozen=True)
class TargetPreset:
    name: str
    why: str
    providers: tuple[str, ...]
    precisions: tuple[Precision, ...]  # the first is the default
    required_cpu_flags: tuple[str, ...] = ()
    quantization: QuantizationConfig | None = None
    provider_options: dict[str, dict[str, str | int | bool]] = field(default_factory=dict)
    # precisions another engine serves than `providers` (sapphirerapids' bf16: OpenVINO's)
    engines: dict[Precision, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if Precision.INT8 in self.precisions and self.quantization is None:
            raise ValueError(f"preset {self.name} offers int8 without a quantization config")

    def providers_for(self, precision: Precision) -> tuple[str, ...]:
        return self.engines.get(precision, self.providers)

    def options_for(self, precision: Precision, input_names: list[str],
                    max_length: int) -> dict[str, dict[str, str | int | bool]]:
        """The provider options of the providers that serve `precision`, each a copy; TensorRT's with optimization
        profiles for the model's inputs up to its `max_length`."""
        options = {name: dict(options) for name, options in self.provider_options.items()
                   if name in self.providers_for(precision)}
        if "TensorrtExecutionProvider" in options:
            options["TensorrtExecutionProvider"].update(tensorrt_profiles(input_names, max_length))
        return options

    @property
    def default_precision(self) -> Precision:
        return self.precisions[0]

    @property
    def is_gpu(self) -> bool:
        return "CPUExecutionProvider" not in self.providers[:1]


# Every CPU target: per-token activations (batch-invariant), per-channel weights. VPMADDUBSW (AVX2, AVX-512
# without VNNI) adds pairs of u8 x s8 products into int16, which 8-bit weights can saturate: 7 bits. VPDPBUSD
# (AVX-512 VNNI) sums in 32 bits, so 8 bits are exact there and closer (MiniLM held-out cosine_min 0.9961 vs 0.9936,
# same speed). They are kept when the whole graph quantizes within parity on a VNNI build host (whose kernels are
# the ones served, so its parity is what is served); where nodes must stay float, the parity search with 8 bits
# overfit its tuning texts on the tiny DistilBERT classifier (4 nodes kept where 7 bits keep 9; held-out top-1
# agreement 0.9818), so the search runs with 7.
VNNI_WEIGHTS = ("7-bit weights: with 8 (VPDPBUSD sums in 32 bits) the parity search overfit its tuning texts on a "
                "classifier, and 7-bit products are exact on every x86 INT8 path")
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")
NO_VNNI_WEIGHTS = ("7-bit weights (reduce_range): VPMADDUBSW adds pairs of u8 x s8 products into int16, which "
                   "8-bit weights can saturate")
# Each input's smoothing strength is chosen among these (or none) by simulated error on its calibration rows.
SMOOTHING_ALPHAS = (0.2, 0.35, 0.5, 0.6, 0.7, 0.8, 0.9)
PER_TOKEN = QuantizationConfig(weight_type=WeightType.QINT8, per_channel=True, reduce_range=True,
                               activations=Activations.PER_TOKEN, smoothing_alphas=SMOOTHING_ALPHAS,
                               weight_bits_why=NO_VNNI_WEIGHTS, weight_rounding=WeightRounding.COMPENSATED)
PER_TOKEN_ON_VNNI = QuantizationConfig(weight_type=WeightType.QINT8, per_channel=True, reduce_range=True,
                                       activations=Activations.PER_TOKEN, weight_bits_why=VNNI_WEIGHTS,
                                       wide_weights_flags=VNNI_FLAGS, calibrated_roles=CALIBRATED_ROLES,
                                       smoothing_alphas=SMOOTHING_ALPHAS, weight_rounding=WeightRounding.COMPENSATED)
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
        "sapphirerapids",
        "AMX (Sapphire, Emerald and Granite Rapids): int8 is Ice Lake's per-token recipe, whose u8 x s8 products "
        "onnxruntime runs on the AMX tiles here (answers exact alone and batched; a bundle serves it as icelake's "
        "graph, byte for byte); bf16 (asked for) is the exported float graph, which OpenVINO's CPU plugin inside "
        "onnxruntime fuses and runs whole in bfloat16 on the tiles: OpenVINO's own speed, closer to fp32, faster "
        "than int8 from about 64 tokens or a batch up, but its answers move with their batch by up to about 1e-3.",
        _CPU, (Precision.INT8, Precision.BF16, Precision.FP32), ("avx512f", "avx512_vnni", "amx_int8", "amx_bf16"),
        PER_TOKEN_ON_VNNI, provider_options={OPENVINO: {"INFERENCE_PRECISION_HINT": "bf16"}},
        engines={Precision.BF16: (OPENVINO, "CPUExecutionProvider")}),
    TargetPreset(
        "icelake",
        "AVX-512 VNNI: per-token INT8 (one scale per token: an answer never depends on its batch), SmoothQuant "
        "with each input's strength chosen by the parity search (0.5 where nodes stay float), per-channel weights "
        "at 8 bits when every node quantizes within parity on a VNNI build host "
        "(first with one calibrated scale for LayerNorm and attention outputs, which the INT8 MatMul applies in "
        "its kernel), else 7 with the parity search (see the weight bits' reason).",
        _CPU, (Precision.INT8, Precision.FP32), ("avx512f", "avx512_vnni"), PER_TOKEN_ON_VNNI),
    TargetPreset(
        "cascadelake",
        "AVX-512 VNNI like Ice Lake (first VNNI generation): same per-token recipe.",
        _CPU, (Precision.INT8, Precision.FP32), ("avx512f", "avx512_vnni"), PER_TOKEN_ON_VNNI),
    TargetPreset(
        "skylake",
        "AVX-512 without VNNI: per-token INT8 as on Ice Lake; u8 x s8 goes through VPMADDUBSW, whose int16 pair "
        "sums saturate with 8-bit weights (held-out cosine_min 0.981 on MiniLM), so 7-bit weights are required.",
        _CPU, (Precision.INT8, Precision.FP32), ("avx512f", "avx512bw"), PER_TOKEN),
    TargetPreset(
        "avx2",
        "Generic AVX2: per-token INT8 with 7-bit weights, as on Skylake (the same VPMADDUBSW saturation).",
        _CPU, (Precision.INT8, Precision.FP32), ("avx2",), PER_TOKEN),
    TargetPreset(
        "cuda",
        "NVIDIA GPUs through the CUDA execution provider: FP16 weights and math on tensor cores, "
        "inputs and outputs kept FP32/INT64 so clients see the same types.",
        ("CUDAExecutionProvider", "CPUExecutionProvider"), (Precision.FP16, Precision.FP32)),
    TargetPreset(
        "tensorrt",
        "TensorRT execution provider: FP16 engines built per optimization profile (sequence-length "
        "buckets) and cached on disk so restarts skip the build; CUDA EP as fallback for unsupported nodes.",
        ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
        (Precision.FP16, Precision.FP32),
        provider_options={"TensorrtExecutionProvider": {
            "trt_fp16_enable": True,
            "trt_int8_enable": False,
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": "/tmp/infinity-trt-cache",
        }}),
)}

# Every CPU target, best first, in PRESETS' order. A bundle lists its targets in this order, and the server serves the
# first one a host's flags fit, as `auto` picks.
CPU_ORDER = tuple(name for name, preset in PRESETS.items() if not preset.is_gpu)


def _twin(name: str, before: tuple[str, ...]) -> bool:
    """A target that needs the flags and builds the recipe of one before it (cascadelake: icelake's)."""
    preset = PRESETS[name]
    return any((PRESETS[other].required_cpu_flags, PRESETS[other].quantization)
               == (preset.required_cpu_flags, preset.quantization) for other in before)


# What `auto` chooses among: CPU_ORDER less the twins.
CPU_PREFERENCE = tuple(name for i, name in enumerate(CPU_ORDER) if not _twin(name, CPU_ORDER[:i]))
# `--target cpu`: every CPU recipe the optimizer builds, once each, under the target that needs the fewest flags
# (skylake writes avx2's graph, which a Skylake host picks)
CPU_BUNDLE = tuple(dict.fromkeys(
    min((other for other in CPU_ORDER if PRESETS[other].quantization == PRESETS[name].quantization),
        key=lambda other: len(PRESETS[other].required_cpu_flags)) for name in CPU_ORDER))


def resolve_target(name: str, flags: frozenset[str] | None = None) -> TargetPreset:
    """A preset by name; `auto` picks the best CPU preset this host's flags allow."""
    if name == "auto":
        flags = cpu_flags() if flags is None else flags
        chosen = choose_target(((n, PRESETS[n].required_cpu_flags) for n in CPU_PREFERENCE), flags)
        if chosen is None:
            raise ValueError("auto: this CPU has no AVX2; no CPU preset fits (choose a target explicitly)")
        return PRESETS[chosen]
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; choose one of: auto, cpu, {', '.join(PRESETS)}, or several CPU "
                         "targets joined by commas") from None


def target_list(text: str) -> tuple[str, ...]:
    """`--target`'s value as the targets to build: one (`auto` included) alone, the way a single artifact is built;
    or several CPU targets joined by commas, `cpu` standing for CPU_BUNDLE, in CPU_ORDER (a bundle)."""
    names = [part.strip() for part in text.split(",")]
    if len(names) == 1 and names[0] != "cpu":
        resolve_target(names[0])
        return (names[0],)
    wanted: set[str] = set()
    for name in names:
        if name == "cpu":
            wanted.update(CPU_BUNDLE)
            continue
        if not name:
            raise ValueError(f"no target name between the commas of {text!r}")
        if name == "auto":
            raise ValueError("auto picks one target for this host; a bundle names its targets (cpu: "
                             f"{', '.join(CPU_BUNDLE)})")
        if resolve_target(name).is_gpu:
            raise ValueError(f"{name} is a GPU target; a bundle holds CPU targets, which the server chooses among by "
                             "the CPU's flags")
        wanted.add(name)
    return tuple(name for name in CPU_ORDER if name in wanted)

# What the default INT8 recipe measured (python -m bench recipes; see bench/README.md), by target.
_MEASURED_AVX2 = ("all-MiniLM-L6-v2 on a 2-core AMD EPYC (AVX2), in-process ms at b1 seq 8/64/256 and b8 x 64: "
                  "3.3/15.7/67.1/135.3 vs fp32 5.8/23.0/100.3/187.6 and the previous per-tensor artifact "
                  "2.9/14.9/67.7/125.5; held-out cosine_min 0.9934 alone and batched (previous: 0.9949 alone, "
                  "0.9884 batched), 0 difference alone vs batched")
MEASURED: dict[str, str] = {
    "avx2": _MEASURED_AVX2,
    "skylake": "as avx2 (same kernels); not measured on a Skylake host",
    "icelake": ("all-MiniLM-L6-v2 on a 2-vCPU AMD EPYC (Zen 4, AVX-512 VNNI), in-process ms (2 threads, workers "
                "spinning 50 us as the server's) at b1 seq 8/64/256, b8 x 64, b32 x 128: 0.76/2.04/7.35/11.1/118 "
                "against onnxruntime quantize_dynamic of the same graph 0.64/1.90/7.18/11.3/123 and optimum's "
                "avx512_vnni export 0.85/2.16/7.60/11.1/119; held-out cosine_min 0.9944 alone and batched "
                "(quantize_dynamic: 0.9765 / 0.9533), 0 difference alone vs batched; --no-calibrated-scales: 0.9961 "
                "at 1.10-1.16x the time; on Zen 5 (family 26) 0.75/1.98/7.35/11.2/118 against 0.62/1.85/7.05/11.3/123 "
                "and 0.77/2.11/7.44/11.2/121"),
    "cascadelake": "as icelake (same recipe); not measured on a Cascade Lake host",
    "sapphirerapids": ("2-vCPU Intel Xeon (family 6, model 167, AMX), in-process ms at b1 s8/64/256, b16 s64, b32 s128 "
                       "(python -m bench openvino): all-MiniLM-L6-v2 int8 1.01/2.93/11.5/27.9/155, bf16 "
                       "1.42/2.62/9.31/23.7/95.8, OpenVINO's own bf16 1.60/2.85/9.64/23.9/98.6; held-out cosine_min "
                       "0.9950 / 0.9999 / 0.9999, alone vs batched 0 / 6.9e-4 / 8.3e-4 (docs/benchmarks.md)"),
}
