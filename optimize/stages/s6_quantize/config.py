"""The INT8 settings: one typed, checked definition, written into the manifest as the recipe's record."""
from __future__ import annotations

from dataclasses import dataclass

from infinity.manifest import Activations, Quantization, WeightRounding, WeightType

CALIBRATED_ROLES = ("normalized", "context")  # inputs whose rows a LayerNorm or an attention already bounds


@dataclass(frozen=True)
class QuantizationConfig:
    """INT8 with u8 activations quantized at run time and s8 weights quantized offline, per output channel.

    `per_token`: one activation scale per row (token), so an input's answer never depends on its batch; outliers
    smoothed into the weights. `per_tensor`: onnxruntime's dynamic quantization, one scale per padded batch, with
    outlier channels split off into float side paths."""
    weight_type: WeightType = WeightType.QINT8
    per_channel: bool = True
    reduce_range: bool = False  # 7-bit weights: u8 x s8 pair sums stay inside int16 on VPMADDUBSW (no VNNI)
    op_types: tuple[str, ...] = ("MatMul", "Attention")
    split_outliers: bool = True  # per_tensor: outlier input channels of each MatMul go through a small float MatMul
    activations: Activations = Activations.PER_TOKEN
    smoothing_alpha: float = 0.5  # per_token: s = range_x^alpha / range_w^(1 - alpha)
    # per_token: each input's alpha chosen among these (or no smoothing) by simulated error on its calibration rows;
    # empty: smoothing_alpha for every input
    smoothing_alphas: tuple[float, ...] = ()
    weight_bits_why: str = ""  # why this target's kernels want weight_bits
    # per_token: on a build host with one of these flags (kernels that sum u8 x s8 in 32 bits), 8-bit weights are
    # tried first and kept when every node quantizes within parity; otherwise weight_bits and the parity search
    wide_weights_flags: tuple[str, ...] = ()
    # per_token with 8-bit weights: inputs of these roles ("normalized": a LayerNorm's output, "context": an
    # attention's) are tried first with one scale calibrated for all rows, which the MatMul applies in its kernel
    calibrated_roles: tuple[str, ...] = ()
    # per_token ("per_tensor" ignores it): "compensated" rounds each MatMul's weight codes so their errors cancel on
    # its input's calibration rows (optimize/stages/s6_quantize/rounding.py), with the rows' Gram matrix damped by
    # rounding_damping x its mean diagonal
    weight_rounding: WeightRounding = WeightRounding.NEAREST
    rounding_damping: float = 1.0

    def __post_init__(self) -> None:
        # the choices as their enums, whether given as members or as their names
        for name, kind in (("weight_type", WeightType), ("activations", Activations),
                           ("weight_rounding", WeightRounding)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, kind(value))
            except ValueError:
                raise ValueError(f"{name} must be one of {', '.join(map(str, kind))}, not {value!r}") from None
        if not self.op_types:
            raise ValueError("op_types must name at least one operator")
        if self.activations == Activations.PER_TOKEN and (self.weight_type != WeightType.QINT8
                                                          or not self.per_channel):
            raise ValueError("per_token activations go with per-channel QInt8 weights")
        if set(self.calibrated_roles) - set(CALIBRATED_ROLES):
            raise ValueError(f"calibrated_roles must be among {CALIBRATED_ROLES}")
        if self.weight_rounding == WeightRounding.COMPENSATED and self.rounding_damping <= 0:
            raise ValueError("compensated weight rounding needs a positive rounding_damping")
        if not all(0 <= alpha <= 1 for alpha in (self.smoothing_alpha, *self.smoothing_alphas)):
            raise ValueError("smoothing alphas must be between 0 and 1")

    @property
    def weight_bits(self) -> int:
        return 7 if self.reduce_range else 8

    @property
    def compensated(self) -> bool:
        """Compensated weight rounding: a per-token recipe's (onnxruntime's per-tensor quantizer rounds its own)."""
        return self.weight_rounding == WeightRounding.COMPENSATED and self.activations == Activations.PER_TOKEN

    @property
    def batch_invariant(self) -> bool:
        return self.activations == Activations.PER_TOKEN

    def record(self) -> Quantization:
        """The manifest's record of these settings, before the build's choices (bits, calibrated roles) fill it."""
        return Quantization(
            activations=self.activations, weight_type=self.weight_type, per_channel=self.per_channel,
            reduce_range=self.reduce_range, weight_bits=self.weight_bits, weight_bits_why=self.weight_bits_why,
            op_types=list(self.op_types), split_outliers=self.split_outliers, smoothing_alpha=self.smoothing_alpha,
            smoothing_alphas=list(self.smoothing_alphas), batch_invariant=self.batch_invariant,
            weight_rounding=WeightRounding.COMPENSATED if self.compensated else WeightRounding.NEAREST,
            rounding_damping=self.rounding_damping if self.compensated else 0.0)


VNNI_WIDE_WEIGHTS = ("8-bit weights: VPDPBUSD sums u8 x s8 products in 32 bits, and every node quantized within "
                     "parity on a VNNI build host")
