"""The oracle's contract (outputs, shapes, dtypes, rounded inputs), closed forms and invariants."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from conformance.model.case import CHANNEL_OPS, GROUP_OPS, Case
from conformance.model.dtypes import round_to
from conformance.model.inputs import make_inputs
from conformance.oracle import evaluate

# Norm-wise relative error for identities that hold exactly in real arithmetic and differ here only
# by a few float64 roundings (~1e-16 each) of well-conditioned quantities.
IDENTITY_TOLERANCE = 1e-14

CONTRACT_CASES = [
    Case("layer_norm", (3, 5), "float64", 1e-5),
    Case("layer_norm", (2, 3, 4), "bfloat16", 1e-5, norm_ndim=2, param_dtype="float32"),
    Case("layer_norm", (4, 6), "float32", 1e-5, norm_ndim=2, weight=False, bias=False),
    Case("rms_norm", (2, 3, 4), "float16", 1e-6, weight_offset=1.0),
    Case("rms_norm", (3, 5), "bfloat16", 1e-6, weight=False),
    Case("batch_norm", (4, 3), "float32", 1e-5, training=True),
    Case("batch_norm", (2, 3, 4), "bfloat16", 1e-5, training=True, momentum=None, bias=False),
    Case("batch_norm", (2, 3, 2, 2), "float16", 1e-3, param_dtype="float32"),
    Case("group_norm", (2, 6, 5), "float32", 1e-5, num_groups=3),
    Case("group_norm", (3, 8), "bfloat16", 1e-5, num_groups=4, param_dtype="float32"),
    Case("group_norm", (2, 4, 3, 5), "float16", 1e-5, num_groups=2, weight=False, layout="channels_last"),
    Case("instance_norm", (2, 3, 6), "float32", 1e-5),
    Case("instance_norm", (2, 2, 3, 4, 5), "float32", 1e-5, weight=False, bias=False),
    Case("instance_norm", (2, 3, 4, 5), "bfloat16", 1e-5, track_running_stats=True),
    Case(
        "instance_norm",
        (3, 3, 6),
        "float32",
        1e-5,
        training=True,
        track_running_stats=True,
        momentum=None,
        bias=False,
    ),
]


def ids(case: Case) -> str:
    return case.id


def expected_names(case: Case, grad: bool) -> set[str]:
    names = {"y"}
    if case.uses_batch_stats:
        names |= {"rstd"} if case.op == "rms_norm" else {"mean", "rstd"}
    if case.training:
        names |= {"running_mean", "running_var"}
    if grad:
        names |= {"dx"} | ({"dweight"} if case.weight else set()) | ({"dbias"} if case.bias else set())
    return names


def stats_shape(case: Case) -> tuple[int, ...]:
    if case.op == "batch_norm":
        return (case.shape[1],)
    if case.op in GROUP_OPS:
        return (case.shape[0], case.groups)  # one statistic per (sample, group)
    return case.shape[: len(case.shape) - case.norm_ndim]


def norm_error(actual: np.ndarray, expected: np.ndarray) -> float:
    scale = max(np.max(np.abs(expected)), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(actual - expected)) / scale)


def group_axes(case: Case) -> tuple[int, ...]:
    """The axes each statistic reduces over (GN/IN: of ``grouped`` x)."""
    ndim = len(case.shape)
    if case.op == "batch_norm":
        return (0, *range(2, ndim))
    if case.op in GROUP_OPS:
        return (2,)
    return tuple(range(ndim - case.norm_ndim, ndim))


def grouped(case: Case, values: np.ndarray) -> np.ndarray:
    """x-shaped values where ``group_axes`` are plain axes: GN/IN as (N, G, C/G * spatial), since a
    group's channels and their spatial values are contiguous in x; other ops unchanged."""
    if case.op in GROUP_OPS:
        return values.reshape(case.shape[0], case.groups, -1)
    return values


def broadcastable(case: Case, param: np.ndarray) -> np.ndarray:
    """A parameter shaped to broadcast against x (channel ops: per channel on axis 1)."""
    if case.op in CHANNEL_OPS:
        return param.reshape((-1,) + (1,) * (len(case.shape) - 2))
    return param


