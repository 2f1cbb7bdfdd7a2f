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

from conformance.model.case import INSTANCE_NORM, Case
from conformance.model.dtypes import stats_dtype, unit_roundoff
from conformance.model.geometry import Axes, geometry
from conformance.model.inputs import groups

Arrays = Mapping[str, np.ndarray]

# Ops whose computed statistics include a mean that the normalized values subtract.
MEAN_OPS = frozenset({"layer_norm", "batch_norm", "group_norm", "instance_norm", "add_layer_norm"})


def group_axes(case: Case) -> tuple[Axes, Axes]:
    """(axes one normalization group spans, axes a parameter gradient sums over), in ``view``'s shape."""
    geo = geometry(case)
    return geo.group_axes, geo.reduce_axes


def view(case: Case, values: np.ndarray) -> np.ndarray:
    """An activation-shaped array as float64 in the geometry view, where groups are plain axes."""
    return values.astype(np.float64).reshape(geometry(case).shape)


def per_param(case: Case, values: np.ndarray) -> np.ndarray:
    """A parameter-shaped array as float64, reshaped to broadcast against ``view``."""
    return values.astype(np.float64).reshape(geometry(case).param_shape)


def group_size(case: Case) -> int:
    """n, the number of values one mean and one rstd are computed from."""
    return groups(case)[1]


def xhat_bound(case: Case) -> float:
    """sqrt(n): no normalized value computed with batch statistics can be larger, however rounded."""
    return float(np.sqrt(group_size(case)))


def _param(case: Case, inputs: Arrays, name: str) -> np.ndarray | float:
    """A parameter shaped to broadcast against x (0 or 1 where the case has none)."""
    present = case.weight if name == "weight" else bool(case.bias)
    if not present:
        return 1.0 if name == "weight" else 0.0
    return per_param(case, inputs[name]) + (case.weight_offset if name == "weight" else 0.0)


def _running_rstd(case: Case, inputs: Arrays) -> np.ndarray:
    rstd: np.ndarray = 1.0 / np.sqrt(per_param(case, inputs["running_var"]) + case.eps)
    return rstd


def _xhat_magnitude(case: Case, inputs: Arrays) -> np.ndarray | float:
    """|xhat| at most: sqrt(n) with batch statistics, the exact value with running statistics."""
    if not case.uses_batch_stats:
        centred = view(case, inputs["x"]) - per_param(case, inputs["running_mean"])
        magnitude: np.ndarray = np.abs(centred) * _running_rstd(case, inputs)
        return magnitude
    return xhat_bound(case)


def _rstd(case: Case, inputs: Arrays, expected: Arrays) -> np.ndarray:
    """rstd per group, shaped to broadcast against the view of x."""
    if not case.uses_batch_stats:
        return _running_rstd(case, inputs)
    return np.asarray(expected["rstd"], dtype=np.float64).reshape(geometry(case).stats_shape)


def _y(case: Case, inputs: Arrays, expected: Arrays) -> float:
    weight, bias = _param(case, inputs, "weight"), _param(case, inputs, "bias")
    x = view(case, inputs["x"])
    return _max(np.abs(weight) * _xhat_magnitude(case, inputs) + np.abs(bias) + np.zeros(x.shape))


def _dx(case: Case, inputs: Arrays, expected: Arrays) -> float:
    """rstd * (|g| + |mean(g)| + |xhat| * rms(g)): mean(g * xhat) is at most rms(g) * rms(xhat) <= rms(g)."""
    g = view(case, inputs["dy"]) * _param(case, inputs, "weight")
    rstd = _rstd(case, inputs, expected)
    if not case.uses_batch_stats:
        return _max(np.abs(g) * rstd)
    axes, _ = group_axes(case)
    mean_g = np.abs(g.mean(axis=axes, keepdims=True)) if case.op in MEAN_OPS else 0.0
    rms_g = np.sqrt(np.square(g).mean(axis=axes, keepdims=True))
    # The add ops' dL/dh also carries the cotangent of residual_out, added once.
    incoming = np.abs(view(case, inputs["dresidual_out"])) if "dresidual_out" in inputs else 0.0
    return _max(rstd * (np.abs(g) + mean_g + _xhat_magnitude(case, inputs) * rms_g) + incoming)


def _dweight(case: Case, inputs: Arrays, expected: Arrays) -> float:
    _, reduce = group_axes(case)
    return _max((np.abs(view(case, inputs["dy"])) * _xhat_magnitude(case, inputs)).sum(axis=reduce))


def _dbias(case: Case, inputs: Arrays, expected: Arrays) -> float:
    _, reduce = group_axes(case)
    return _max(np.abs(view(case, inputs["dy"])).sum(axis=reduce))


def _residual_out(case: Case, inputs: Arrays, expected: Arrays) -> float:
    """x + residual rounded once: its own size."""
    return _max(np.abs(np.asarray(expected["residual_out"], dtype=np.float64)))


def _batch(case: Case, inputs: Arrays) -> tuple[np.ndarray, float]:
    """x with the channel axis first and the rest flattened, and the momentum factor."""
    x = np.moveaxis(inputs["x"].astype(np.float64), 1, 0)
    return x.reshape(x.shape[0], -1), 1.0 if case.momentum is None else case.momentum


def _variance_count(case: Case) -> int:
    """The count an unbiased running variance divides by count - 1: per channel (BN), per instance (IN)."""
    return case.param_terms // case.shape[0] if case.op == INSTANCE_NORM else case.param_terms


def _running_mean(case: Case, inputs: Arrays, expected: Arrays) -> float:
    """(1 - m) |running_mean| + m max|x|: a computed mean lies within the channel's values."""
    x, m = _batch(case, inputs)
    return _max((1.0 - m) * np.abs(inputs["running_mean"].astype(np.float64)) + m * np.abs(x).max(axis=1))


def _running_var(case: Case, inputs: Arrays, expected: Arrays) -> float:
    """(1 - m) running_var + m n/(n-1) spread^2, the spread widened by a rounding of the mean on each side."""
    x, m = _batch(case, inputs)
    u = unit_roundoff(stats_dtype(case.dtype))
    spread = x.max(axis=1) - x.min(axis=1) + 2.0 * u * np.abs(x).max(axis=1)
    count = _variance_count(case)
    unbiased = np.square(spread) * count / max(count - 1, 1)
    return _max((1.0 - m) * inputs["running_var"].astype(np.float64) + m * unbiased)


BOUNDS: dict[str, Callable[[Case, Arrays, Arrays], float]] = {
    "y": _y,
    "dx": _dx,
    "dresidual": _dx,
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
