"""Fused residual add + LayerNorm: y = LayerNorm(x + residual), residual_out = x + residual.

The residual stream's conventions and the two-cotangent backward are in conformance.oracle.residual_add.
"""

from __future__ import annotations

from collections.abc import Mapping

from conformance.model.case import Case
from conformance.oracle import layer_norm, residual_add
from conformance.oracle.common import Array


def evaluate(case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    """residual_out, mean, rstd and y of the sum; with ``grad``, dx = dresidual (dL/dh), dweight, dbias."""
    return residual_add.evaluate(layer_norm.evaluate, case, inputs, grad=grad)