def mean_free(case: Case, g: np.ndarray) -> np.ndarray:
    """g minus its mean over each normalization group, shaped like x."""
    values = grouped(case, g)
    centred: np.ndarray = values - values.mean(axis=group_axes(case), keepdims=True)
    return centred.reshape(case.shape)


def float64_inputs(case: Case) -> dict[str, np.ndarray]:
    return {name: values.astype(np.float64) for name, values in make_inputs(case).items()}


# --- contract -----------------------------------------------------------------------------------


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("case", CONTRACT_CASES, ids=ids)
def test_outputs_are_float64_with_contract_names_and_shapes(case: Case, grad: bool) -> None:
    outputs = evaluate(case, make_inputs(case, grad=grad), grad=grad)
    assert set(outputs) == expected_names(case, grad)
    shapes = {"y": case.shape, "dx": case.shape, "dweight": case.param_shape, "dbias": case.param_shape}
    shapes |= {"mean": stats_shape(case), "rstd": stats_shape(case)}
    shapes |= {"running_mean": (case.shape[1],), "running_var": (case.shape[1],)}
    for name, values in outputs.items():
        assert values.dtype == np.float64, name
        assert values.shape == shapes[name], name
        assert np.all(np.isfinite(values)), name


@pytest.mark.parametrize("case", CONTRACT_CASES, ids=ids)
def test_reads_rounded_inputs_as_float64_and_leaves_them_alone(case: Case) -> None:
    inputs = make_inputs(case)
    before = {name: values.copy() for name, values in inputs.items()}
    outputs = evaluate(case, inputs, grad=True)
    upcast = evaluate(case, {name: values.astype(np.float64) for name, values in inputs.items()}, grad=True)
    for name, values in outputs.items():
        np.testing.assert_array_equal(values, upcast[name], err_msg=name)
    for name, values in inputs.items():
        assert values.dtype == before[name].dtype, name
        np.testing.assert_array_equal(values, before[name], err_msg=name)


ADD_BASE = {"add_rms_norm": "rms_norm", "add_layer_norm": "layer_norm"}


@pytest.mark.parametrize("op", sorted(ADD_BASE))
@pytest.mark.parametrize(
    ("residual_dtype", "norm_input"), [(None, "rounded"), (None, "exact"), ("float32", "rounded")]
)
def test_add_op_is_the_norm_of_the_sum_it_reads(op: str, residual_dtype: str | None, norm_input: str) -> None:
    # residual_out is the sum rounded once to the stream's dtype; the norm reads it, or the exact sum.
    case = Case(op, (3, 16), "bfloat16", 1e-6, residual_dtype=residual_dtype, norm_input=norm_input)
    inputs = make_inputs(case)
    out = evaluate(case, inputs, grad=True)
    exact = inputs["x"].astype(np.float64) + inputs["residual"].astype(np.float64)
    stored = round_to(exact, residual_dtype or "bfloat16").astype(np.float64)
    read = stored if norm_input == "rounded" else exact
    assert (stored != exact).any() and (read == exact).all() == (norm_input == "exact")
    base = Case(ADD_BASE[op], (3, 16), "bfloat16", 1e-6)
    params = {k: inputs[k] for k in ("weight", "bias") if k in inputs}
    ref = evaluate(base, {"x": read, **params, "dy": inputs["dy"]}, grad=True)
    np.testing.assert_array_equal(out["residual_out"], stored)
    np.testing.assert_array_equal(out["y"], ref["y"])
    dh = ref["dx"] + inputs["dresidual_out"].astype(np.float64)
    np.testing.assert_array_equal(out["dx"], dh)
    np.testing.assert_array_equal(out["dresidual"], dh)
    for name in ("dweight", "dbias"):
        if name in ref:
            np.testing.assert_array_equal(out[name], ref[name], err_msg=name)


