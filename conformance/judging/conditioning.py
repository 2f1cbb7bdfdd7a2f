"""Conditioning of a case: how much a correctly rounded mean can move the normalized values.

A mean computed in the statistics precision u_s carries an error of a few u_s * |mean|; after
(x - mean) * rstd that is an absolute error of u_s * kappa with kappa = max |mean| / sqrt(var + eps)
over the normalization groups. Offset rows (kappa ~ 1e3) and constant rows with tiny eps (kappa up
to 1/sqrt(eps)) are ill-conditioned for every float32-statistics implementation, not just a bad one.
Zero rows contribute nothing (their mean is exactly 0).

The term has a cap (``mean_cap``): no normalized value can be off by more than the bound on the
values themselves, sqrt(n) (conformance.judging.bounds). Rows of one element have an exact mean
(x / 1), so all that is left is the rounding of a kernel that folds (x - mean) * rstd into
x * rstd - mean * rstd: one rounding of each product, 2 u_s * |x| * rstd at most (torch's CPU
LayerNorm, with a fused multiply-add, returns dweight 1.2e-5 instead of 0 on float32 rows of one
element with eps 1e-5), and never more than the bound 1: with large values and a tiny eps those
roundings reach far past it, and an allowance there would pass any answer.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conformance.judging.bounds import MEAN_OPS, group_size, xhat_bound
from conformance.model.case import Case
from conformance.model.dtypes import stats_dtype, unit_roundoff


def kappa(case: Case, expected: Mapping[str, np.ndarray]) -> float:
    """max |mean| * rstd over groups for ops that subtract a computed mean, else 0."""
    if case.op not in MEAN_OPS or not case.uses_batch_stats:
        return 0.0
    values = np.abs(expected["mean"]) * expected["rstd"]
    return float(np.max(values)) if values.size else 0.0


def mean_error(case: Case, expected: Mapping[str, np.ndarray]) -> float:
    """u_s * kappa: the normalized-value error one rounding of the mean causes."""
    return unit_roundoff(stats_dtype(case.dtype)) * kappa(case, expected)


def mean_cap(case: Case, error: float) -> float:
    """The most cond * mean_error may reach, given the case's mean_error: sqrt(n), or for groups of
    one value two roundings, at most that bound (1)."""
    return min(2.0 * error, xhat_bound(case)) if group_size(case) == 1 else xhat_bound(case)
