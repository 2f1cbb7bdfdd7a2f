"""conformance.model.inputs: deterministic, typed inputs whose distributions have their stated properties."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from conformance.model import profiles
from conformance.model.case import DISTS, Case
from conformance.model.dtypes import finfo, numpy_dtype
from conformance.model.inputs import OFFSET_KAPPA, OUTLIER_VALUE, make_inputs, specs

FP16_MAX = 65504.0

CASES = [
    Case("layer_norm", (6, 40), "float32", 1e-5),
    Case("layer_norm", (2, 3, 8), "bfloat16", 1e-5, norm_ndim=2, param_dtype="float32"),
    Case("rms_norm", (5, 16), "float16", 1e-6, weight_offset=1.0),
    Case("rms_norm", (3, 7), "float64", 1e-6, weight=False),
    Case("batch_norm", (4, 3, 5), "bfloat16", 1e-5, training=True),
    Case("batch_norm", (8, 2), "float16", 1e-5, param_dtype="float32", bias=False),
]


def f64(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def grouped(case: Case, x: np.ndarray) -> np.ndarray:
    """x as (groups, group length): LN/RMS rows, BN channels."""
    values = f64(x)
    if case.op == "batch_norm":
        return np.moveaxis(values, 1, 0).reshape(case.shape[1], -1)
    return values.reshape(case.rows, -1)


def expected_names(case: Case, grad: bool) -> set[str]:
    names = {"x"}
    if case.weight:
        names.add("weight")
    if case.bias:
        names.add("bias")
    if case.op == "batch_norm":
        names |= {"running_mean", "running_var"}
    if grad:
        names.add("dy")
    return names


# ---------------------------------------------------------------- determinism and identity


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_inputs_are_bitwise_deterministic_across_calls(case):
    first, second = make_inputs(case), make_inputs(case)
    assert first.keys() == second.keys()
    for name in first:
        assert first[name].dtype == second[name].dtype
        assert first[name].tobytes() == second[name].tobytes(), name


def test_inputs_do_not_depend_on_the_python_hash_seed():
    # Seeding must come from a digest of the id, never hash(): another process and hash seed agree.
    code = (
        "import hashlib; from conformance.model.case import Case;"
        " from conformance.model.inputs import make_inputs\n"
        "i = make_inputs(Case('layer_norm', (6, 40), 'bfloat16', 1e-5, dist='outlier'))\n"
        "print(hashlib.sha256(b''.join(i[k].tobytes() for k in sorted(i))).hexdigest())\n"
    )
    digests = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        digests.add(done.stdout.strip())
    local = make_inputs(Case("layer_norm", (6, 40), "bfloat16", 1e-5, dist="outlier"))
    digests.add(hashlib.sha256(b"".join(local[k].tobytes() for k in sorted(local))).hexdigest())
    assert len(digests) == 1


def test_different_seeds_give_different_inputs():
    a = make_inputs(Case("layer_norm", (6, 40), "float32", 1e-5, seed=0))
    b = make_inputs(Case("layer_norm", (6, 40), "float32", 1e-5, seed=1))
    for name in ("x", "weight", "bias", "dy"):
        assert not np.array_equal(a[name], b[name]), name


def test_different_cases_give_different_inputs():
    a = make_inputs(Case("layer_norm", (6, 40), "float32", 1e-5))
    b = make_inputs(Case("rms_norm", (6, 40), "float32", 1e-5))
    c = make_inputs(Case("layer_norm", (6, 40), "float32", 1e-6))
    assert not np.array_equal(a["x"], b["x"])
    assert not np.array_equal(a["x"], c["x"])
    assert not np.array_equal(a["dy"], b["dy"])


# ---------------------------------------------------------------- names, dtypes, layout


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_names_dtypes_shapes_and_layout(case, grad):
    inputs = make_inputs(case, grad=grad)
    assert set(inputs) == expected_names(case, grad)
    for name, values in inputs.items():
        activation = name in ("x", "dy")
        assert values.dtype == numpy_dtype(case.dtype if activation else case.weight_dtype), name
        assert values.shape == (case.shape if activation else case.param_shape), name
        assert values.flags.c_contiguous, name
        assert np.isfinite(f64(values)).all(), name


def test_bfloat16_is_carried_as_ml_dtypes_bfloat16():
    inputs = make_inputs(Case("layer_norm", (4, 8), "bfloat16", 1e-5, param_dtype="bfloat16"))
    for values in inputs.values():
        assert values.dtype == np.dtype(ml_dtypes.bfloat16)


def test_grad_false_has_no_dy_and_same_other_inputs():
    case = CASES[0]
    with_grad, without = make_inputs(case, grad=True), make_inputs(case, grad=False)
    assert "dy" not in without
    for name, values in without.items():
        assert values.tobytes() == with_grad[name].tobytes()


@pytest.mark.parametrize("dist", DISTS)
def test_dy_is_never_all_ones(dist):
    for shape in ((1,), (4, 8)):
        dy = f64(make_inputs(Case("layer_norm", shape, "float32", 1e-5, dist=dist))["dy"])
        assert not np.all(dy == 1.0)
        assert np.unique(dy).size == dy.size  # random values, not a constant


def test_weights_centre_on_one_or_on_zero_with_an_offset():
    plain = f64(make_inputs(Case("rms_norm", (4, 512), "float32", 1e-5))["weight"])
    gemma = f64(make_inputs(Case("rms_norm", (4, 512), "float32", 1e-5, weight_offset=1.0))["weight"])
    assert abs(plain.mean() - 1.0) < 0.1
    assert abs(gemma.mean()) < 0.1


# ---------------------------------------------------------------- distribution properties


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "batch_norm"])
@pytest.mark.parametrize("dtype", list(OFFSET_KAPPA))
def test_offset_mean_to_spread_is_offset_kappa(op, dtype):
    shape = (200, 4) if op == "batch_norm" else (4, 200)
    case = Case(op, shape, dtype, 1e-5, dist="offset")
    groups = grouped(case, make_inputs(case)["x"])
    ratio = np.abs(groups.mean(axis=1)) / groups.std(axis=1)
    assert np.all(ratio > OFFSET_KAPPA[dtype] / 1.5)
    assert np.all(ratio < OFFSET_KAPPA[dtype] * 1.5)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "batch_norm"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("eps", [1e-12, 1e-5, 1e-2])
def test_near_constant_group_variance_far_below_eps(op, dtype, eps):
    shape = (64, 3) if op == "batch_norm" else (3, 64)
    case = Case(op, shape, dtype, eps, dist="near_constant")
    groups = grouped(case, make_inputs(case)["x"])
    variance = groups.var(axis=1)
    assert np.all(variance > 0)  # not constant: the spread still shows
    assert np.all(variance < 1e-2 * eps)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("op", "shape"),
    [("layer_norm", (5, 33)), ("rms_norm", (2, 3, 4)), ("batch_norm", (6, 4)), ("batch_norm", (2, 3, 4, 5))],
)
def test_constant_has_zero_variance_per_group(op, shape, dtype):
    case = Case(op, shape, dtype, 1e-5, dist="constant")
    groups = grouped(case, make_inputs(case)["x"])
    assert np.all(groups == groups[:, :1])
    assert np.unique(groups[:, 0]).size > 1  # constant per group, not one constant everywhere


def test_constant_batch_norm_is_constant_per_channel_not_per_row():
    case = Case("batch_norm", (6, 4, 3), "float32", 1e-5, dist="constant")
    x = f64(make_inputs(case)["x"])
    assert np.all(x == x[:1, :, :1])
    assert np.unique(x[0, :, 0]).size == 4


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("op", "shape"), [("layer_norm", (7, 50)), ("batch_norm", (10, 3, 5)), ("rms_norm", (3, 1))]
)
def test_outlier_has_exactly_one_huge_element_per_group(op, shape, dtype):
    case = Case(op, shape, dtype, 1e-5, dist="outlier")
    groups = grouped(case, make_inputs(case)["x"])
    huge = np.abs(groups) >= OUTLIER_VALUE[dtype] / 2
    assert np.all(huge.sum(axis=1) == 1)
    assert np.all(np.abs(groups[~huge]) < 10)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "batch_norm"])
def test_large_float16_squares_overflow_float16(op):
    case = Case(op, (12, 100), "float16", 1e-5, dist="large")
    x = f64(make_inputs(case)["x"])
    assert np.isfinite(x).all()
    assert np.max(x**2) > FP16_MAX
    assert np.max(np.abs(x)) <= FP16_MAX


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_float32_squares_approach_the_limit_but_stay_finite(dtype):
    case = Case("layer_norm", (12, 100), dtype, 1e-5, dist="large")
    x = f64(make_inputs(case)["x"])
    limit = float(finfo(dtype).max)
    assert np.max(x**2) > 1e-3 * limit  # near the top of the range...
    assert np.sum(x**2, axis=1).max() < limit  # ...but row sums of squares stay finite


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_small_squares_fall_below_the_normal_range(dtype):
    case = Case("layer_norm", (12, 100), dtype, 1e-5, dist="small")
    x = f64(make_inputs(case)["x"])
    assert np.count_nonzero(x) > 0.9 * x.size  # the values themselves survive rounding
    assert np.max(x**2) < float(finfo(dtype).tiny)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "batch_norm"])
def test_zeros_are_zeros(op):
    case = Case(op, (4, 3, 5), "bfloat16", 1e-5, dist="zeros")
    assert not np.any(f64(make_inputs(case)["x"]))


def _small_cases(profile: str) -> list[Case]:
    # The LLM-sized rows of `full` only repeat the `normal` draw at scale; keep the test fast.
    return [c for c in profiles.cases(profile) if np.prod(c.shape) <= 100_000]


@pytest.mark.parametrize("profile", ["ci", "full"])
def test_every_profile_input_is_finite_and_running_var_non_negative(profile):
    for case in _small_cases(profile):
        inputs = make_inputs(case)
        for name, values in inputs.items():
            assert np.isfinite(f64(values)).all(), f"{case.id}: {name}"
        if case.op == "batch_norm":
            assert np.all(f64(inputs["running_var"]) >= 0), case.id


# (dtype, dist, param_dtype) whose running_mean overflows the parameter dtype today.
OVERFLOWING = {
    ("float64", "large", "float32"),
    ("float64", "large", "float16"),
    ("float64", "large", "bfloat16"),
    ("float64", "offset", "float16"),
    ("float64", "outlier", "float16"),
    ("float32", "large", "float16"),
    ("bfloat16", "large", "float16"),
}


def _running_stat_params() -> list[object]:
    params: list[object] = []
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        for dist in DISTS:
            for param_dtype in (None, "float64", "float32", "float16", "bfloat16"):
                marks = []
                params.append(
                    pytest.param(dtype, dist, param_dtype, marks=marks, id=f"{dtype}-{dist}-p{param_dtype}")
                )
    return params


@pytest.mark.parametrize(("dtype", "dist", "param_dtype"), _running_stat_params())
def test_batch_norm_running_stats_finite_and_non_negative(dtype, dist, param_dtype):
    case = Case("batch_norm", (32, 4, 3), dtype, 1e-5, dist=dist, param_dtype=param_dtype, training=True)
    inputs = make_inputs(case)
    running_var = f64(inputs["running_var"])
    assert np.isfinite(running_var).all()
    assert np.all(running_var >= 0)
    assert np.isfinite(f64(inputs["running_mean"])).all()


@pytest.mark.parametrize("profile", ["smoke", "ci"])
def test_specs_describe_the_drawn_inputs(profile):
    """inputs.specs gives, without drawing them, the names, shapes and dtypes make_inputs returns."""
    for case in profiles.cases(profile)[::3]:
        for grad in (False, True):
            drawn = make_inputs(case, grad=grad)
            want = {name: (tuple(a.shape), a.dtype.name) for name, a in drawn.items()}
            got = {name: (tuple(shape), dtype) for name, (shape, dtype) in specs(case, grad=grad).items()}
            assert got == want, case.id