@pytest.mark.parametrize("op", sorted(ADD_BASE))
def test_add_op_gradients_are_those_of_both_outputs(op: str) -> None:
    # L = sum(y * dy) + sum(residual_out * dresidual_out): dL/dx and dL/dresidual by central differences.
    case = Case(op, (2, 5), "float64", 1e-3)
    inputs = make_inputs(case)
    out = evaluate(case, inputs, grad=True)
    step = 1e-6  # central differences in float64: truncation ~ step^2, rounding ~ 1e-16 / step
    difference_error = 1e-7  # relative rms error those two allow at this step
    for name, grad in (("x", out["dx"]), ("residual", out["dresidual"])):
        numeric = np.zeros_like(grad)
        for index in np.ndindex(grad.shape):
            loss = []
            for sign in (1, -1):
                moved = {k: v.copy() for k, v in inputs.items()}
                moved[name][index] += sign * step
                run = evaluate(case, moved, grad=False)
                total = np.sum(run["y"] * inputs["dy"]) + np.sum(
                    run["residual_out"] * inputs["dresidual_out"]
                )
                loss.append(float(total))
            numeric[index] = (loss[0] - loss[1]) / (2 * step)
        assert norm_error(grad, numeric) <= difference_error, name


def test_grad_without_dy_names_the_missing_input() -> None:
    case = Case("layer_norm", (2, 8), "float32", 1e-5)
    with pytest.raises(ValueError, match=r"inputs\['dy'\]"):
        evaluate(case, make_inputs(case, grad=False), grad=True)


# --- closed forms -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        Case("layer_norm", (3, 7), "float64", 1e-5, dist="constant"),
        Case("layer_norm", (2, 3, 5), "bfloat16", 1e-5, norm_ndim=2, dist="constant"),
        Case("batch_norm", (3, 2, 5), "float64", 1e-5, training=True, dist="constant"),
        Case("group_norm", (3, 6, 5), "float64", 1e-5, num_groups=3, dist="constant"),
        Case("group_norm", (2, 4, 3, 3), "bfloat16", 1e-5, num_groups=1, dist="constant"),
        Case("group_norm", (4, 6), "float32", 1e-5, num_groups=2, dist="constant"),
        Case("instance_norm", (2, 3, 7), "float64", 1e-5, dist="constant"),
        Case(
            "instance_norm",
            (2, 3, 2, 4),
            "float32",
            1e-5,
            training=True,
            track_running_stats=True,
            dist="constant",
        ),
    ],
    ids=ids,
)
def test_constant_groups_give_bias_and_finite_mean_free_dx(case: Case) -> None:
    """Zero variance: xhat = 0, so y = bias and dx = rstd * (g - mean(g)) with rstd = 1/sqrt(eps)."""
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    g = inputs["dy"] * broadcastable(case, inputs["weight"])
    rstd = 1 / np.sqrt(case.eps)
    bias = np.broadcast_to(broadcastable(case, inputs["bias"]), case.shape)
    assert norm_error(outputs["y"], bias) <= IDENTITY_TOLERANCE
    assert norm_error(outputs["dx"], rstd * mean_free(case, g)) <= IDENTITY_TOLERANCE
    assert np.all(outputs["rstd"] == rstd)
    assert outputs["rstd"].shape == stats_shape(case)


@pytest.mark.parametrize(
    "case",
    [
        Case("layer_norm", (3, 5), "float64", 1e-5, dist="zeros"),
        Case("batch_norm", (4, 3, 2), "float32", 1e-5, training=True, dist="zeros"),
        Case("group_norm", (2, 6, 4), "float16", 1e-5, num_groups=2, dist="zeros"),
        Case("instance_norm", (2, 3, 2, 3), "float32", 1e-5, dist="zeros"),
        Case(
            "instance_norm",
            (3, 2, 5),
            "float64",
            1e-5,
            training=True,
            track_running_stats=True,
            momentum=None,
            dist="zeros",
        ),
    ],
    ids=ids,
)
def test_zeros_give_exactly_bias_and_rstd_of_eps_and_mean_free_dx(case: Case) -> None:
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    np.testing.assert_array_equal(
        outputs["y"], np.broadcast_to(broadcastable(case, inputs["bias"]), case.shape)
    )
    np.testing.assert_array_equal(outputs["mean"], 0.0)
    np.testing.assert_array_equal(outputs["rstd"], 1 / np.sqrt(case.eps))
    np.testing.assert_array_equal(outputs["dweight"], 0.0)
    g = inputs["dy"] * broadcastable(case, inputs["weight"])
    assert norm_error(outputs["dx"], mean_free(case, g) / np.sqrt(case.eps)) <= IDENTITY_TOLERANCE


