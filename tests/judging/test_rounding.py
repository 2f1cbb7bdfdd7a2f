"""Rounding is part of conformance: bit-exact residuals, the rounding-bias statistic, the mismatch
fraction, and non-finite values that propagate (conformance.judging.rounding, the nonfinite property)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from conformance.judging import rounding
from conformance.judging.compare import compare
from conformance.judging.tolerances import Tolerance
from conformance.model.dtypes import round_to
from conformance.results.result import ComparisonRecord, RoundingRecord

from fakes.core import directed

LOOSE = Tolerance(rtol=0.01, atol=0.01, cond=0.0, source="t", why="w")


def _exact(n: int, seed: int = 0) -> np.ndarray:
    """Values spread over many ulps and both signs, as a normalization's outputs are."""
    return np.random.default_rng(seed).standard_normal(n) * 3.0


def test_the_limit_is_hoeffdings_bound():
    assert rounding.limit(256) == pytest.approx(math.sqrt(2 * math.log(2 / rounding.ALPHA) / 256))
    assert rounding.limit(256) < 0.35  # -1/2 (truncation) is told apart from the smallest judged count
    assert rounding.limit(10**6) < 0.006


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_round_to_nearest_passes_and_directed_rounding_fails(dtype):
    exact = _exact(4000)
    nearest = rounding.bias(round_to(exact, dtype), exact, dtype)
    assert nearest is not None and nearest.judged and nearest.passed
    assert abs(nearest.bias) < 0.05 and abs(nearest.drift) < 0.05
    toward_zero = rounding.bias(directed(exact, dtype, "zero"), exact, dtype)
    assert toward_zero is not None and not toward_zero.passed
    assert toward_zero.bias == pytest.approx(-0.5, abs=0.05)
    up = rounding.bias(directed(exact, dtype, "up"), exact, dtype)
    assert up is not None and not up.passed
    assert up.drift == pytest.approx(0.5, abs=0.05) and abs(up.bias) < 0.1  # mixed signs: bias averages out


def test_a_shrunk_scale_is_a_bias_toward_zero():
    """Every output 0.3 ulp too small in magnitude (a scale error inside the tolerance) is a bias too."""
    exact = _exact(4000)
    shrunk = round_to(exact * (1 - 0.3 * 2.0**-8), "bfloat16")
    record = rounding.bias(shrunk, exact, "bfloat16")
    assert record is not None and record.bias < -0.1


def test_few_elements_are_recorded_not_judged():
    exact = _exact(rounding.MIN_ELEMENTS - 1)
    record = rounding.bias(directed(exact, "float16", "zero"), exact, "float16")
    assert record is not None and not record.judged and record.passed
    assert record.bias < -0.3  # recorded all the same


def test_only_half_precision_outputs_are_judged():
    exact = _exact(1000)
    assert rounding.bias(exact.astype(np.float32), exact, "float32") is None


def test_mismatch_fraction_counts_elements_off_the_correctly_rounded_value():
    exact = _exact(1000)
    assert rounding.mismatch_fraction(round_to(exact, "bfloat16"), exact, "bfloat16") == 0.0
    truncated = directed(exact, "bfloat16", "zero")
    assert 0.4 < rounding.mismatch_fraction(truncated, exact, "bfloat16") < 0.6
    with_nan = np.array([np.nan, 1.0])
    assert rounding.mismatch_fraction(with_nan, with_nan, "float32") == 0.0


def test_a_biased_output_fails_its_comparison_within_tolerance():
    exact = _exact(4000)
    c = compare("y", directed(exact, "bfloat16", "zero"), exact, LOOSE, "bfloat16")
    assert c.worst_ratio <= 1 and not c.passed and not c.rounding_passed
    good = compare("y", round_to(exact, "bfloat16"), exact, LOOSE, "bfloat16")
    assert good.passed and good.mismatch_fraction == 0.0


