"""The judging helpers on GroupNorm and InstanceNorm: the geometry view, scales, conditioning and
bounds against per-group loops over x, and against the ops GN/IN reduce to (LayerNorm, BatchNorm)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from conformance import oracle
from conformance.judging import bounds, conditioning, rounding, scales, tolerances
from conformance.judging.allowance import Factors, elementwise, factors
from conformance.judging.tolerances import Tolerance
from conformance.model.case import Case
from conformance.model.dtypes import round_to, stats_dtype, unit_roundoff
from conformance.model.geometry import geometry
from conformance.model.inputs import make_inputs
from conformance.model.outputs import output_dtype

Arrays = dict[str, np.ndarray]
# One rule for comparing allowances of two ops: every term of the allowance counts.
RULE = Tolerance(rtol=2.0**-10, atol=2.0**-9, cond=16.0, source="test", why="every term counts")
# Relative difference between figures the judging computes in different orders (rms over a
# parameter repeated L times vs over the parameter itself): a few float64 roundings.
SAME = 1e-13
GRAD_OUTPUTS = ("y", "dx", "dweight", "dbias")


def materials(case: Case) -> tuple[Arrays, Arrays]:
    inputs = make_inputs(case)
    return inputs, oracle.evaluate(case, inputs, grad=True)


def judged(case: Case, inputs: Arrays, expected: Arrays, output: str) -> tuple[Factors, float]:
    return factors(case, output, inputs, expected), bounds.bound(case, output, inputs, expected)


def channels(case: Case, values: np.ndarray) -> list[list[np.ndarray]]:
    """values[n, group g] as flat float64 arrays, by looping over the channels of each group."""
    per_group = case.shape[1] // case.groups
    x = values.astype(np.float64)
    return [
        [x[n, g * per_group : (g + 1) * per_group].ravel() for g in range(case.groups)]
        for n in range(case.shape[0])
    ]


def rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(np.asarray(values, dtype=np.float64)))))


# --- geometry ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "shape", "param_shape", "stats_shape"),
    [
        (
            Case("group_norm", (2, 6, 4, 5), "float32", 1e-5, num_groups=3),
            (2, 3, 2, 20),
            (3, 2, 1),
            (2, 3, 1, 1),
        ),
        (Case("group_norm", (3, 8), "float32", 1e-5, num_groups=2), (3, 2, 4, 1), (2, 4, 1), (3, 2, 1, 1)),
        (Case("instance_norm", (2, 3, 2, 2, 2), "float32", 1e-5), (2, 3, 1, 8), (3, 1, 1), (2, 3, 1, 1)),
    ],
    ids=lambda v: v.id if isinstance(v, Case) else "x".join(map(str, v)),
)
def test_groups_are_the_last_two_axes_of_a_view_of_x(
    case: Case, shape: tuple[int, ...], param_shape: tuple[int, ...], stats_shape: tuple[int, ...]
) -> None:
    geo = geometry(case)
    assert (geo.shape, geo.group_axes, geo.reduce_axes) == (shape, (2, 3), (0, 3))
    assert (geo.param_shape, geo.stats_shape) == (param_shape, stats_shape)
    x = make_inputs(case, grad=False)["x"]
    assert np.shares_memory(x.reshape(geo.shape), x)  # a view: judging copies nothing per group
    assert bounds.group_size(case) == math.prod(case.shape[1:]) // case.groups


# --- against loops over the groups ----------------------------------------------------------------

LOOP_CASES = [
    Case("group_norm", (2, 6, 5), "float32", 1e-5, num_groups=3),
    Case("group_norm", (3, 8, 2, 3), "bfloat16", 1e-5, num_groups=4, dist="offset", param_dtype="float32"),
    Case("group_norm", (2, 6), "float16", 1e-5, num_groups=2, dist="outlier"),
    Case("instance_norm", (2, 3, 7), "float32", 1e-5, dist="near_constant"),
    Case("instance_norm", (3, 2, 2, 3), "bfloat16", 1e-5, training=True, track_running_stats=True),
]


@pytest.mark.parametrize("case", LOOP_CASES, ids=lambda case: case.id)
def test_scales_and_conditioning_match_per_group_loops(case: Case) -> None:
    inputs, expected = materials(case)
    groups = [g for sample in channels(case, inputs["x"]) for g in sample]
    variances = np.array([np.mean(np.square(g - g.mean())) for g in groups])
    means = np.array([g.mean() for g in groups])
    rstd = 1 / np.sqrt(variances + case.eps)
    weight = inputs["weight"].astype(np.float64)
    dy_rms, terms = rms(inputs["dy"]), math.prod(case.shape) // case.shape[1]  # N x spatial per channel
    rms_xhat = math.sqrt(np.mean(variances / (variances + case.eps)))
    assert scales.scale(case, "dx", inputs, expected) == pytest.approx(
        max(rms(expected["dx"]), dy_rms * rms(weight) * rms(rstd)), rel=SAME
    )
    assert scales.scale(case, "dweight", inputs, expected) == pytest.approx(
        max(rms(expected["dweight"]), math.sqrt(terms) * dy_rms * rms_xhat), rel=SAME
    )
    assert scales.scale(case, "dbias", inputs, expected) == pytest.approx(
        max(rms(expected["dbias"]), math.sqrt(terms) * dy_rms), rel=SAME
    )
    assert scales.sensitivity(case, "dweight", inputs, expected) == pytest.approx(math.sqrt(terms) * dy_rms)
    kappa = float(np.max(np.abs(means) * rstd))
    assert conditioning.kappa(case, expected) == pytest.approx(kappa, rel=SAME)
    assert conditioning.mean_error(case, expected) == pytest.approx(
        unit_roundoff(stats_dtype(case.dtype)) * kappa, rel=SAME
    )


@pytest.mark.parametrize("case", LOOP_CASES, ids=lambda case: case.id)
def test_bounds_match_per_channel_loops(case: Case) -> None:
    """sqrt(n) bounds |xhat| with batch statistics; the parameter gradients sum N x spatial terms."""
    inputs, expected = materials(case)
    root_n = math.sqrt(math.prod(case.shape[1:]) // case.groups)
    weight, bias = (inputs[name].astype(np.float64) for name in ("weight", "bias"))
    dy = np.moveaxis(inputs["dy"].astype(np.float64), 1, 0).reshape(case.shape[1], -1)
    assert bounds.bound(case, "y", inputs, expected) == pytest.approx(
        float(np.max(np.abs(weight) * root_n + np.abs(bias))), rel=SAME
    )
    assert bounds.bound(case, "dweight", inputs, expected) == pytest.approx(
        float(np.max(root_n * np.abs(dy).sum(axis=1))), rel=SAME
    )
    assert bounds.bound(case, "dbias", inputs, expected) == pytest.approx(
        float(np.max(np.abs(dy).sum(axis=1))), rel=SAME
    )
    # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) per group, g = dy * weight, |mean(g xhat)| <= rms(g).
    g = inputs["dy"].astype(np.float64) * weight.reshape(-1, *(1,) * (len(case.shape) - 2))
    rstd = expected["rstd"].ravel()
    per_group = [v for sample in channels(case, g) for v in sample]
    dx_bound = max(
        float(np.max(r * (np.abs(v) + abs(v.mean()) + root_n * rms(v))))
        for r, v in zip(rstd, per_group, strict=True)
    )
    assert bounds.bound(case, "dx", inputs, expected) == pytest.approx(dx_bound, rel=SAME)


def test_instance_norm_running_variance_bound_counts_each_instance() -> None:
    """The unbiased instance variances divide by spatial - 1, not by the N x spatial - 1 of BatchNorm."""
    case = Case(
        "instance_norm", (6, 3, 2), "float32", 1e-5, training=True, track_running_stats=True, momentum=1.0
    )
    inputs, expected = materials(case)
    x = np.moveaxis(inputs["x"].astype(np.float64), 1, 0).reshape(case.shape[1], -1)
    u = unit_roundoff(stats_dtype(case.dtype))
    spread = x.max(axis=1) - x.min(axis=1) + 2 * u * np.abs(x).max(axis=1)
    spatial = case.shape[2]
    expected_bound = float(np.max(np.square(spread) * spatial / (spatial - 1)))
    assert bounds.bound(case, "running_var", inputs, expected) == pytest.approx(expected_bound, rel=SAME)
    assert np.max(expected["running_var"]) <= expected_bound


# --- against the ops GN/IN reduce to ---------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        Case("instance_norm", (2, 3, 7), "float32", 1e-5),
        Case("instance_norm", (2, 4, 2, 3), "bfloat16", 1e-5, dist="offset", weight=False, bias=False),
        Case(
            "instance_norm",
            (3, 2, 5),
            "float16",
            1e-5,
            training=True,
            track_running_stats=True,
            momentum=None,
        ),
        Case("instance_norm", (2, 4, 3, 4), "float32", 1e-5, layout="channels_last"),
    ],
    ids=lambda case: case.id,
)
def test_instance_norm_is_judged_as_group_norm_with_one_channel_per_group(case: Case) -> None:
    inputs, expected = materials(case)
    group = Case(
        "group_norm",
        case.shape,
        case.dtype,
        case.eps,
        num_groups=case.shape[1],
        weight=case.weight,
        bias=case.bias,
        dist=case.dist,
    )
    plain = {k: v for k, v in inputs.items() if not k.startswith("running_")}
    group_expected = oracle.evaluate(group, plain, grad=True)
    for output in GRAD_OUTPUTS if case.weight else ("y", "dx"):
        assert judged(case, inputs, expected, output) == judged(group, plain, group_expected, output), output


@pytest.mark.parametrize(
    "case",
    [
        Case("instance_norm", (3, 4, 6), "float32", 1e-5, track_running_stats=True),
        Case(
            "instance_norm", (2, 3, 2, 3), "bfloat16", 1e-5, track_running_stats=True, param_dtype="float32"
        ),
        Case(
            "instance_norm", (2, 3, 5), "float16", 1e-5, track_running_stats=True, dist="offset", bias=False
        ),
    ],
    ids=lambda case: case.id,
)
def test_instance_norm_eval_is_judged_as_batch_norm_eval(case: Case) -> None:
    """Both normalize with the running statistics: the same allowances and bounds on the same inputs
    (the mean-rounding cap differs, and does not count: there is no computed mean)."""
    inputs, expected = materials(case)
    batch = Case(
        "batch_norm",
        case.shape,
        case.dtype,
        case.eps,
        param_dtype=case.param_dtype,
        bias=case.bias,
        dist=case.dist,
    )
    batch_expected = oracle.evaluate(batch, inputs, grad=True)
    for output in ("y", "dx", "dweight") + (("dbias",) if case.bias else ()):
        mine, theirs = judged(case, inputs, expected, output), judged(batch, inputs, batch_expected, output)
        assert replace(mine[0], mean_cap=0.0) == replace(theirs[0], mean_cap=0.0), output
        assert mine[0].mean_error == 0.0 and mine[0].atol(RULE) == theirs[0].atol(RULE), output
        assert mine[1] == theirs[1], output


@pytest.mark.parametrize(
    "case",
    [
        Case("group_norm", (3, 4, 5), "float32", 1e-5, num_groups=1),
        Case("group_norm", (2, 6, 4), "bfloat16", 1e-5, num_groups=1, dist="offset"),
        Case("group_norm", (4, 3, 8), "float16", 1e-5, num_groups=1, bias=False, dist="outlier"),
    ],
    ids=lambda case: case.id,
)
def test_group_norm_with_one_group_is_judged_as_layer_norm_over_channels_and_length(case: Case) -> None:
    """G = 1 on (N, C, L) is LayerNorm over (C, L) with each channel's weight repeated L times: y and
    dx get the same allowance; dweight sums L times the terms, so its sensitivity is sqrt(L) larger."""
    inputs, expected = materials(case)
    length = case.shape[2]
    layer = Case("layer_norm", case.shape, case.dtype, case.eps, norm_ndim=2, bias=case.bias, dist=case.dist)
    repeated: Arrays = {
        k: np.repeat(inputs[k][:, None], length, axis=1) for k in ("weight", "bias") if k in inputs
    }
    layer_inputs = {"x": inputs["x"], "dy": inputs["dy"], **repeated}
    layer_expected = oracle.evaluate(layer, layer_inputs, grad=True)
    for output in ("y", "dx"):
        mine, theirs = (
            judged(case, inputs, expected, output),
            judged(layer, layer_inputs, layer_expected, output),
        )
        assert mine[0].atol(RULE) == pytest.approx(theirs[0].atol(RULE), rel=SAME), output
        assert mine[0].mean_cap == theirs[0].mean_cap == math.sqrt(math.prod(case.shape[1:]))
        assert mine[1] == pytest.approx(theirs[1], rel=SAME), output
    gn = scales.sensitivity(case, "dweight", inputs, expected)
    ln = scales.sensitivity(layer, "dweight", layer_inputs, layer_expected)
    assert gn == pytest.approx(math.sqrt(length) * ln, rel=SAME)


# --- edges the profiles leave out -----------------------------------------------------------------

TABLE = tolerances.read_tolerances()


def largest_allowance(case: Case, output: str, inputs: Arrays, expected: Arrays) -> float:
    tol = TABLE.lookup(case.op, output, output_dtype(case, output), case.dist)
    return float(np.max(elementwise(tol, factors(case, output, inputs, expected), expected[output])))


def scaled_rms(values: np.ndarray) -> float:
    """rms without squaring the values themselves: exact where their squares leave float64's range."""
    largest = float(np.max(np.abs(values)))
    return largest * rms(values / largest) if largest else 0.0