@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
def test_rms_of_zeros_is_zero_with_gradient_scaled_by_rstd_of_eps(weight_offset: float) -> None:
    case = Case("rms_norm", (3, 5), "float64", 1e-6, dist="zeros", weight_offset=weight_offset)
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    rstd = 1 / np.sqrt(case.eps)
    np.testing.assert_array_equal(outputs["y"], 0.0)
    np.testing.assert_array_equal(outputs["rstd"], rstd)
    np.testing.assert_array_equal(outputs["dx"], inputs["dy"] * (weight_offset + inputs["weight"]) * rstd)
    np.testing.assert_array_equal(outputs["dweight"], 0.0)


@pytest.mark.parametrize(
    "case",
    [
        Case("batch_norm", (4, 3), "float64", 1e-5, training=True, momentum=0.25, dist="zeros"),
        Case(
            "instance_norm",
            (4, 3, 5),
            "float64",
            1e-5,
            training=True,
            track_running_stats=True,
            momentum=0.25,
            dist="zeros",
        ),
    ],
    ids=ids,
)
def test_zeros_decay_running_stats_by_momentum(case: Case) -> None:
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=False)
    for name in ("running_mean", "running_var"):
        np.testing.assert_array_equal(outputs[name], 0.75 * inputs[name])


# --- invariants ---------------------------------------------------------------------------------

ROW_CASES = [
    Case("layer_norm", (3, 8), "float64", 1e-5),
    Case("layer_norm", (2, 3, 4), "float64", 1e-5, norm_ndim=2, dist="outlier"),
    Case("layer_norm", (4, 8), "bfloat16", 1e-5, param_dtype="float32"),
]


# GN/IN with batch statistics: LayerNorm over each (sample, group), per-channel parameters.
GROUP_CASES = [
    Case("group_norm", (2, 6, 5), "float64", 1e-5, num_groups=3),
    Case("group_norm", (3, 8, 2, 3), "float64", 1e-5, num_groups=1, dist="outlier"),
    Case("group_norm", (4, 6), "float64", 1e-5, num_groups=2, bias=False),
    Case("group_norm", (2, 8, 9), "bfloat16", 1e-5, num_groups=4, param_dtype="float32"),
    Case("instance_norm", (2, 3, 6), "float64", 1e-5, weight=False, bias=False),
    Case(
        "instance_norm", (3, 2, 3, 4), "float64", 1e-5, training=True, track_running_stats=True, momentum=0.3
    ),
]


@pytest.mark.parametrize("case", ROW_CASES, ids=ids)
def test_layer_norm_ignores_a_shift(case: Case) -> None:
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    shifted = evaluate(case, {**inputs, "x": inputs["x"] + 3.0}, grad=True)
    for name in ("y", "rstd", "dx", "dweight", "dbias"):
        assert norm_error(shifted[name], outputs[name]) <= IDENTITY_TOLERANCE, name
    assert norm_error(shifted["mean"], outputs["mean"] + 3.0) <= IDENTITY_TOLERANCE


@pytest.mark.parametrize("case", ROW_CASES + GROUP_CASES, ids=ids)
@pytest.mark.parametrize("a", [4.0, 3.0, 1e-3])
def test_layer_norm_of_scaled_x_with_scaled_eps_is_unchanged(case: Case, a: float) -> None:
    """LN_{a^2 eps}(a x) = LN_eps(x) and dx scales by 1/a; bit for bit when a is a power of two.
    The same holds per group for GroupNorm and InstanceNorm."""
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    scaled = evaluate(replace(case, eps=case.eps * a * a), {**inputs, "x": a * inputs["x"]}, grad=True)
    expected = {"y": outputs["y"], "dx": outputs["dx"] / a, "rstd": outputs["rstd"] / a}
    expected |= {name: outputs[name] for name in ("dweight", "dbias") if name in outputs}
    for name, values in expected.items():
        if a == 4.0:
            np.testing.assert_array_equal(scaled[name], values, err_msg=name)
        assert norm_error(scaled[name], values) <= IDENTITY_TOLERANCE, name


