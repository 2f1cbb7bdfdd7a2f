"""How large each output can be at all: the ceiling no allowance may reach.

A group of n values normalized with batch statistics has sum(xhat^2) = n * var / (var + eps) <= n,
so |xhat| <= sqrt(n) whatever the rounding of its mean and variance (a computed mean m and
rstd = 1 / sqrt(mean((x - m)^2) + eps) keep the identity). Every output is a fixed function of
xhat, the parameters, rstd and dy, so it has a bound too; an allowance at that bound would pass any
answer of the right size, and the check could not fail. BatchNorm eval normalizes with the running
statistics, which are inputs: its xhat is known exactly and is its own bound.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from conformance.model.case import Case
from conformance.model.dtypes import stats_dtype, unit_roundoff
from conformance.model.inputs import groups
from conformance.oracle.batch_norm import per_channel, stat_axes
from conformance.oracle.layer_norm import Axes, other_axes, trailing_axes

Arrays = Mapping[str, np.ndarray]


def group_axes(case: Case, ndim: int) -> tuple[Axes, Axes]:
    """(axes one normalization group spans, axes a parameter gradient sums over)."""
    if case.op == "batch_norm":
        axes = stat_axes(ndim)
        return axes, axes
    axes = trailing_axes(ndim, case.norm_ndim)
    return axes, other_axes(ndim, axes)


def group_size(case: Case) -> int:
    """n, the number of values one mean and one rstd are computed from."""
    return groups(case)[1]


def xhat_bound(case: Case) -> float:
    """sqrt(n): no normalized value computed with batch statistics can be larger, however rounded."""
    return float(np.sqrt(group_size(case)))


def _param(case: Case, inputs: Arrays, name: str, ndim: int) -> np.ndarray | float:
    """A parameter shaped to broadcast against x (0 or 1 where the case has none)."""
    present = case.weight if name == "weight" else bool(case.bias)
    if not present:
        return 1.0 if name == "weight" else 0.0
    values = inputs[name].astype(np.float64) + (case.weight_offset if name == "weight" else 0.0)
    return per_channel(values, ndim) if case.op == "batch_norm" else values


def _running_rstd(case: Case, inputs: Arrays, ndim: int) -> np.ndarray:
    rstd: np.ndarray = 1.0 / np.sqrt(inputs["running_var"].astype(np.float64) + case.eps)
    return per_channel(rstd, ndim)


def _xhat_magnitude(case: Case, inputs: Arrays) -> np.ndarray | float:
    """|xhat| at most: sqrt(n) with batch statistics, the exact value with running statistics."""
    if case.op == "batch_norm" and not case.training:
        x = inputs["x"].astype(np.float64)
        centred = x - per_channel(inputs["running_mean"].astype(np.float64), x.ndim)
        magnitude: np.ndarray = np.abs(centred) * _running_rstd(case, inputs, x.ndim)
        return magnitude
    return xhat_bound(case)


def _rstd(case: Case, inputs: Arrays, expected: Arrays) -> np.ndarray:
    """rstd per group, shaped to broadcast against x."""
    ndim = inputs["x"].ndim
    if case.op == "batch_norm":
        if not case.training:
            return _running_rstd(case, inputs, ndim)
        return per_channel(np.asarray(expected["rstd"], dtype=np.float64), ndim)
    rstd = np.asarray(expected["rstd"], dtype=np.float64)
    return rstd.reshape(rstd.shape + (1,) * case.norm_ndim)


def _y(case: Case, inputs: Arrays, expected: Arrays) -> float:
    ndim = inputs["x"].ndim
    weight, bias = _param(case, inputs, "weight", ndim), _param(case, inputs, "bias", ndim)
    return _max(np.abs(weight) * _xhat_magnitude(case, inputs) + np.abs(bias) + np.zeros(inputs["x"].shape))


def _dx(case: Case, inputs: Arrays, expected: Arrays) -> float:
    """rstd * (|g| + |mean(g)| + |xhat| * rms(g)): mean(g * xhat) is at most rms(g) * rms(xhat) <= rms(g)."""
    dy = inputs["dy"].astype(np.float64)
    g = dy * _param(case, inputs, "weight", dy.ndim)
    rstd = _rstd(case, inputs, expected)
    if case.op == "batch_norm" and not case.training:
        return _max(np.abs(g) * rstd)
    axes, _ = group_axes(case, dy.ndim)
    mean_g = np.abs(g.mean(axis=axes, keepdims=True)) if case.op in ("layer_norm", "batch_norm") else 0.0
    rms_g = np.sqrt(np.square(g).mean(axis=axes, keepdims=True))
    return _max(rstd * (np.abs(g) + mean_g + _xhat_magnitude(case, inputs) * rms_g))


def _dweight(case: Case, inputs: Arrays, expected: Arrays) -> float:
    dy = inputs["dy"].astype(np.float64)
    _, reduce = group_axes(case, dy.ndim)
    return _max((np.abs(dy) * _xhat_magnitude(case, inputs)).sum(axis=reduce))


def _dbias(case: Case, inputs: Arrays, expected: Arrays) -> float:
    dy = inputs["dy"].astype(np.float64)
    _, reduce = group_axes(case, dy.ndim)
    return _max(np.abs(dy).sum(axis=reduce))


def _residual_out(case: Case, inputs: Arrays, expected: Arrays) -> float:
    """x + residual rounded once: its own size."""
    return _max(np.abs(np.asarray(expected["residual_out"], dtype=np.float64)))


def _batch(case: Case, inputs: Arrays) -> tuple[np.ndarray, float]:
    """x with the channel axis first and the rest flattened, and the momentum factor."""
    x = np.moveaxis(inputs["x"].astype(np.float64), 1, 0)
    return x.reshape(x.shape[0], -1), 1.0 if case.momentum is None else case.momentum


def _running_mean(case: Case, inputs: Arrays, expected: Arrays) -> float:
    """(1 - m) |running_mean| + m max|x|: a computed mean lies within the channel's values."""
    x, m = _batch(case, inputs)
    return _max((1.0 - m) * np.abs(inputs["running_mean"].astype(np.float64)) + m * np.abs(x).max(axis=1))


def _running_var(case: Case, inputs: Arrays, expected: Arrays) -> float:
    """(1 - m) running_var + m n/(n-1) spread^2, the spread widened by a rounding of the mean on each side."""
    x, m = _batch(case, inputs)
    u = unit_roundoff(stats_dtype(case.dtype))
    spread = x.max(axis=1) - x.min(axis=1) + 2.0 * u * np.abs(x).max(axis=1)
    count = x.shape[1]
    unbiased = np.square(spread) * count / max(count - 1, 1)
    return _max((1.0 - m) * inputs["running_var"].astype(np.float64) + m * unbiased)


BOUNDS: dict[str, Callable[[Case, Arrays, Arrays], float]] = {
    "y": _y,
    "dx": _dx,
    "dweight": _dweight,
    "dbias": _dbias,
    "residual_out": _residual_out,
    "running_mean": _running_mean,
    "running_var": _running_var,
}


def bound(case: Case, output: str, inputs: Arrays, expected: Arrays) -> float:
    """The largest magnitude ``output`` can have for these inputs, however the statistics are rounded."""
    return BOUNDS[output](case, inputs, expected)


def _max(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.max(finite)) if finite.size else 0.0
