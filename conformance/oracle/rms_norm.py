"""RMSNorm oracle: y = x * rstd * (weight_offset + weight), rstd = 1 / sqrt(mean(x^2) + eps).

Float64 forward and analytic backward over the trailing ``norm_ndim`` dims; no bias by definition.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conformance.model.case import Case
from conformance.oracle.common import (
    Array,
    Axes,
    affine,
    inverse_std,
    optional,
    other_axes,
    param_grads,
    trailing_axes,
)


def scale_of(case: Case, inputs: Mapping[str, Array]) -> Array | None:
    """The effective scale ``weight_offset + weight``; None without a weight (offset is then 0)."""
    weight = optional(inputs, "weight", case.weight)
    return None if weight is None else case.weight_offset + weight


def rms_backward(g: Array, xhat: Array, rstd: Array, axes: Axes) -> Array:
    """dx through xhat = x * rstd(x), given g = dL/dxhat; d rstd / dx_i = -rstd^3 x_i / n."""
    mean_gx = (g * xhat).mean(axis=axes, keepdims=True)
    dx: Array = rstd * (g - xhat * mean_gx)
    return dx


def evaluate(case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    """y, rstd (leading-dims shape) and, when ``grad``, dx and dweight."""
    x = inputs["x"]
    axes = trailing_axes(x.ndim, case.norm_ndim)
    rstd = inverse_std(np.square(x).mean(axis=axes, keepdims=True), case.eps)
    xhat = x * rstd
    scale = scale_of(case, inputs)
    out = {"y": affine(xhat, scale, None), "rstd": rstd.squeeze(axis=axes)}
    if grad:
        dy = inputs["dy"]
        out["dx"] = rms_backward(dy if scale is None else dy * scale, xhat, rstd, axes)
        out.update(param_grads(dy, xhat, other_axes(x.ndim, axes), case))
    return out
