"""Crafted probe inputs: small tensors on which conventions disagree by far more than rounding.

Every builder is deterministic (fixed values or a fixed seed) and returns inputs already rounded to
their dtypes, like ``make_inputs``. Values are dyadic where the probe relies on exact arithmetic.
"""

from __future__ import annotations

import numpy as np

from conformance.model.case import Case
from conformance.model.dtypes import round_to, unit_roundoff

Inputs = dict[str, np.ndarray]


def _params(case: Case, *, weight: np.ndarray | None = None, bias: np.ndarray | None = None) -> Inputs:
    """Neutral parameters (ones, zeros) unless given: they add no rounding to what the probe measures."""
    shape = case.param_shape
    params: Inputs = {}
    if case.weight:
        params["weight"] = round_to(np.ones(shape) if weight is None else weight, case.weight_dtype)
    if case.bias:
        params["bias"] = round_to(np.zeros(shape) if bias is None else bias, case.weight_dtype)
    return params


def rows(case: Case, x: np.ndarray, **params: np.ndarray) -> Inputs:
    """LN/RMS inputs: ``x`` (rows in the layout of case.shape) and the parameters."""
    return {
        "x": round_to(np.asarray(x, dtype=np.float64).reshape(case.shape), case.dtype),
        **_params(case, **params),
    }


def channels(
    case: Case,
    columns: np.ndarray,
    running_mean: np.ndarray | None = None,
    running_var: np.ndarray | None = None,
    **params: np.ndarray,
) -> Inputs:
    """BN inputs for an (N, C) case: ``columns`` is (N, C); running stats default to 0 and 1."""
    c = case.shape[1]
    rm = np.zeros(c) if running_mean is None else running_mean
    rv = np.ones(c) if running_var is None else running_var
    return {
        "x": round_to(np.asarray(columns, dtype=np.float64), case.dtype),
        **_params(case, **params),
        "running_mean": round_to(rm, case.weight_dtype),
        "running_var": round_to(rv, case.weight_dtype),
    }


def instances(
    case: Case,
    x: np.ndarray,
    running_mean: np.ndarray | None = None,
    running_var: np.ndarray | None = None,
    **params: np.ndarray,
) -> Inputs:
    """GN/IN inputs: ``x`` in the layout of case.shape, the parameters, and (InstanceNorm with
    running statistics) running_mean and running_var, 0 and 1 unless given."""
    inputs = rows(case, x, **params)
    if case.track_running_stats:
        c = case.shape[1]
        inputs["running_mean"] = round_to(
            np.zeros(c) if running_mean is None else running_mean, case.weight_dtype
        )
        inputs["running_var"] = round_to(
            np.ones(c) if running_var is None else running_var, case.weight_dtype
        )
    return inputs


def alternating(scales: list[float], length: int) -> np.ndarray:
    """Rows (+s, -s, +s, ...): mean 0 and variance (and mean square) s^2, exactly."""
    signs = np.where(np.arange(length) % 2 == 0, 1.0, -1.0)
    return np.outer(scales, signs)


def cancelling(dtype: str, count: int) -> np.ndarray:
    """Rows c +- ulp(c) with c = 2^12 (float32): exact two-pass variance ulp^2, one-pass exactly 0.

    Each square rounds to c^2 +- 2 c ulp (the ulp^2 term falls below c^2's ulp), every partial sum
    of a balanced row of four is exact, so E[x^2] - E[x]^2 = 0 whatever the summation order.
    """
    bits = _mantissa_bits(dtype)
    out = []
    for i in range(count):
        c = 2.0 ** (12 - (i % 2))
        ulp = c * 2.0**-bits
        signs = np.array([1.0, -1.0, 1.0, -1.0] if i % 2 == 0 else [1.0, -1.0, -1.0, 1.0])
        out.append(c + ulp * signs)
    return np.array(out)


# Offsets (in ulps of the row's centre) whose mean falls a quarter or three quarters of an ulp off
# the grid: a mean rounded to the activation dtype is off by ulp/4, ~0.6 of the row's spread.
_QUARTERS = ([1, 0, 0, 0], [1, 1, 1, 0], [-1, 0, 0, 0], [2, 1, 0, 0], [0, -1, -1, -1], [3, 0, 0, 0])


def off_grid_means(dtype: str, count: int) -> np.ndarray:
    """Rows of four values c + k * ulp(c), ulp(c) = 1/2, whose exact mean is not representable."""
    bits = _mantissa_bits(dtype)
    base = 2.0 ** (bits - 1)  # ulp(base) = 2^(bits - 1) * 2^-bits = 1/2
    out = []
    for i in range(count):
        centre = base * (1.0 + (i % 6 + 1) / 8.0)
        out.append(centre + 0.5 * np.array(_QUARTERS[i % len(_QUARTERS)], dtype=np.float64))
    return np.array(out)


def seeded(seed: int, shape: tuple[int, ...], *, loc: float = 0.0, scale: float = 1.0) -> np.ndarray:
    return loc + scale * np.random.default_rng(seed).standard_normal(shape)


def dyadic(seed: int, shape: tuple[int, ...], *, step: float = 2.0**-4, loc: float = 0.0) -> np.ndarray:
    """Normal-ish values on a grid of ``step``: exact in every dtype and in short sums."""
    return loc + step * np.round(seeded(seed, shape) / step)


def ladder(length: int) -> np.ndarray:
    """Eight rows of magnitude 1e-8, 1e-7, ..., 1e-1: mean squares from 1e-16 (far below any default
    eps, so y = x / sqrt(eps) there) up to 1e-2 (where the placement of eps shows)."""
    shape = (8, length)
    spread = 1.0 + np.arange(8 * length).reshape(shape) % 7 / 8.0
    magnitudes = 10.0 ** np.arange(-8, 0, dtype=np.float64).reshape(8, 1)
    values: np.ndarray = magnitudes * spread * alternating([1.0] * 8, length)
    return values


def _mantissa_bits(dtype: str) -> int:
    bits: int = round(float(-np.log2(unit_roundoff(dtype)))) - 1
    return bits