@pytest.mark.parametrize(
    "case",
    [
        Case(
            "instance_norm", (2, 4, 2), "float64", 1e-5, training=True, track_running_stats=True, dist="small"
        ),
        Case(
            "instance_norm", (2, 4, 2), "float64", 1e-5, training=True, track_running_stats=True, dist="large"
        ),
        Case("batch_norm", (4, 3, 2), "float64", 1e-5, training=True, dist="small"),
    ],
    ids=lambda case: case.id,
)
def test_running_statistics_far_from_one_keep_an_atol_relative_to_their_size(case: Case) -> None:
    """Running variances near 1e-320 or 1e300: squaring them underflows or overflows, which must not
    turn atol absolute (1e-12 against 1e-320 would let any tiny answer pass)."""
    inputs, expected = materials(case)
    for output in ("running_mean", "running_var"):
        size = scaled_rms(expected[output])
        assert size > 0 and np.isfinite(size)
        assert scales.scale(case, output, inputs, expected) == pytest.approx(size, rel=SAME), output
        assert largest_allowance(case, output, inputs, expected) <= bounds.bound(
            case, output, inputs, expected
        )


@pytest.mark.parametrize(
    "case",
    [
        Case(
            "instance_norm", (2, 4, 3), "float32", 1e-5, training=True, track_running_stats=True, dist="zeros"
        ),
        Case(
            "instance_norm",
            (2, 4, 3),
            "bfloat16",
            1e-5,
            training=True,
            track_running_stats=True,
            dist="zeros",
        ),
        Case("batch_norm", (4, 3, 2), "float32", 1e-5, training=True, dist="zeros"),
    ],
    ids=lambda case: case.id,
)
def test_running_statistics_of_zeros_are_checked_exactly(case: Case) -> None:
    """A mean and a variance of exact zeros are exact zeros in any formulation, and so is the blend
    with zero running statistics: the bound is 0, so nothing but 0 may pass."""
    inputs, expected = materials(case)
    for output in ("running_mean", "running_var"):
        assert not np.any(expected[output]) and bounds.bound(case, output, inputs, expected) == 0.0
        assert largest_allowance(case, output, inputs, expected) == 0.0, output


