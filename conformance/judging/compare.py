"""Compare one backend output with the oracle's: NaN/Inf positions first, then error figures.

A comparison is a ``ComparisonRecord`` from the start: the figures judged here are the figures the
results file holds, with the rule that judged them (``tolerance``, including ``atol_effective``).

Every comparison records its figures (max abs, max rel, ULP distance, worst_ratio) whether it
passes or not, so reports can show headroom. worst_ratio = max |a - e| / (atol_eff + rtol |e|),
with atol_eff = atol * scale + min(cond * mean_error, mean_cap) * sensitivity: scale is the size of
the terms behind the output, sensitivity how far the output moves per unit error in xhat
(conformance.judging.scales), mean_error the error a rounded mean puts into xhat and mean_cap the
most that error can be (conformance.judging.conditioning). An allowance of 0 (an exact zero made of
exact zeros, or an output that is one rounding of an exact value) asks for equality. Each comparison
also records the share of elements that differ from the correctly rounded answer and, for
half-precision outputs, the rounding bias that fails it when it leans one way
(conformance.judging.rounding).
"""

from __future__ import annotations

import numpy as np

from conformance.judging.allowance import Factors
from conformance.judging.rounding import bias, mismatch_fraction
from conformance.judging.tolerances import Tolerance
from conformance.model.dtypes import finfo, ulp
from conformance.results.result import ComparisonRecord, ToleranceRecord


def _recorded(tol: Tolerance, atol_effective: float) -> ToleranceRecord:
    """The rule as a comparison records it, with the allowance it came to for this case."""
    return ToleranceRecord(
        tol.rtol, tol.atol, tol.cond, tol.source, tol.why, atol_effective, tol.rule, dict(tol.keys), tol.file
    )


# Scale 1 and no mean-rounding term: atol is an absolute allowance.
ABSOLUTE = Factors()


def compare(
    name: str,
    actual: np.ndarray,
    expected: np.ndarray,
    tol: Tolerance,
    dtype: str,
    factors: Factors = ABSOLUTE,
) -> ComparisonRecord:
    """Compare ``actual`` (any float dtype) with float64 ``expected`` under ``tol``; the default
    factors make atol absolute."""
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return _problem(name, e, tol, f"shape {a.shape} returned, {e.shape} expected")
    finite = np.isfinite(e)
    atol_effective = factors.atol(tol)
    ratio = _ratios(a, e, tol.rtol, atol_effective)
    ratio = np.where(_overflow_agrees(a, e, dtype, atol_effective + tol.rtol * np.abs(e)), 0.0, ratio)
    spacing = ulp(e, dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        diff = np.abs(a - e)
        rel = np.where(e != 0, diff / np.abs(e), np.where(diff == 0, 0.0, np.inf))
        ulps = diff / spacing
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else ()
    both = finite & np.isfinite(a)
    return ComparisonRecord(
        output=name,
        numel=int(e.size),
        mismatched=int(np.count_nonzero(ratio > 1.0)),
        max_abs=_max(diff[both]),
        max_rel=_max(rel[both]),
        max_ulp=_max(ulps[both]),
        worst_ratio=_max(ratio),
        worst_index=tuple(int(i) for i in worst),
        actual_at_worst=float(a[worst]) if ratio.size else 0.0,
        expected_at_worst=float(e[worst]) if ratio.size else 0.0,
        scale=factors.scale,
        mean_error=factors.mean_error,
        sensitivity=factors.sensitivity,
        mean_cap=factors.mean_cap,
        mismatch_fraction=mismatch_fraction(a, e, dtype),
        rounding=bias(a, e, dtype, spacing),
        tolerance=_recorded(tol, atol_effective),
    )


def _ratios(a: np.ndarray, e: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """Per-element error over allowance; non-finite positions that disagree count as infinite."""
    same_special = (np.isnan(a) & np.isnan(e)) | (np.isinf(e) & (a == e))
    allowed = atol + rtol * np.abs(e)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.abs(a - e) / allowed
    ratio = np.where(allowed == 0, np.where(a == e, 0.0, np.inf), ratio)
    ratio = np.where(same_special, 0.0, ratio)
    # Any remaining NaN comes from a position where exactly one side is non-finite.
    return np.where(np.isnan(ratio), np.inf, ratio)


def _overflow_agrees(a: np.ndarray, e: np.ndarray, dtype: str, allowed: np.ndarray) -> np.ndarray:
    """An exact value beyond the dtype's range rounds to +-inf: inf (or the max) of its sign is right.
    So is an inf where a value within the allowance would round to it: |e| + allowed reaches the
    rounding boundary max + ulp(max)/2 (65520 in float16), as a float16 gradient of 65041 computed
    in float32 may."""
    info = finfo(dtype)
    limit = float(info.max)
    boundary = limit + float(ulp(np.asarray(limit), dtype)) / 2
    with np.errstate(invalid="ignore", over="ignore"):
        reachable = np.abs(e) + allowed >= boundary
    beyond = np.isfinite(e) & ((np.abs(e) > limit) | reachable)
    agrees: np.ndarray = beyond & (np.sign(a) == np.sign(e)) & (np.abs(a) >= limit)
    return agrees


def _max(values: np.ndarray) -> float:
    return float(np.max(values)) if values.size else 0.0


def _problem(name: str, e: np.ndarray, tol: Tolerance, problem: str) -> ComparisonRecord:
    inf = float("inf")
    recorded = _recorded(tol, tol.atol)  # scale 1, no mean-error term
    return ComparisonRecord(
        name, int(e.size), int(e.size), inf, inf, inf, inf, (), 0.0, 0.0, 1.0, 0.0, 0.0, recorded, problem
    )