@pytest.mark.parametrize(
    "case",
    [
        Case("rms_norm", (3, 8), "float64", 1e-30),
        Case("rms_norm", (2, 3, 4), "float64", 1e-30, norm_ndim=2, weight_offset=1.0),
        Case("rms_norm", (4, 8), "bfloat16", 1e-30, weight=False),
    ],
    ids=ids,
)
@pytest.mark.parametrize("a", [1e3, 0.25, 7.0])
def test_rms_norm_ignores_scale_when_eps_is_negligible(case: Case, a: float) -> None:
    """eps = 1e-30 is below float64 resolution of mean(x^2) ~ 1, so RMS(a x) = RMS(x), dx scales by 1/a."""
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    scaled = evaluate(case, {**inputs, "x": a * inputs["x"]}, grad=True)
    for name, values in {"y": outputs["y"], "dx": outputs["dx"] / a, "rstd": outputs["rstd"] / a}.items():
        assert norm_error(scaled[name], values) <= IDENTITY_TOLERANCE, name


def test_rms_norm_equals_layer_norm_on_zero_mean_rows() -> None:
    """Same forward; LN's dx differs only by its mean path, rstd * mean(dy * weight)."""
    rms_case = Case("rms_norm", (3, 6), "float64", 1e-5)
    inputs = float64_inputs(rms_case)
    half = inputs["x"][:, :3]
    x = np.concatenate([half, -half], axis=1)  # each row has mean zero
    rms = evaluate(rms_case, {**inputs, "x": x}, grad=True)
    layer = evaluate(Case("layer_norm", (3, 6), "float64", 1e-5, bias=False), {**inputs, "x": x}, grad=True)
    for name in ("y", "rstd", "dweight"):
        assert norm_error(rms[name], layer[name]) <= IDENTITY_TOLERANCE, name
    mean_path = rms["rstd"][:, None] * (inputs["dy"] * inputs["weight"]).mean(axis=1, keepdims=True)
    assert norm_error(layer["dx"], rms["dx"] - mean_path) <= IDENTITY_TOLERANCE


@pytest.mark.parametrize(
    "case",
    [*ROW_CASES[:2], Case("batch_norm", (3, 4, 5), "float64", 1e-5, training=True), *GROUP_CASES],
    ids=ids,
)
def test_batch_statistics_gradient_sums_to_zero_per_group(case: Case) -> None:
    """y does not change when a group is shifted, so dx sums to zero over each group."""
    dx = evaluate(case, float64_inputs(case), grad=True)["dx"]
    dx_scale = np.max(np.abs(dx))
    assert np.max(np.abs(grouped(case, dx).sum(axis=group_axes(case)))) <= IDENTITY_TOLERANCE * dx_scale


# --- batch norm ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        Case("batch_norm", (6, 4), "float64", 1e-5, training=True),
        Case("batch_norm", (3, 4, 5), "float32", 1e-5, training=True, momentum=None),
    ],
    ids=ids,
)
def test_batch_norm_training_is_layer_norm_over_each_channel(case: Case) -> None:
    """Channels moved last and flattened into rows: BN training = LN over the batch axes."""
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)

    def rows(values: np.ndarray) -> np.ndarray:
        return np.moveaxis(values, 1, 0).reshape(case.shape[1], -1)

    row_case = Case("layer_norm", (case.shape[1], case.rows), "float64", case.eps, weight=False, bias=False)
    layer = evaluate(row_case, {"x": rows(inputs["x"]), "dy": rows(inputs["dy"])}, grad=True)
    weight = inputs["weight"][:, None]
    assert norm_error(rows(outputs["y"]), layer["y"] * weight + inputs["bias"][:, None]) <= IDENTITY_TOLERANCE
    assert norm_error(rows(outputs["dx"]), layer["dx"] * weight) <= IDENTITY_TOLERANCE
    for name in ("mean", "rstd"):
        assert norm_error(outputs[name], layer[name]) <= IDENTITY_TOLERANCE, name