@pytest.mark.parametrize(
    "case",
    [
        Case("group_norm", (4, 6), "float32", 1e-12, num_groups=6, dist="large"),
        Case("group_norm", (4, 6), "bfloat16", 1e-12, num_groups=6, dist="outlier"),
        Case("group_norm", (2, 3, 1), "float16", 1e-12, num_groups=3, dist="offset"),
        Case("layer_norm", (4, 1), "float32", 1e-12, dist="large"),
    ],
    ids=lambda case: case.id,
)
def test_groups_of_one_value_never_allow_more_than_the_output_can_be(case: Case) -> None:
    """Two roundings of the folded products x * rstd - mean * rstd are u * |x| * rstd each: with
    large values and a tiny eps that is far past |xhat| <= 1, and an allowance there passes anything."""
    inputs, expected = materials(case)
    assert bounds.group_size(case) == 1
    assert 2 * conditioning.mean_error(case, expected) > bounds.xhat_bound(case)  # the folded residue
    for output in ("y", "dx", "dweight"):
        assert largest_allowance(case, output, inputs, expected) <= bounds.bound(
            case, output, inputs, expected
        )


@pytest.mark.parametrize(
    "case",
    [
        Case("instance_norm", (4, 8, 200), "bfloat16", 1e-2, dist="outlier"),
        Case("group_norm", (4, 8, 200), "bfloat16", 1e-6, num_groups=8, dist="outlier"),
    ],
    ids=lambda case: case.id,
)
def test_correctly_rounded_outlier_groups_do_not_lean(case: Case) -> None:
    """Outside the outlier, (x - mean) * rstd is -mean * rstd up to 1e-5: one value per channel and
    sample, whose rounding error repeats hundreds of times and is not a rounding mode."""
    _, expected = materials(case)
    y = expected["y"]
    assert len(np.unique(round_to(y, case.dtype))) <= 32  # clusters, not 6400 independent roundings
    record = rounding.bias(round_to(y, case.dtype), y, case.dtype)
    assert record is not None and record.passed, record