def test_rounding_figures_survive_the_results_file():
    exact = _exact(4000)
    c = compare("y", directed(exact, "float16", "zero"), exact, LOOSE, "float16")
    back = ComparisonRecord.from_dict(c.to_dict())
    assert back.rounding == c.rounding and back.mismatch_fraction == c.mismatch_fraction
    old = c.to_dict()
    del old["rounding"], old["mismatch_fraction"]
    legacy = ComparisonRecord.from_dict(old)
    assert legacy.rounding is None and math.isnan(legacy.mismatch_fraction) and legacy.passed
    assert RoundingRecord.from_dict({"bias": -0.5, "n": 10}).judged is False


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_float32_intermediate_never_changes_a_rounded_sum_of_two_half_values(dtype):
    """Why residual_out is compared bit for bit: round(x + r) through float32 equals the correctly
    rounded sum for x, r in the same half dtype, at every exponent difference (docs/tolerances.md)."""
    rng = np.random.default_rng(7)
    n = 400_000
    kind = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    span = 14 if dtype == "float16" else 60
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-span, span, n))).astype(kind)
    r = (rng.standard_normal(n) * np.exp2(rng.integers(-span, span, n))).astype(kind)
    # Exact within 53 bits; past that the smaller addend is too small to move a half-precision rounding.
    wide = x.astype(np.float64) + r.astype(np.float64)
    direct = round_to(wide, dtype).astype(np.float64)
    through_float32 = (x.astype(np.float32) + r.astype(np.float32)).astype(kind).astype(np.float64)
    finite = np.isfinite(direct)
    assert np.array_equal(direct[finite], through_float32[finite])


# ----------------------------------------------------------------------------- broken fakes, caught
HALF_CASES = "layer_norm-bfloat16-12x100-eps1e-05-normal or rms_norm-float16-12x100-eps1e-05-normal"


def _comparisons(run, check):
    return {
        (r["case"]["id"], c["output"]): (r["outcome"], c, r["reason"])
        for r in run.records
        if r["check"] == check
        for c in r["comparisons"]
    }


@pytest.mark.parametrize(
    ("fake", "statistic", "sign"), [("fake-truncated-half", "bias", -1), ("fake-rounds-up", "drift", 1)]
)
def test_directed_rounding_fakes_fail_on_their_statistic(suite, fake, statistic, sign):
    run = suite("--backend", fake, "--profile", "ci", "-k", HALF_CASES, "-n", "0")
    assert run.returncode == 1, run.output[-3000:]
    forward = _comparisons(run, "forward")
    for case in ("layer_norm-bfloat16-12x100-eps1e-05-normal", "rms_norm-float16-12x100-eps1e-05-normal"):
        outcome, c, reason = forward[(case, "y")]
        assert outcome == "failed" and c["worst_ratio"] <= 1  # every element within tolerance
        value = c["rounding"][statistic]
        assert sign * value > 0.4 and abs(value) > c["rounding"]["limit"], c["rounding"]
        assert 0.3 < c["mismatch_fraction"] < 0.7
        assert "output 'y' rounds with a bias" in reason and f"{statistic} {value:+.3f}" in reason


def test_truncated_residual_fails_the_bit_exact_comparison(suite):
    run = suite(
        "--backend",
        "fake-truncated-residual",
        "--profile",
        "ci",
        "-k",
        "add_rms_norm-bfloat16-12x100-eps1e-05-normal",
        "-n",
        "0",
    )
    assert run.returncode == 1, run.output[-3000:]
    forward = _comparisons(run, "forward")
    outcome, c, reason = forward[("add_rms_norm-bfloat16-12x100-eps1e-05-normal", "residual_out")]
    assert outcome == "failed" and c["tolerance"]["atol_effective"] == 0 and c["worst_ratio"] == "inf"
    assert "output 'residual_out' out of tolerance" in reason and "mismatch fraction" in reason
    assert 0.1 < c["mismatch_fraction"] < 0.7 and c["rounding"]["bias"] < 0
    assert forward[("add_rms_norm-bfloat16-12x100-eps1e-05-normal", "y")][1]["worst_ratio"] <= 1


@pytest.mark.parametrize(
    ("fake", "caught"),
    [("fake-nonfinite-rows-zeroed", True), ("fake-nan-dropping-clamp", True), ("fake-numpy", False)],
)
def test_swallowed_nan_fails_the_nonfinite_property(suite, fake, caught):
    # The full profile's budget (100 examples, 120 s) rather than ci's 3 s: on a loaded machine the ci
    # budget can end before an example that poisons the row the fake mishandles is drawn. The property's
    # own name selects it alone (the fakes' names match "nonfinite" in every check of the profile).
    run = suite("--backend", fake, "--profile", "full", "-k", "nonfinite_containment")
    assert run.returncode == int(caught), run.output[-3000:]
    (record,) = [r for r in run.kind("property") if r["property"] == "nonfinite_containment"]
    if not caught:  # the correct fake propagates NaN and Inf exactly as the oracle does
        assert record["outcome"] == "passed" and record["examples"] > 5
        return
    assert record["outcome"] == "failed"
    assert "where the exact answer is np.float64(nan)" in record["reason"]
    assert "finite where they must not be" in record["reason"]
