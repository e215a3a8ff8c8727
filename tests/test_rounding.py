"""Compensated weight rounding: codes whose errors cancel on the rows the weight multiplies, in the graph as built."""
import numpy as np
import onnx
from onnx import numpy_helper

from optimize.stages.s6_quantize.calibrate import calibrate
from optimize.stages.s6_quantize.per_token import quantize_per_token
from optimize.stages.s6_quantize.rounding import CompensatedRounding, Compensation, compensated_codes, quantize_weight
from tests.test_smoothing import feeds, one_matmul

WIDTH, OUT = 64, 24


DIRECTIONS = np.random.default_rng(0).normal(0, 1, (6, WIDTH))


def correlated_rows(rng: np.random.Generator, count: int) -> np.ndarray:
    """Rows that move together, as a trained model's activations do: a few directions, a few large channels."""
    rows = rng.normal(0, 1, (count, 6)) @ DIRECTIONS + rng.normal(0, 0.1, (count, WIDTH))
    rows[:, [3, 40]] *= 8
    return rows.astype(np.float32)


def relative_error(rows: np.ndarray, weight: np.ndarray, codes: np.ndarray, scale: np.ndarray) -> float:
    exact = rows @ weight
    return float(np.linalg.norm(rows @ (codes * scale) - exact) / np.linalg.norm(exact))


def test_compensated_codes_multiply_rows_they_were_not_fitted_to_closer_than_the_nearest_codes():
    rng = np.random.default_rng(3)
    weight = rng.standard_t(3, (WIDTH, OUT)).astype(np.float32) * 0.1  # heavy tails: coarse column scales
    fit, held_out = correlated_rows(rng, 400), correlated_rows(rng, 400)
    nearest = quantize_weight(weight, 8)
    for damping in (0.1, 1.0):
        codes, scale = compensated_codes(weight, Compensation.of(fit, damping), 8)
        np.testing.assert_array_equal(scale, nearest[1])  # the same column scales: the kernels do not change
        assert codes.dtype == np.int8 and np.abs(codes).max() <= 127
        assert np.abs(codes.astype(int) - nearest[0]).max() >= 1
        assert relative_error(held_out, weight, codes, scale) < 0.8 * relative_error(held_out, weight, *nearest)


def test_a_channel_the_rows_never_use_keeps_its_nearest_code():
    rng = np.random.default_rng(4)
    weight = rng.normal(0, 0.2, (WIDTH, OUT)).astype(np.float32)
    rows = correlated_rows(rng, 300)
    rows[:, 17] = 0
    codes, scale = compensated_codes(weight, Compensation.of(rows, 1.0), 8)
    nearest = quantize_weight(weight, 8)[0]
    np.testing.assert_array_equal(codes[17], nearest[17])  # no error of another channel is pushed into it
    assert (codes != nearest).sum() > 10


def test_seven_bit_codes_stay_within_seven_bits():
    rng = np.random.default_rng(5)
    weight = rng.normal(0, 0.2, (WIDTH, OUT)).astype(np.float32)
    codes, scale = compensated_codes(weight, Compensation.of(correlated_rows(rng, 200), 1.0), 7)
    assert np.abs(codes).max() <= 63
    np.testing.assert_array_equal(scale, quantize_weight(weight, 7)[1])


def test_the_graph_multiplies_by_codes_compensated_on_its_smoothed_input(tmp_path):
    rng = np.random.default_rng(7)
    path = tmp_path / "g.onnx"
    weight = one_matmul(path, "row", rng)
    calibration = calibrate(path, ["mm"], [feeds(rng) for _ in range(3)], samples=True)
    record = quantize_per_token(path, tmp_path / "q.onnx", calibration.bounds, weight_bits=8, alphas={"x": 0.5},
                                rounding=CompensatedRounding(calibration.samples, 1.0))
    plain = quantize_per_token(path, tmp_path / "p.onnx", calibration.bounds, weight_bits=8, alphas={"x": 0.5})
    assert record.compensated == 1 and plain.compensated == 0
    built = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "q.onnx")).graph.initializer}
    divided = built["x/smooth/inverse"]  # the graph divides x by s and multiplies the weight rows by s
    expected = compensated_codes(weight / divided[:, None], Compensation.of(calibration.samples["x"] * divided, 1.0), 8)
    np.testing.assert_array_equal(built["mm/w_q"], expected[0])
    np.testing.assert_allclose(built["mm/w_scale"], expected[1], rtol=1e-6)
    nearest = quantize_weight(weight / divided[:, None], 8)[0]
    assert (built["mm/w_q"] != nearest).any()


def test_a_build_rounds_each_weight_once_for_the_same_input_smoothing_and_bits():
    rng = np.random.default_rng(6)
    weight = rng.normal(0, 0.2, (WIDTH, OUT)).astype(np.float32)
    rounding = CompensatedRounding({"x": correlated_rows(rng, 200)}, 1.0)
    first = rounding.codes("x", weight, None, 8)
    assert rounding.codes("x", weight.copy(), None, 8) is first  # the search's next trial
    smoothed = rounding.codes("x", weight * 2, np.full(WIDTH, 0.5, np.float32), 8)
    assert smoothed is not first and rounding.codes("x", weight, None, 8) is first
    assert rounding.codes("x", weight, None, 7)[0].max() <= 63 and len(rounding._codes) == 3
    assert rounding.covers("x") and not rounding.covers("y")
