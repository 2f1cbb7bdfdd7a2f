"""Compare one backend output with the oracle's: NaN/Inf positions first, then error figures.

Every comparison records its figures (max abs, max rel, ULP distance, worst_ratio) whether it
passes or not, so reports can show headroom. worst_ratio = max |a - e| / (atol_eff + rtol |e|),
with atol_eff = atol * scale + cond * mean_error * sensitivity: scale is the size of the terms behind
the output, sensitivity how far the output moves per unit error in xhat (conformance.scales), and
mean_error the error a rounded mean puts into xhat (conformance.conditioning).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conformance.dtypes import finfo, ulp
from conformance.tolerances import Tolerance


@dataclass(frozen=True)
class Comparison:
    """Figures for one output of one case; ``passed`` iff worst_ratio <= 1 and no problem."""

    output: str
    numel: int
    mismatched: int
    max_abs: float
    max_rel: float
    max_ulp: float
    worst_ratio: float
    worst_index: tuple[int, ...]
    actual_at_worst: float
    expected_at_worst: float
    scale: float
    mean_error: float
    sensitivity: float
    tolerance: Tolerance
    problem: str = ""

    @property
    def atol_effective(self) -> float:
        return self.tolerance.atol * self.scale + self.tolerance.cond * self.mean_error * self.sensitivity

    @property
    def passed(self) -> bool:
        return not self.problem and self.worst_ratio <= 1.0

    def to_dict(self) -> dict[str, object]:
        return {
            "output": self.output,
            "numel": self.numel,
            "mismatched": self.mismatched,
            "max_abs": jsonable(self.max_abs),
            "max_rel": jsonable(self.max_rel),
            "max_ulp": jsonable(self.max_ulp),
            "worst_ratio": jsonable(self.worst_ratio),
            "worst_index": list(self.worst_index),
            "actual_at_worst": jsonable(self.actual_at_worst),
            "expected_at_worst": jsonable(self.expected_at_worst),
            "scale": jsonable(self.scale),
            "mean_error": self.mean_error,
            "sensitivity": self.sensitivity,
            "tolerance": {**self.tolerance.to_dict(), "atol_effective": jsonable(self.atol_effective)},
            "problem": self.problem,
        }


def jsonable(value: float) -> float | str:
    """JSON has no inf/nan: non-finite figures are written as the strings "inf", "-inf", "nan"."""
    return value if np.isfinite(value) else str(value)


def compare(
    name: str,
    actual: np.ndarray,
    expected: np.ndarray,
    tol: Tolerance,
    dtype: str,
    *,
    scale: float = 1.0,
    mean_error: float = 0.0,
    sensitivity: float = 0.0,
) -> Comparison:
    """Compare ``actual`` (any float dtype) with float64 ``expected`` under ``tol``."""
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return _problem(name, e, tol, f"shape {a.shape} returned, {e.shape} expected")
    finite = np.isfinite(e)
    ratio = _ratios(a, e, tol.rtol, tol.atol * scale + tol.cond * mean_error * sensitivity)
    ratio = np.where(_overflow_agrees(a, e, dtype), 0.0, ratio)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        diff = np.abs(a - e)
        rel = np.where(e != 0, diff / np.abs(e), np.where(diff == 0, 0.0, np.inf))
        ulps = diff / ulp(e, dtype)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else ()
    both = finite & np.isfinite(a)
    return Comparison(
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
        scale=scale,
        mean_error=mean_error,
        sensitivity=sensitivity,
        tolerance=tol,
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


def _overflow_agrees(a: np.ndarray, e: np.ndarray, dtype: str) -> np.ndarray:
    """An exact value beyond the dtype's range rounds to +-inf: inf (or the max) of its sign is right."""
    limit = float(finfo(dtype).max)
    beyond = np.isfinite(e) & (np.abs(e) > limit)
    agrees: np.ndarray = beyond & (np.sign(a) == np.sign(e)) & (np.abs(a) >= limit)
    return agrees


def _max(values: np.ndarray) -> float:
    return float(np.max(values)) if values.size else 0.0


def _problem(name: str, e: np.ndarray, tol: Tolerance, problem: str) -> Comparison:
    inf = float("inf")
    return Comparison(
        name, int(e.size), int(e.size), inf, inf, inf, inf, (), 0.0, 0.0, 1.0, 0.0, 0.0, tol, problem
    )