@pytest.mark.parametrize("momentum", [None, 1.0, 0.0, 0.3])
def test_batch_norm_running_stats_use_momentum_and_unbiased_variance(momentum: float | None) -> None:
    case = Case("batch_norm", (3, 4, 5), "float64", 1e-5, training=True, momentum=momentum)
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=False)
    m = 1.0 if momentum is None else momentum  # cumulative average: 1 / (num_batches_tracked = 1)
    batch = {
        "running_mean": inputs["x"].mean(axis=(0, 2)),
        "running_var": inputs["x"].var(axis=(0, 2), ddof=1),
    }
    for name, values in batch.items():
        expected = (1 - m) * inputs[name] + m * values
        assert norm_error(outputs[name], expected) <= IDENTITY_TOLERANCE, name
    if momentum == 0.0:
        for name in batch:
            np.testing.assert_array_equal(outputs[name], inputs[name])


def test_batch_norm_eval_with_batch_stats_matches_training_forward_not_backward() -> None:
    """Eval treats the statistics as constants: same y, but dx = dy * weight * rstd."""
    train_case = Case("batch_norm", (4, 3, 2), "float64", 1e-5, training=True)
    inputs = float64_inputs(train_case)
    trained = evaluate(train_case, inputs, grad=True)
    stats = {"running_mean": trained["mean"], "running_var": trained["rstd"] ** -2 - train_case.eps}
    frozen = evaluate(replace(train_case, training=False), {**inputs, **stats}, grad=True)
    assert norm_error(frozen["y"], trained["y"]) <= IDENTITY_TOLERANCE
    expected_dx = inputs["dy"] * (inputs["weight"] * trained["rstd"])[:, None]
    assert norm_error(frozen["dx"], expected_dx) <= IDENTITY_TOLERANCE
    assert norm_error(frozen["dx"], trained["dx"]) > 1e-3  # the statistics' gradient path is absent
    for name in ("dweight", "dbias"):
        assert norm_error(frozen[name], trained[name]) <= IDENTITY_TOLERANCE, name


# --- group norm and instance norm ---------------------------------------------------------------


def weight_of(case: Case, inputs: dict[str, np.ndarray]) -> np.ndarray | float:
    return broadcastable(case, inputs["weight"]) if case.weight else 1.0


def bias_of(case: Case, inputs: dict[str, np.ndarray]) -> np.ndarray | float:
    return broadcastable(case, inputs["bias"]) if case.bias else 0.0


@pytest.mark.parametrize("case", GROUP_CASES, ids=ids)
def test_group_norm_ignores_a_shift_of_each_group(case: Case) -> None:
    """A different constant added to every (sample, group) leaves everything but the means alone."""
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    shifts = np.random.default_rng(7).uniform(-3.0, 3.0, (case.shape[0], case.groups))
    x = (grouped(case, inputs["x"]) + shifts[:, :, None]).reshape(case.shape)
    shifted = evaluate(case, {**inputs, "x": x}, grad=True)
    for name in ("y", "rstd", "dx", "dweight", "dbias"):
        if name in outputs:
            assert norm_error(shifted[name], outputs[name]) <= IDENTITY_TOLERANCE, name
    assert norm_error(shifted["mean"], outputs["mean"] + shifts) <= IDENTITY_TOLERANCE
    if case.training:  # the running mean follows the batch average of the shifts; the variance not
        m = 1.0 if case.momentum is None else case.momentum
        moved = outputs["running_mean"] + m * shifts.mean(axis=0)
        assert norm_error(shifted["running_mean"], moved) <= IDENTITY_TOLERANCE
        assert norm_error(shifted["running_var"], outputs["running_var"]) <= IDENTITY_TOLERANCE


