"""The oracle's contract (outputs, shapes, dtypes, rounded inputs), closed forms and invariants."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conformance.model.case import Case
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
]


def ids(case: Case) -> str:
    return case.id


def expected_names(case: Case, grad: bool) -> set[str]:
    names = {"y"}
    if case.op != "batch_norm" or case.training:
        names |= {"rstd"} if case.op == "rms_norm" else {"mean", "rstd"}
    if case.op == "batch_norm" and case.training:
        names |= {"running_mean", "running_var"}
    if grad:
        names |= {"dx"} | ({"dweight"} if case.weight else set()) | ({"dbias"} if case.bias else set())
    return names


def stats_shape(case: Case) -> tuple[int, ...]:
    if case.op == "batch_norm":
        return (case.shape[1],)
    return case.shape[: len(case.shape) - case.norm_ndim]


def norm_error(actual: np.ndarray, expected: np.ndarray) -> float:
    scale = max(np.max(np.abs(expected)), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(actual - expected)) / scale)


def group_axes(case: Case) -> tuple[int, ...]:
    """The axes each statistic reduces over."""
    ndim = len(case.shape)
    if case.op == "batch_norm":
        return (0, *range(2, ndim))
    return tuple(range(ndim - case.norm_ndim, ndim))


def broadcastable(case: Case, param: np.ndarray) -> np.ndarray:
    """A parameter shaped to broadcast against x (BN: per channel on axis 1)."""
    if case.op == "batch_norm":
        return param.reshape((-1,) + (1,) * (len(case.shape) - 2))
    return param


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


def test_add_rms_norm_is_rms_norm_of_the_stored_sum() -> None:
    # The residual stream is stored in the activation dtype; the norm reads the stored value.
    case = Case("add_rms_norm", (3, 16), "bfloat16", 1e-6, weight_offset=1.0)
    inputs = make_inputs(case)
    out = evaluate(case, inputs, grad=True)
    h = (inputs["x"].astype(np.float64) + inputs["residual"].astype(np.float64)).astype(inputs["x"].dtype)
    rms_case = Case("rms_norm", (3, 16), "bfloat16", 1e-6, weight_offset=1.0)
    ref = evaluate(rms_case, {"x": h, "weight": inputs["weight"], "dy": inputs["dy"]}, grad=True)
    np.testing.assert_array_equal(out["residual_out"], h.astype(np.float64))
    for name in ("y", "dx", "dweight"):
        np.testing.assert_array_equal(out[name], ref[name], err_msg=name)


def test_add_rms_norm_dx_is_the_gradient_for_x_and_residual() -> None:
    case = Case("add_rms_norm", (2, 5), "float64", 1e-3)
    inputs = make_inputs(case)
    dx = evaluate(case, inputs, grad=True)["dx"]
    step = 1e-6  # central differences in float64: truncation ~ step^2, rounding ~ 1e-16 / step
    difference_error = 1e-7  # relative rms error those two allow at this step
    for name in ("x", "residual"):
        numeric = np.zeros_like(dx)
        for index in np.ndindex(dx.shape):
            loss = []
            for sign in (1, -1):
                moved = {k: v.copy() for k, v in inputs.items()}
                moved[name][index] += sign * step
                loss.append(float(np.sum(evaluate(case, moved, grad=False)["y"] * inputs["dy"])))
            numeric[index] = (loss[0] - loss[1]) / (2 * step)
        assert norm_error(dx, numeric) <= difference_error, name


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
    mean_free = rstd * (g - g.mean(axis=group_axes(case), keepdims=True))
    assert norm_error(outputs["dx"], mean_free) <= IDENTITY_TOLERANCE
    assert np.all(outputs["rstd"] == rstd)


@pytest.mark.parametrize(
    "case",
    [
        Case("layer_norm", (3, 5), "float64", 1e-5, dist="zeros"),
        Case("batch_norm", (4, 3, 2), "float32", 1e-5, training=True, dist="zeros"),
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
    g = inputs["dy"] * broadcastable(case, inputs["weight"])
    mean_free = (g - g.mean(axis=group_axes(case), keepdims=True)) / np.sqrt(case.eps)
    assert norm_error(outputs["dx"], mean_free) <= IDENTITY_TOLERANCE


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


def test_batch_norm_zeros_decay_running_stats_by_momentum() -> None:
    case = Case("batch_norm", (4, 3), "float64", 1e-5, training=True, momentum=0.25, dist="zeros")
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


@pytest.mark.parametrize("case", ROW_CASES, ids=ids)
def test_layer_norm_ignores_a_shift(case: Case) -> None:
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    shifted = evaluate(case, {**inputs, "x": inputs["x"] + 3.0}, grad=True)
    for name in ("y", "rstd", "dx", "dweight", "dbias"):
        assert norm_error(shifted[name], outputs[name]) <= IDENTITY_TOLERANCE, name
    assert norm_error(shifted["mean"], outputs["mean"] + 3.0) <= IDENTITY_TOLERANCE


@pytest.mark.parametrize("case", ROW_CASES, ids=ids)
@pytest.mark.parametrize("a", [4.0, 3.0, 1e-3])
def test_layer_norm_of_scaled_x_with_scaled_eps_is_unchanged(case: Case, a: float) -> None:
    """LN_{a^2 eps}(a x) = LN_eps(x) and dx scales by 1/a; bit for bit when a is a power of two."""
    inputs = float64_inputs(case)
    outputs = evaluate(case, inputs, grad=True)
    scaled = evaluate(replace(case, eps=case.eps * a * a), {**inputs, "x": a * inputs["x"]}, grad=True)
    expected = {
        "y": outputs["y"],
        "dx": outputs["dx"] / a,
        "rstd": outputs["rstd"] / a,
        "dweight": outputs["dweight"],
    }
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
    "case", [*ROW_CASES[:2], Case("batch_norm", (3, 4, 5), "float64", 1e-5, training=True)], ids=ids
)
def test_batch_statistics_gradient_sums_to_zero_per_group(case: Case) -> None:
    """y does not change when a group is shifted, so dx sums to zero over each group."""
    dx = evaluate(case, float64_inputs(case), grad=True)["dx"]
    dx_scale = np.max(np.abs(dx))
    assert np.max(np.abs(dx.sum(axis=group_axes(case)))) <= IDENTITY_TOLERANCE * dx_scale


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
