"""GroupNorm oracle: per sample, mean and biased variance over each group of C/G channels and every
spatial value; per-channel weight and bias. InstanceNorm with instance statistics is the G = C case.

Computed on the geometry view (N, G, C/G, spatial) of x, where a group is the last two axes.
"""

from __future__ import annotations

from collections.abc import Mapping

from conformance.model.case import Case
from conformance.model.geometry import Geometry, geometry
from conformance.oracle.common import (
    Array,
    affine,
    centred_backward,
    inverse_std,
    moments,
    optional,
    param_grads,
)


def view_params(case: Case, inputs: Mapping[str, Array], geo: Geometry) -> tuple[Array | None, Array | None]:
    """(weight, bias) reshaped to broadcast per channel against the view, None where absent."""
    weight = optional(inputs, "weight", case.weight)
    bias = optional(inputs, "bias", bool(case.bias))
    return (
        None if weight is None else weight.reshape(geo.param_shape),
        None if bias is None else bias.reshape(geo.param_shape),
    )


def batch_statistics(case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    """y, mean and rstd per (sample, group) shaped (N, G), and when ``grad`` dx, dweight, dbias."""
    geo = geometry(case)
    x = inputs["x"].reshape(geo.shape)
    weight, bias = view_params(case, inputs, geo)
    mean, centred, var = moments(x, geo.group_axes)
    rstd = inverse_std(var, case.eps)
    xhat = centred * rstd
    stats = (case.shape[0], case.groups)
    out = {
        "y": affine(xhat, weight, bias).reshape(case.shape),
        "mean": mean.reshape(stats),
        "rstd": rstd.reshape(stats),
    }
    if grad:
        dy = inputs["dy"].reshape(geo.shape)
        out["dx"] = centred_backward(dy if weight is None else dy * weight, xhat, rstd, geo.group_axes)
        out["dx"] = out["dx"].reshape(case.shape)
        sums = param_grads(dy, xhat, geo.reduce_axes, case)
        out.update({name: values.reshape(-1) for name, values in sums.items()})
    return out


def evaluate(case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    return batch_statistics(case, inputs, grad=grad)
