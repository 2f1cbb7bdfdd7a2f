"""Fused residual add + RMSNorm oracle: h = x + residual stored in the activation dtype, y = RMSNorm(h).

The residual stream is kept in the activation dtype by every implementation (it is the next layer's
input), so the reference rounds h once to that dtype and normalizes the stored value; a kernel that
normalizes the unrounded float32 sum differs by at most one rounding, inside the y tolerance.
Gradients: the caller's dy reaches x and residual alike (dx = dresidual); residual_out is not
differentiated by the caller here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conformance.model.case import Case
from conformance.model.dtypes import round_to
from conformance.oracle import rms_norm
from conformance.oracle.layer_norm import Array


def evaluate(case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    """residual_out = round(x + residual), then the RMSNorm outputs of it (dx is d/dx = d/dresidual)."""
    h = round_to(inputs["x"] + inputs["residual"], case.dtype).astype(np.float64)
    out = rms_norm.evaluate(case, {**inputs, "x": h}, grad=grad)
    out["residual_out"] = h
    return out
