"""conformance.model.profiles: the coverage of the ci and full profiles, and grid hygiene."""

from __future__ import annotations

import math

import pytest

from conformance.model import profiles
from conformance.model.case import DISTS
from conformance.model.dtypes import DTYPES

ROW_OPS = ("layer_norm", "rms_norm")


@pytest.fixture(scope="module")
def ci():
    return profiles.cases("ci")


@pytest.fixture(scope="module")
def full():
    return profiles.cases("full")


def features_of(case) -> int:
    """Normalized length of an LN/RMS row (product of the normalized dims)."""
    return math.prod(case.param_shape)


@pytest.mark.parametrize("profile", ["ci", "full"])
def test_every_dtype_is_present(profile):
    cases = profiles.cases(profile)
    assert {c.dtype for c in cases} == set(DTYPES)
    for op in ("layer_norm", "rms_norm", "batch_norm"):
        assert {c.dtype for c in cases if c.op == op} == set(DTYPES), op


def test_ci_eps_spans_1e12_to_1e2(ci):
    eps = {c.eps for c in ci}
    assert min(eps) <= 1e-12
    assert max(eps) >= 1e-2
    for op in ("layer_norm", "rms_norm", "batch_norm"):
        op_eps = {c.eps for c in ci if c.op == op}
        assert min(op_eps) <= 1e-12 and max(op_eps) >= 1e-2, op


def test_ci_feature_sizes_from_1_to_8192_with_non_powers_of_two(ci):
    for op in ROW_OPS:
        sizes = {c.shape[-1] for c in ci if c.op == op}
        assert 1 in sizes, op
        assert max(sizes) >= 8192, op
        assert any(n & (n - 1) for n in sizes), op  # some n is not a power of two


def test_ci_has_a_case_with_at_least_4096_rows(ci):
    for op in ROW_OPS:
        assert max(c.rows for c in ci if c.op == op) >= 4096, op


def test_ci_normalizes_one_and_two_trailing_dims(ci):
    for op in ROW_OPS:
        assert {c.norm_ndim for c in ci if c.op == op} >= {1, 2}, op


def test_ci_weight_and_bias_on_and_off(ci):
    for op in ("layer_norm", "batch_norm"):
        pairs = {(c.weight, c.bias) for c in ci if c.op == op}
        assert pairs == {(True, True), (True, False), (False, True), (False, False)}, op
    assert {c.weight for c in ci if c.op == "rms_norm"} == {True, False}
    assert not any(c.bias for c in ci if c.op == "rms_norm")


def test_ci_has_gemma_rms_norm(ci):
    gemma = [c for c in ci if c.op == "rms_norm" and c.weight_offset == 1.0]
    assert gemma
    assert {c.dtype for c in gemma} == set(DTYPES)


def test_ci_batch_norm_eval_and_training_with_momenta_and_none(ci):
    bn = [c for c in ci if c.op == "batch_norm"]
    assert {c.training for c in bn} == {True, False}
    momenta = {c.momentum for c in bn if c.training}
    assert None in momenta
    assert len(momenta - {None}) >= 2
    assert {len(c.shape) for c in bn} >= {2, 3, 4}  # (N, C), (N, C, L), (N, C, H, W)


def test_ci_half_activations_with_float32_parameters(ci):
    for op in ("layer_norm", "rms_norm", "batch_norm"):
        mixed = {c.dtype for c in ci if c.op == op and c.weight_dtype == "float32" and c.dtype != "float32"}
        assert mixed >= {"float16", "bfloat16"}, op


def test_ci_covers_every_distribution_for_row_ops(ci):
    for op in ROW_OPS:
        assert {c.dist for c in ci if c.op == op} == set(DISTS), op


@pytest.mark.parametrize("profile", profiles.PROFILES)
def test_every_grid_has_a_why_and_yields_cases(profile):
    for grid in profiles._GRIDS[profile]:
        assert grid.why.strip(), grid
        assert next(iter(grid.cases()), None) is not None, grid.why


def test_profile_sizes_are_ordered(ci, full):
    smoke = profiles.cases("smoke")
    assert 0 < len(smoke) < len(ci) < len(full)


def test_full_contains_ci(ci, full):
    assert {c.id for c in ci} <= {c.id for c in full}


@pytest.mark.parametrize("profile", profiles.PROFILES)
def test_profile_order_is_stable_and_ids_unique(profile):
    first = [c.id for c in profiles.cases(profile)]
    assert first == [c.id for c in profiles.cases(profile)]
    assert len(first) == len(set(first))


@pytest.mark.parametrize("profile", profiles.PROFILES)
def test_large_rows_stay_short_enough_for_float32_statistics(profile):
    # inputs.LARGE_SCALE relies on `large` rows of fewer than ~300 elements, the add ops' rows included
    # (their sum x + residual doubles the values: 4096 of them would overflow float32 statistics).
    for case in profiles.cases(profile):
        if case.dist == "large" and case.op in (*ROW_OPS, "add_layer_norm", "add_rms_norm"):
            assert features_of(case) < 300, case.id


def test_grid_skips_combinations_the_case_validator_rejects():
    grid = profiles.Grid(
        "test",
        {"op": ("layer_norm", "rms_norm"), "bias": (True, False)},
        {"shape": (2, 3), "dtype": "float32", "eps": 1e-5},
    )
    assert sorted((c.op, c.bias) for c in grid.cases()) == [
        ("layer_norm", False),
        ("layer_norm", True),
        ("rms_norm", False),
    ]


def test_unknown_profile_names_the_allowed_ones():
    with pytest.raises(ValueError, match="--profile='nightly' is not allowed; allowed: smoke, ci, full"):
        profiles.cases("nightly")
