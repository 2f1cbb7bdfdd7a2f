"""The per-case factors of an output's allowance, computed once for every caller.

    allowance = atol * scale + min(cond * mean_error, mean_cap) * sensitivity + rtol * |e|

The mean-rounding term is an error in the normalized values and stops at mean_cap
(conformance.judging.conditioning): past the bound on the values themselves, sqrt(n), it would let
any answer of the right size pass. The checks, the failure shrinker, replay and the properties all
judge with these factors, so a number means the same wherever it is printed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from conformance.judging.conditioning import mean_cap, mean_error
from conformance.judging.scales import scale, sensitivity
from conformance.judging.tolerances import Tolerance
from conformance.model.case import Case


@dataclass(frozen=True)
class Factors:
    """scale, mean_error and sensitivity of one output on one case, and the cap of the mean term
    (defaults: scale 1, no mean term, so atol is absolute)."""

    scale: float = 1.0
    mean_error: float = 0.0
    sensitivity: float = 0.0
    mean_cap: float = math.inf

    def atol(self, tol: Tolerance) -> float:
        """The absolute part of the allowance under ``tol``."""
        return tol.atol * self.scale + min(tol.cond * self.mean_error, self.mean_cap) * self.sensitivity


def factors(
    case: Case, output: str, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]
) -> Factors:
    error = mean_error(case, expected)
    return Factors(
        scale(case, output, inputs, expected),
        error,
        sensitivity(case, output, inputs, expected),
        mean_cap(case, error),
    )


def elementwise(tol: Tolerance, terms: Factors, expected: np.ndarray) -> np.ndarray:
    """The allowance of every element: the absolute part plus rtol * |expected|."""
    allowed: np.ndarray = terms.atol(tol) + tol.rtol * np.abs(np.asarray(expected, dtype=np.float64))
    return allowed
