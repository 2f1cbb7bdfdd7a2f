"""LayerNorm oracle: float64 forward and analytic backward over the trailing ``norm_ndim`` dims (the
axis-general helpers are in conformance.oracle.common, shared with the other ops)."""

from __future__ import annotations

from collections.abc import Mapping

from conformance.model.case import Case
from conformance.oracle.common import (
    Array,
    affine,
    centred_backward,
    inverse_std,
    moments,
    optional,
    other_axes,
    param_grads,
    trailing_axes,
)


def evaluate(case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    """y, mean, rstd (leading-dims shape) and, when ``grad``, dx, dweight, dbias."""
    x = inputs["x"]
    axes = trailing_axes(x.ndim, case.norm_ndim)
    weight = optional(inputs, "weight", case.weight)
    mean, centred, var = moments(x, axes)
    rstd = inverse_std(var, case.eps)
    xhat = centred * rstd
    out = {
        "y": affine(xhat, weight, optional(inputs, "bias", bool(case.bias))),
        "mean": mean.squeeze(axis=axes),
        "rstd": rstd.squeeze(axis=axes),
    }
    if grad:
        dy = inputs["dy"]
        g = dy if weight is None else dy * weight
        out["dx"] = centred_backward(g, xhat, rstd, axes)
        out.update(param_grads(dy, xhat, other_axes(x.ndim, axes), case))
    return out
