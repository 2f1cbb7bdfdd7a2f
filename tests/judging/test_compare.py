"""conformance.judging.compare: hand-computed figures, NaN/Inf positions, the overflow rule, JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conformance.judging.allowance import Factors
from conformance.judging.compare import compare
from conformance.judging.tolerances import Tolerance
from conformance.results.schema import jsonable

INF = math.inf
NAN = math.nan
# Powers of two keep every hand-computed figure exact.
QUARTER = Tolerance(rtol=0.25, atol=0.25, cond=0.0, source="test rule[0]", why="hand-made")
EXACT = Tolerance(rtol=0.0, atol=0.0, cond=0.0, source="test rule[1]", why="exact")


def arr(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float64)


def test_failing_comparison_figures_by_hand():
    # allowed = 0.25 + 0.25 |e| = 0.5, 0.75, 1.25; |a - e| = 0.25, 0, 2 -> ratios 0.5, 0, 1.6
    c = compare("y", arr(1.25, 2.0, -6.0), arr(1.0, 2.0, -4.0), QUARTER, "float16")
    assert c.output == "y"
    assert c.numel == 3
    assert c.mismatched == 1
    assert c.worst_ratio == 1.6
    assert c.worst_index == (2,)
    assert c.actual_at_worst == -6.0
    assert c.expected_at_worst == -4.0
    assert c.max_abs == 2.0
    assert c.max_rel == 0.5  # 2 / 4 beats 0.25 / 1
    # float16 spacing at 4 is 2**-8 and at 1 is 2**-10: 2 / 2**-8 = 512 beats 0.25 / 2**-10 = 256.
    assert c.max_ulp == 512.0
    assert not c.passed
    assert c.problem == ""


def test_passing_comparison_keeps_its_figures():
    c = compare("dx", arr(1.125, -2.0), arr(1.0, -2.25), QUARTER, "float32")
    # allowed 0.5 and 0.8125; |a - e| = 0.125 and 0.25 -> ratios 0.25 and 0.3076923...
    assert c.passed
    assert c.mismatched == 0
    assert c.worst_ratio == pytest.approx(0.25 / 0.8125)
    assert c.worst_index == (1,)
    assert c.max_abs == 0.25
    assert c.max_rel == pytest.approx(0.125)
    # float32 spacing at 1 is 2**-23 and at 2.25 is 2**-22: 0.125 * 2**23 = 2**20 = 0.25 * 2**22
    assert c.max_ulp == 2.0**20


def test_ratio_exactly_one_passes():
    c = compare("y", arr(1.5), arr(1.0), QUARTER, "float32")
    assert c.worst_ratio == 1.0
    assert c.passed
    assert c.mismatched == 0


def test_worst_index_is_multidimensional():
    expected = np.zeros((2, 3))
    actual = expected.copy()
    actual[1, 2] = 0.375
    actual[0, 1] = 0.125
    c = compare("y", actual, expected, QUARTER, "float32")
    assert c.worst_index == (1, 2)
    assert c.worst_ratio == 1.5
    assert c.mismatched == 1


def test_effective_atol_adds_scale_and_conditioning():
    tol = Tolerance(rtol=0.0, atol=0.25, cond=16.0, source="t", why="w")
    c = compare(
        "y", arr(1.5), arr(1.0), tol, "float32", Factors(scale=2.0, mean_error=2.0**-6, sensitivity=2.0)
    )
    # atol_eff = 0.25 * 2 + 16 * 2**-6 * 2 = 0.5 + 0.5 = 1.0; |a - e| = 0.5
    assert c.tolerance.atol_effective == 1.0
    assert c.worst_ratio == 0.5
    assert (c.scale, c.mean_error, c.sensitivity) == (2.0, 2.0**-6, 2.0)


def test_mean_error_term_stops_at_the_bound_of_the_normalized_values():
    tol = Tolerance(rtol=0.0, atol=0.25, cond=16.0, source="t", why="w")
    # 16 * 1 = 16 would exceed |xhat| <= 2 (a group of 4 values): the term is 2 * sensitivity 0.5 = 1.
    c = compare("y", arr(2.5), arr(1.0), tol, "float32", Factors(1.0, 1.0, 0.5, mean_cap=2.0))
    assert c.tolerance.atol_effective == 0.25 + 1.0
    assert c.worst_ratio == 1.5 / 1.25
    assert not c.passed and c.mean_cap == 2.0


def test_zero_scale_asks_for_an_exact_zero():
    tol = Tolerance(rtol=0.5, atol=0.5, cond=16.0, source="t", why="w")
    assert compare("dweight", arr(0.0, -0.0), arr(0.0, 0.0), tol, "float32", Factors(scale=0.0)).passed
    c = compare("dweight", arr(0.0, 2.0**-60), arr(0.0, 0.0), tol, "float32", Factors(scale=0.0))
    assert not c.passed and c.worst_ratio == float("inf")


def test_zero_tolerance_demands_exact_equality():
    assert compare("y", arr(0.0, 3.0), arr(0.0, 3.0), EXACT, "float32").passed
    c = compare("y", arr(0.0, 3.0 + 2.0**-20), arr(0.0, 3.0), EXACT, "float32")
    assert c.worst_ratio == INF
    assert c.worst_index == (1,)


def test_max_rel_of_a_difference_against_a_zero_expected_is_inf():
    c = compare("y", arr(0.125), arr(0.0), QUARTER, "float32")
    assert c.passed  # atol covers it
    assert c.max_rel == INF


def test_lower_precision_actual_is_upcast():
    actual = np.array([1.0, 2.0], dtype=np.float16)
    assert compare("y", actual, arr(1.0, 2.0), EXACT, "float16").passed


# ---------------------------------------------------------------- NaN and Inf positions


def test_nan_in_both_at_the_same_place_passes():
    c = compare("y", arr(NAN, 1.0), arr(NAN, 1.0), QUARTER, "float32")
    assert c.passed
    assert c.worst_ratio == 0.0


def test_nan_only_in_actual_fails_with_infinite_ratio():
    c = compare("y", arr(1.0, NAN, 3.0), arr(1.0, 2.0, 3.0), QUARTER, "float32")
    assert not c.passed
    assert c.worst_ratio == INF
    assert c.worst_index == (1,)
    assert c.mismatched == 1
    assert c.max_abs == 0.0  # figures come from positions finite on both sides


def test_nan_only_in_expected_fails():
    c = compare("y", arr(2.0), arr(NAN), QUARTER, "float32")
    assert not c.passed
    assert c.worst_ratio == INF


def test_nan_at_different_places_fails():
    c = compare("y", arr(NAN, 1.0), arr(1.0, NAN), QUARTER, "float32")
    assert c.mismatched == 2
    assert c.worst_ratio == INF


def test_same_signed_inf_passes():
    c = compare("y", arr(INF, -INF, 1.0), arr(INF, -INF, 1.0), QUARTER, "float32")
    assert c.passed
    assert c.worst_ratio == 0.0


def test_same_signed_inf_passes_ignoring_the_warning():
    with np.errstate(invalid="ignore"):
        c = compare("y", arr(INF, -INF, 1.0), arr(INF, -INF, 1.0), QUARTER, "float32")
    assert c.passed
    assert c.worst_ratio == 0.0
    assert c.max_abs == 0.0


def test_opposite_signed_inf_fails():
    c = compare("y", arr(1.0, -INF), arr(1.0, INF), QUARTER, "float32")
    assert not c.passed
    assert c.worst_ratio == INF
    assert c.worst_index == (1,)


def test_finite_actual_against_inf_expected_fails():
    c = compare("y", arr(3.0e38), arr(INF), QUARTER, "float32")
    assert not c.passed
    assert c.worst_ratio == INF


def test_inf_actual_against_finite_expected_fails():
    c = compare("y", arr(INF), arr(1.0), QUARTER, "float32")
    assert not c.passed
    assert c.worst_ratio == INF


def test_shape_mismatch_is_a_problem():
    c = compare("dweight", np.zeros((3, 2)), np.zeros((2, 3)), QUARTER, "float32")
    assert c.problem == "shape (3, 2) returned, (2, 3) expected"
    assert not c.passed
    assert c.numel == 6
    assert c.mismatched == 6
    assert c.worst_ratio == INF
    assert c.worst_index == ()


def test_empty_arrays_compare_cleanly():
    c = compare("y", np.zeros((0, 4)), np.zeros((0, 4)), QUARTER, "float32")
    assert c.passed
    assert c.numel == 0
    assert c.worst_index == ()


# ---------------------------------------------------------------- overflow rule


@pytest.mark.parametrize("actual", [INF, 65504.0])
def test_exact_value_beyond_float16_max_may_round_to_inf_or_max_of_its_sign(actual):
    c = compare("y", np.array([actual, 1.0], dtype=np.float16), arr(70000.0, 1.0), QUARTER, "float16")
    assert c.passed
    assert c.worst_ratio == 0.0
    negative = compare("y", np.array([-actual], dtype=np.float16), arr(-70000.0), QUARTER, "float16")
    assert negative.passed


def test_inf_is_right_where_a_value_within_the_allowance_rounds_to_it():
    # 65041 + 512 passes the float16 rounding boundary 65520 (max 65504 + half its ulp of 32): a value
    # the allowance admits would round to inf, so inf of that sign is within tolerance.
    wide = Tolerance(rtol=0.0, atol=512.0, cond=0.0, source="test rule[2]", why="hand-made")
    assert compare("dx", np.array([-INF], dtype=np.float16), arr(-65041.0), wide, "float16").passed
    # With 256 the admitted values stop at 65297, which rounds to a finite float16: an overflow there
    # is a kernel that overflowed early, and fails.
    narrow = Tolerance(rtol=0.0, atol=256.0, cond=0.0, source="test rule[3]", why="hand-made")
    early = compare("dx", np.array([-INF], dtype=np.float16), arr(-65041.0), narrow, "float16")
    assert not early.passed and early.worst_ratio == INF
    assert not compare("dx", np.array([INF], dtype=np.float16), arr(-65041.0), wide, "float16").passed


def test_overflow_to_the_opposite_sign_fails():
    c = compare("y", np.array([-INF], dtype=np.float16), arr(70000.0), QUARTER, "float16")
    assert not c.passed
    assert c.worst_ratio == INF


def test_overflow_rule_applies_only_beyond_the_case_dtype():
    # 70000 fits float32, so inf is simply wrong there.
    assert not compare("y", arr(INF), arr(70000.0), QUARTER, "float32").passed
    # A finite value well below the float16 limit is not excused either.
    assert not compare("y", arr(60000.0), arr(70000.0), EXACT, "float16").passed


# ---------------------------------------------------------------- serialisation


@pytest.mark.parametrize(
    ("actual", "expected"),
    [
        (arr(1.25, 2.0), arr(1.0, 2.0)),
        (arr(NAN, 2.0), arr(1.0, 2.0)),
        (arr(1.0), arr(NAN)),
        (arr(-INF), arr(INF)),
        (np.zeros(3), np.zeros(2)),
    ],
)
def test_to_dict_is_strict_json(actual, expected):
    c = compare("y", actual, expected, QUARTER, "float32")
    text = json.dumps(c.to_dict(), allow_nan=False)
    record = json.loads(text)
    assert record["output"] == "y"
    assert record["tolerance"]["source"] == "test rule[0]"
    assert record["tolerance"]["why"] == "hand-made"
    assert record["worst_index"] == list(c.worst_index)
    if c.worst_ratio == INF:
        assert record["worst_ratio"] == "inf"


def test_to_dict_figures():
    record = compare("y", arr(1.25, 2.0, -6.0), arr(1.0, 2.0, -4.0), QUARTER, "float16").to_dict()
    assert record["worst_ratio"] == 1.6
    assert record["worst_index"] == [2]
    assert record["mismatched"] == 1
    assert record["numel"] == 3
    assert record["max_ulp"] == 512.0
    assert record["tolerance"]["atol_effective"] == 0.25
    assert record["problem"] == ""


def test_jsonable():
    assert jsonable(1.5) == 1.5
    assert jsonable(INF) == "inf"
    assert jsonable(-INF) == "-inf"
    assert jsonable(NAN) == "nan"
