"""The fused residual add in front of a row norm: h = x + residual, y = norm(h), residual_out = h.

residual_out is h rounded once to the stream's dtype (``Case.stream_dtype``: the activation dtype, or
float32 for "residual in fp32"); the norm reads that stored value or, with ``norm_input = "exact"``,
the unrounded sum (conformance.model.residual). Backward: the next layer uses both outputs, so the
caller's cotangents are dy (on y) and dresidual_out (on residual_out); both reach h, and h = x +
residual passes dL/dh to x and residual unchanged: dx = dresidual = d norm / dh . dy + dresidual_out.
The rounding of h has derivative 1 here, as in every autograd.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from conformance.model import residual
from conformance.model.case import Case
from conformance.oracle.common import Array

Norm = Callable[..., dict[str, Array]]


def evaluate(norm: Norm, case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    """residual_out, then ``norm``'s outputs of the sum it reads; dx and dresidual both dL/dh."""
    out = norm(case, {**inputs, "x": residual.normalized(case, inputs)}, grad=grad)
    out["residual_out"] = residual.stored(case, inputs)
    if grad:
        dh = out["dx"] + inputs["dresidual_out"]
        out["dx"], out["dresidual"] = dh, dh.copy()
    return out
