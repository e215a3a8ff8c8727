import dataclasses

import pytest

from infinity.engine.hostinfo import cpu_name
from optimize.presets import PRESETS, TargetPreset, resolve_target, tensorrt_profiles
from optimize.stages.s6_quantize.config import QuantizationConfig

VNNI_HOST = frozenset({"sse4_2", "avx2", "avx512f", "avx512bw", "avx512_vnni"})
SKYLAKE_HOST = frozenset({"sse4_2", "avx2", "avx512f", "avx512bw"})
AVX2_HOST = frozenset({"sse4_2", "avx2", "fma"})


@pytest.mark.parametrize("flags, expected", [(VNNI_HOST, "icelake"), (SKYLAKE_HOST, "skylake"), (AVX2_HOST, "avx2")])
def test_auto_picks_the_best_cpu_preset_for_the_flags(flags, expected):
    assert resolve_target("auto", flags).name == expected


def test_auto_refuses_a_cpu_without_avx2():
    with pytest.raises(ValueError, match="no AVX2"):
        resolve_target("auto", frozenset({"sse4_2"}))


def test_a_host_is_named_with_its_cpu_family_and_model():
    # what a VM shows: the generic name alone cannot tell Zen 4 (family 25) from Zen 5 (family 26)
    first = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
    second = first.replace("26", "25").replace("\t: 2\n", "\t: 17\n")
    assert cpu_name(first + "\n" + second) == "AMD EPYC (family 26, model 2)"
    assert cpu_name("model name\t: Intel(R) Xeon(R) Platinum 8480+\n") == "Intel(R) Xeon(R) Platinum 8480+"


def test_unknown_target_names_the_choices():
    with pytest.raises(ValueError, match="icelake"):
        resolve_target("pentium")


@pytest.mark.parametrize("name, kernel", [("icelake", "VPDPBUSD"), ("cascadelake", "VPDPBUSD"),
                                          ("skylake", "VPMADDUBSW"), ("avx2", "VPMADDUBSW")])
def test_cpu_presets_quantize_per_token_with_7_bit_weights_and_say_why(name, kernel):
    q = PRESETS[name].quantization
    assert (q.activations, q.weight_type, q.per_channel, q.weight_bits) == ("per_token", "QInt8", True, 7)
    assert q.batch_invariant and q.record().weight_bits == 7 and kernel in q.record().weight_bits_why


@pytest.mark.parametrize("name", ["icelake", "cascadelake", "skylake", "avx2"])
def test_only_vnni_targets_try_8_bit_weights_and_the_record_stays_typed(name):
    from infinity.manifest import Quantization
    from infinity.manifest_schema import conform

    q = PRESETS[name].quantization
    vnni = "avx512_vnni" in PRESETS[name].required_cpu_flags
    assert bool(q.wide_weights_flags) == vnni and set(q.wide_weights_flags) <= {"avx512_vnni", "avx_vnni"}
    record = conform(Quantization, dataclasses.asdict(q.record()), "quantization")
    assert record == q.record() and record.weight_bits == 7 and record.activations == "per_token"


def test_per_token_needs_signed_per_channel_weights():
    with pytest.raises(ValueError, match="per_token"):
        QuantizationConfig(weight_type="QUInt8", activations="per_token")
    with pytest.raises(ValueError, match="activations"):
        QuantizationConfig(activations="per_batch")
    assert not QuantizationConfig(activations="per_tensor").batch_invariant


def test_every_cpu_preset_offers_a_float_variant_and_gpu_presets_default_to_fp16():
    for preset in PRESETS.values():
        if preset.is_gpu:
            assert preset.default_precision == "fp16" and preset.quantization is None
        else:
            assert preset.default_precision == "int8" and "fp32" in preset.precisions
        assert preset.why


def test_quantization_config_rejects_unknown_weight_types():
    with pytest.raises(ValueError, match="weight_type"):
        QuantizationConfig(weight_type="QInt4", activations="per_tensor")


def test_a_preset_cannot_offer_int8_without_a_recipe():
    with pytest.raises(ValueError, match="quantization"):
        TargetPreset("x", "why", ("CPUExecutionProvider",), ("int8",))


def test_tensorrt_profiles_cover_exactly_the_model_inputs_within_max_length():
    options = tensorrt_profiles(["input_ids", "attention_mask"], max_length=256)
    assert options["trt_profile_max_shapes"] == "input_ids:32x256,attention_mask:32x256"
    assert "token_type_ids" not in options["trt_profile_opt_shapes"]


def test_per_tensor_keeps_its_own_rounding_and_records_nearest_codes():
    config = PRESETS["icelake"].quantization
    assert config is not None and config.compensated
    per_tensor = dataclasses.replace(config, activations="per_tensor")
    assert not per_tensor.compensated and per_tensor.record().weight_rounding == "nearest"
    assert config.record().weight_rounding == "compensated" and config.record().rounding_damping == 1.0
    with pytest.raises(ValueError, match="rounding_damping"):
        dataclasses.replace(config, rounding_damping=0.0)
    with pytest.raises(ValueError, match="weight_rounding"):
        dataclasses.replace(config, weight_rounding="stochastic")
