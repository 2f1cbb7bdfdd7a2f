"""The scale each output's atol is relative to: the size of the terms that produce it.

A result can be far smaller than the terms it is computed from (dx cancels rstd * g against its
row means; dweight sums M signed terms), and rounding errors scale with the terms, not with the
result. So atol multiplies max(rms(expected), typical term size), never the result alone.

Where both are exactly 0 the output is a sum or product of exact zeros (y and dweight of rows whose
normalized values are all exactly 0, x + residual of zero rows), which every formulation returns
exactly: the scale is then 0 and the output is checked exactly. Running statistics are the exception:
a variance of a constant channel computed with a rounded mean is a tiny square, not 0 (unless the
channel and the running statistics are exact zeros: then their bound is 0 too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from conformance.judging.bounds import bound, group_axes, per_param, view
from conformance.model import residual
from conformance.model.case import RMS_OPS, Case
from conformance.oracle.common import moments

Arrays = Mapping[str, np.ndarray]
# Magnitudes whose squares stay normal float64 numbers (squares overflow past 1.3e154 and become
# subnormal below 1.5e-154): outside them the values are divided by the largest before squaring, so a
# running variance of 1e-320 or 1e300 gets its own size as scale, not 0 or inf.
_SQUARES_NORMAL = (1e-150, 1e150)


def _rms(values: np.ndarray) -> float:
    # The same float64 elements in the same (C) order as values[isfinite].astype(float64), hence the
    # same sums, without the two copies of an all-finite float64 array (most outputs and dy).
    wide = np.asarray(values, dtype=np.float64)
    mask = np.isfinite(wide)
    finite = wide.reshape(-1) if mask.all() else wide[mask]
    if not finite.size:
        return 0.0
    largest = float(np.max(np.abs(finite)))
    low, high = _SQUARES_NORMAL
    if largest == 0.0 or low <= largest <= high:
        return float(np.sqrt(np.mean(np.square(finite))))
    return largest * float(np.sqrt(np.mean(np.square(finite / largest))))


def _rstd(case: Case, inputs: Arrays, expected: Arrays) -> np.ndarray:
    if "rstd" in expected:
        return np.asarray(expected["rstd"], dtype=np.float64)
    # BatchNorm eval normalizes with the running variance.
    return 1.0 / np.sqrt(inputs["running_var"].astype(np.float64) + case.eps)


def _rms_xhat(case: Case, inputs: Arrays, expected: Arrays) -> float:
    """rms of the normalized values: sqrt(var / (var + eps)) per group when batch statistics are used.

    From the oracle's two-pass variance rather than 1 - eps * rstd^2, so rows without spread give
    exactly 0 instead of a cancellation residue.
    """
    rstd = _rstd(case, inputs, expected)
    if "rstd" in expected:
        x = view(case, residual.normalized(case, inputs))
        axes = group_axes(case)[0]
        var = np.square(x).mean(axis=axes) if case.op in RMS_OPS else moments(x, axes)[2]
        return float(np.sqrt(np.mean(var / (var + case.eps))))
    centred = view(case, inputs["x"]) - per_param(case, inputs["running_mean"])
    return _rms(centred * per_param(case, rstd))


def _weight(case: Case, inputs: Arrays) -> float:
    if not case.weight:
        return 1.0
    return _rms(inputs["weight"].astype(np.float64) + case.weight_offset)


def _dx(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return _rms(inputs["dy"]) * _weight(case, inputs) * _rms(_rstd(case, inputs, expected))


def _dweight(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return float(np.sqrt(case.param_terms)) * _rms(inputs["dy"]) * _rms_xhat(case, inputs, expected)


def _dbias(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return float(np.sqrt(case.param_terms)) * _rms(inputs["dy"])


TERMS: dict[str, Callable[[Case, Arrays, Arrays], float]] = {
    "dx": _dx,
    "dresidual": _dx,
    "dweight": _dweight,
    "dbias": _dbias,
}


def _y_sensitivity(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return _weight(case, inputs)


def _dx_sensitivity(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return _dx(case, inputs, expected)


def _dweight_sensitivity(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return float(np.sqrt(case.param_terms)) * _rms(inputs["dy"])


# How much each output moves per unit of absolute error in xhat (the conditioning term's unit).
SENSITIVITY: dict[str, Callable[[Case, Arrays, Arrays], float]] = {
    "y": _y_sensitivity,
    "dx": _dx_sensitivity,
    "dresidual": _dx_sensitivity,
    "dweight": _dweight_sensitivity,
}


def sensitivity(case: Case, output: str, inputs: Arrays, expected: Arrays) -> float:
    """|d output / d xhat| in rms terms; 0 for outputs that do not depend on xhat."""
    return SENSITIVITY[output](case, inputs, expected) if output in SENSITIVITY else 0.0


# Outputs whose all-zero value with zero terms is still computed with a rounding (see the module doc).
ROUNDED_ZEROS = frozenset({"running_mean", "running_var"})


def scale(case: Case, output: str, inputs: Arrays, expected: Arrays) -> float:
    """max(rms(expected), term size); 0 where both are 0 (an exact zero, checked exactly), except
    for the running statistics, whose atol is then absolute (scale 1) unless their bound is 0 too."""
    terms = TERMS[output](case, inputs, expected) if output in TERMS else 0.0
    value = max(_rms(np.asarray(expected[output])), terms)
    if not np.isfinite(value):
        return 1.0
    if value == 0 and output in ROUNDED_ZEROS:
        # Statistics of exact zeros blended with zero running statistics are exact zeros.
        return 1.0 if bound(case, output, inputs, expected) > 0 else 0.0
    return value