@pytest.mark.parametrize("case", GROUP_CASES, ids=ids)
def test_group_norm_is_layer_norm_of_each_group(case: Case) -> None:
    """Each (sample, group) flattened into a row: LayerNorm without parameters, then per-channel affine."""
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    n, g = case.shape[0], case.groups
    rows = Case(
        "layer_norm", (n * g, math.prod(case.shape) // (n * g)), "float64", case.eps, weight=False, bias=False
    )
    layer = evaluate(
        rows,
        {
            "x": inputs["x"].reshape(rows.shape),
            "dy": (inputs["dy"] * weight_of(case, inputs)).reshape(rows.shape),
        },
        grad=True,
    )
    xhat = layer["y"].reshape(case.shape)
    expected_y = xhat * weight_of(case, inputs) + bias_of(case, inputs)
    assert norm_error(outputs["y"], expected_y) <= IDENTITY_TOLERANCE
    assert norm_error(outputs["dx"], layer["dx"].reshape(case.shape)) <= IDENTITY_TOLERANCE
    for name in ("mean", "rstd"):
        assert norm_error(outputs[name], layer[name].reshape(n, g)) <= IDENTITY_TOLERANCE, name
    channel_sums = (0, *range(2, len(case.shape)))
    if case.weight:
        expected = (inputs["dy"] * xhat).sum(axis=channel_sums)
        assert norm_error(outputs["dweight"], expected) <= IDENTITY_TOLERANCE
    if case.bias:
        assert norm_error(outputs["dbias"], inputs["dy"].sum(axis=channel_sums)) <= IDENTITY_TOLERANCE


@pytest.mark.parametrize(
    "case",
    [
        Case("instance_norm", (2, 3, 6), "float32", 1e-5),
        Case("instance_norm", (3, 4, 2, 3), "float64", 1e-3, weight=False),
        Case("instance_norm", (2, 2, 2, 3, 2), "bfloat16", 1e-5, dist="outlier"),
    ],
    ids=ids,
)
def test_instance_norm_is_group_norm_with_one_channel_per_group(case: Case) -> None:
    inputs = float64_inputs(case)
    group = replace(case, op="group_norm", num_groups=case.shape[1])
    outputs, expected = evaluate(case, inputs, grad=True), evaluate(group, inputs, grad=True)
    assert set(outputs) == set(expected)
    for name, values in expected.items():
        np.testing.assert_array_equal(outputs[name], values, err_msg=name)


@pytest.mark.parametrize(
    "case",
    [
        Case("group_norm", (3, 4, 5), "float64", 1e-5, num_groups=1),
        Case("group_norm", (2, 3, 7), "float32", 1e-5, num_groups=1, dist="offset"),
        Case("group_norm", (4, 6, 4), "float64", 1e-3, num_groups=1, bias=False),
    ],
    ids=ids,
)
def test_group_norm_with_one_group_is_layer_norm_over_channels_and_length(case: Case) -> None:
    """G = 1 on (N, C, L) is LayerNorm over (C, L) whose weight repeats each channel's L times; the
    parameter gradients are the LayerNorm ones summed over L."""
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    length = case.shape[2]
    layer_case = Case("layer_norm", case.shape, "float64", case.eps, norm_ndim=2, bias=case.bias)
    params: dict[str, np.ndarray] = {
        name: np.repeat(inputs[name][:, None], length, axis=1)
        for name in ("weight", "bias")
        if name in inputs
    }
    layer = evaluate(layer_case, {"x": inputs["x"], "dy": inputs["dy"], **params}, grad=True)
    for name in ("y", "dx", "mean", "rstd"):
        assert norm_error(outputs[name].reshape(layer[name].shape), layer[name]) <= IDENTITY_TOLERANCE, name
    for name in ("dweight", "dbias"):
        if name in outputs:
            assert norm_error(outputs[name], layer[name].sum(axis=1)) <= IDENTITY_TOLERANCE, name


@pytest.mark.parametrize("momentum", [None, 1.0, 0.0, 0.3])
@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 2, 3)])
def test_instance_norm_running_stats_average_the_instances(
    momentum: float | None, shape: tuple[int, ...]
) -> None:
    """running = (1 - m) running + m * (mean over samples of each instance's mean / unbiased variance)."""
    case = Case(
        "instance_norm", shape, "float64", 1e-5, training=True, track_running_stats=True, momentum=momentum
    )
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=False)
    m = 1.0 if momentum is None else momentum  # cumulative average: 1 / (num_batches_tracked = 1)
    instances = inputs["x"].reshape(*shape[:2], -1)
    batch = {
        "running_mean": instances.mean(axis=2).mean(axis=0),
        "running_var": instances.var(axis=2, ddof=1).mean(axis=0),  # unbiased over the spatial count
    }
    for name, values in batch.items():
        expected = (1 - m) * inputs[name] + m * values
        assert norm_error(outputs[name], expected) <= IDENTITY_TOLERANCE, name
    if momentum == 0.0:
        for name in batch:
            np.testing.assert_array_equal(outputs[name], inputs[name])
    # Not the BatchNorm update, whose variance pools every sample: the two differ on these inputs.
    channels = np.moveaxis(instances, 1, 0).reshape(shape[1], -1)
    pooled = (1 - m) * inputs["running_var"] + m * channels.var(axis=1, ddof=1)
    if m > 0:
        assert norm_error(outputs["running_var"], pooled) > 1e-3


