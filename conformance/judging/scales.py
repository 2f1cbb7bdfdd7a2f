"""The scale each output's atol is relative to: the size of the terms that produce it.

A result can be far smaller than the terms it is computed from (dx cancels rstd * g against its
row means; dweight sums M signed terms), and rounding errors scale with the terms, not with the
result. So atol multiplies max(rms(expected), typical term size), never the result alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from conformance.model.case import Case

Arrays = Mapping[str, np.ndarray]


def _rms(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)].astype(np.float64)
    return float(np.sqrt(np.mean(np.square(finite)))) if finite.size else 0.0


def _rstd(case: Case, inputs: Arrays, expected: Arrays) -> np.ndarray:
    if "rstd" in expected:
        return np.asarray(expected["rstd"], dtype=np.float64)
    # BatchNorm eval normalizes with the running variance.
    return 1.0 / np.sqrt(inputs["running_var"].astype(np.float64) + case.eps)


def _rms_xhat(case: Case, inputs: Arrays, expected: Arrays) -> float:
    """rms of the normalized values: sqrt(1 - eps * rstd^2) per group when batch statistics are used."""
    rstd = _rstd(case, inputs, expected)
    if "rstd" in expected:
        return float(np.sqrt(np.clip(np.mean(1.0 - case.eps * np.square(rstd)), 0.0, None)))
    mean = inputs["running_mean"].astype(np.float64)
    shape = (1, -1) + (1,) * (inputs["x"].ndim - 2)
    return _rms((inputs["x"].astype(np.float64) - mean.reshape(shape)) * rstd.reshape(shape))


def _weight(case: Case, inputs: Arrays) -> float:
    if not case.weight:
        return 1.0
    return _rms(inputs["weight"].astype(np.float64) + case.weight_offset)


def _dx(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return _rms(inputs["dy"]) * _weight(case, inputs) * _rms(_rstd(case, inputs, expected))


def _dweight(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return float(np.sqrt(case.rows)) * _rms(inputs["dy"]) * _rms_xhat(case, inputs, expected)


def _dbias(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return float(np.sqrt(case.rows)) * _rms(inputs["dy"])


TERMS: dict[str, Callable[[Case, Arrays, Arrays], float]] = {"dx": _dx, "dweight": _dweight, "dbias": _dbias}


def _y_sensitivity(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return _weight(case, inputs)


def _dx_sensitivity(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return _dx(case, inputs, expected)


def _dweight_sensitivity(case: Case, inputs: Arrays, expected: Arrays) -> float:
    return float(np.sqrt(case.rows)) * _rms(inputs["dy"])


# How much each output moves per unit of absolute error in xhat (the conditioning term's unit).
SENSITIVITY: dict[str, Callable[[Case, Arrays, Arrays], float]] = {
    "y": _y_sensitivity,
    "dx": _dx_sensitivity,
    "dweight": _dweight_sensitivity,
}


def sensitivity(case: Case, output: str, inputs: Arrays, expected: Arrays) -> float:
    """|d output / d xhat| in rms terms; 0 for outputs that do not depend on xhat."""
    return SENSITIVITY[output](case, inputs, expected) if output in SENSITIVITY else 0.0


def scale(case: Case, output: str, inputs: Arrays, expected: Arrays) -> float:
    """max(rms(expected), term size); 1 where both are 0 (then atol is absolute)."""
    terms = TERMS[output](case, inputs, expected) if output in TERMS else 0.0
    value = max(_rms(np.asarray(expected[output])), terms)
    return value if value > 0 and np.isfinite(value) else 1.0
