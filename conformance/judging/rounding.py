"""Rounding as part of conformance: how often an output differs from the correctly rounded answer, and
whether its errors lean one way.

A per-element tolerance cannot see a rounding mode: an output rounded toward zero is within one ulp
everywhere, like one rounded to nearest. What differs is the mean of the signed errors. In units of
the output's ulp at the exact value, round-to-nearest errors lie in [-1/2, 1/2] and average 0 (the
exact values' positions between two representable numbers are spread evenly), truncation averages
-1/2 toward zero and rounding up +1/2 toward +inf. Two means are kept: ``bias`` signs each error by
the exact value's sign (negative = toward zero: truncation, a scale that shrinks every output) and
``drift`` keeps the raw sign (negative = toward -inf: rounding down or up on outputs of both signs,
where ``bias`` averages out).

The limit is distribution-free (Hoeffding): only elements within one ulp of the exact value count
(larger errors come from before the last rounding and are the tolerance's business), so each term lies
in [-1, 1], and for n independent terms with mean 0, P(|mean| >= t) <= 2 exp(-n t^2 / 2). With a false
alarm rate of ALPHA per comparison the limit is t = sqrt(2 ln(2 / ALPHA) / n); below MIN_ELEMENTS
(t = 0.34) a mean of -1/2 is not told apart reliably, and the statistic is recorded but not judged.
The terms are independent only where the exact values are spread: exact values that share one
correctly rounded value (a group of thousands of nearly equal outputs, as in a GroupNorm group
dominated by an outlier) repeat one rounding error, so each such cluster is one term, its mean.
"""

from __future__ import annotations

import math

import numpy as np

from conformance.model.dtypes import round_to, ulp
from conformance.results.result import RoundingRecord

# Outputs judged for bias: the half-precision ones, where one ulp is larger than every error a
# correct float32 computation makes before the last rounding.
JUDGED_DTYPES = frozenset({"float16", "bfloat16"})
MIN_ELEMENTS = 256
ALPHA = 1e-6


def limit(n: int) -> float:
    """The largest |mean| round-to-nearest reaches over n terms but with probability ALPHA."""
    return math.sqrt(2.0 * math.log(2.0 / ALPHA) / n) if n else math.inf


def mismatch_fraction(actual: np.ndarray, expected: np.ndarray, dtype: str) -> float:
    """The share of elements that differ from the correctly rounded (nearest-even) oracle value."""
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape or not e.size:
        return 1.0 if a.shape != e.shape else 0.0
    with np.errstate(over="ignore"):
        rounded = round_to(e, dtype).astype(np.float64)
    same = (a == rounded) | (np.isnan(a) & np.isnan(rounded))
    return float(np.count_nonzero(~same)) / e.size


def bias(
    actual: np.ndarray, expected: np.ndarray, dtype: str, spacing: np.ndarray | None = None
) -> RoundingRecord | None:
    """The mean signed errors in ulps (``bias`` toward zero, ``drift`` toward -inf); None where the
    output dtype is not judged for bias. ``spacing``: ulp(expected, dtype), when the caller has it."""
    if dtype not in JUDGED_DTYPES:
        return None
    a = np.asarray(actual).astype(np.float64).ravel()
    e = np.asarray(expected, dtype=np.float64).ravel()
    step = (ulp(e, dtype) if spacing is None else np.asarray(spacing)).ravel()
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        errors = (a - e) / step
    within = np.isfinite(a) & np.isfinite(e) & (e != 0) & (np.abs(errors) <= 1.0)
    with np.errstate(over="ignore"):
        nearest = round_to(e[within], dtype).astype(np.float64)
    # Exact values that round to one representable value sit at nearly one place between its
    # neighbours (GN/IN outlier groups: 6400 values, 16 roundings), so they are one term, not many.
    clusters = _clusters(nearest)
    raw = _cluster_means(errors[within], clusters)
    n = int(raw.size)
    toward_zero = _cluster_means(errors[within] * np.sign(e[within]), clusters)
    return RoundingRecord(
        bias=_mean(toward_zero),
        bias_se=_se(toward_zero),
        drift=_mean(raw),
        drift_se=_se(raw),
        n=n,
        limit=limit(n) if n >= MIN_ELEMENTS else math.inf,
    )


def _clusters(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each element's distinct key (its index among the sorted distinct keys) and each key's count:
    one sort of the keys for both means."""
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return inverse, counts


def _cluster_means(values: np.ndarray, clusters: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The mean of ``values`` over each cluster of ``_clusters``."""
    inverse, counts = clusters
    means: np.ndarray = np.bincount(inverse, weights=values) / counts
    return means


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else 0.0


def _se(values: np.ndarray) -> float:
    return float(values.std(ddof=1) / math.sqrt(values.size)) if values.size > 1 else math.inf