def test_instance_norm_training_normalizes_like_untracked_instance_norm() -> None:
    """Running statistics only get updated: y, statistics and gradients are those of instance statistics."""
    case = Case("instance_norm", (3, 4, 6), "float64", 1e-5, training=True, track_running_stats=True)
    inputs = float64_inputs(case)
    trained = evaluate(case, inputs, grad=True)
    untracked = replace(case, training=False, track_running_stats=False, momentum=0.1)
    plain = {k: v for k, v in inputs.items() if not k.startswith("running_")}
    expected = evaluate(untracked, plain, grad=True)
    assert set(trained) == set(expected) | {"running_mean", "running_var"}
    for name, values in expected.items():
        np.testing.assert_array_equal(trained[name], values, err_msg=name)


@pytest.mark.parametrize(
    "case",
    [
        Case("instance_norm", (3, 4, 6), "float64", 1e-5, track_running_stats=True),
        Case(
            "instance_norm", (2, 3, 2, 3), "bfloat16", 1e-5, track_running_stats=True, param_dtype="float32"
        ),
        Case("instance_norm", (2, 3, 5), "float32", 1e-5, track_running_stats=True, weight=False, bias=False),
    ],
    ids=ids,
)
def test_instance_norm_eval_with_running_stats_is_batch_norm_eval(case: Case) -> None:
    """With running statistics both ops are the same per-channel affine map of x."""
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    batch = evaluate(
        Case("batch_norm", case.shape, "float64", case.eps, weight=case.weight, bias=case.bias),
        inputs,
        grad=True,
    )
    assert set(outputs) == set(batch)
    for name, values in batch.items():
        np.testing.assert_array_equal(outputs[name], values, err_msg=name)


def test_instance_norm_eval_with_instance_stats_matches_training_forward_not_backward() -> None:
    """One sample, so per-channel running statistics can equal the instance statistics."""
    train_case = Case("instance_norm", (1, 3, 8), "float64", 1e-5, training=True, track_running_stats=True)
    inputs = float64_inputs(train_case)
    trained = evaluate(train_case, inputs, grad=True)
    stats = {"running_mean": trained["mean"][0], "running_var": trained["rstd"][0] ** -2 - train_case.eps}
    frozen = evaluate(replace(train_case, training=False), {**inputs, **stats}, grad=True)
    assert norm_error(frozen["y"], trained["y"]) <= IDENTITY_TOLERANCE
    expected_dx = inputs["dy"] * (inputs["weight"] * trained["rstd"][0])[:, None]
    assert norm_error(frozen["dx"], expected_dx) <= IDENTITY_TOLERANCE
    assert norm_error(frozen["dx"], trained["dx"]) > 1e-3  # the statistics' gradient path is absent
    for name in ("dweight", "dbias"):
        assert norm_error(frozen[name], trained[name]) <= IDENTITY_TOLERANCE, name
