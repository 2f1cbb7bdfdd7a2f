"""BatchNorm oracle: channel axis 1, statistics over every other axis; eval and training modes.

Training normalizes with the biased batch variance, updates running stats with the unbiased one, and
its backward goes through the batch statistics; eval treats the running statistics as constants.
"""

from __future__ import annotations

from collections.abc import Mapping

from conformance.model.case import Case
from conformance.oracle.common import (
    Array,
    Axes,
    affine,
    centred_backward,
    inverse_std,
    moments,
    optional,
    param_grads,
)


def stat_axes(ndim: int) -> Axes:
    """Every axis but the channel axis 1."""
    return (0, *range(2, ndim))


def per_channel(values: Array, ndim: int) -> Array:
    """A (C,) vector shaped (C, 1, ...) so it broadcasts against (N, C, L...)."""
    return values.reshape((-1,) + (1,) * (ndim - 2))


def channel_params(case: Case, inputs: Mapping[str, Array], ndim: int) -> tuple[Array | None, Array | None]:
    """(weight, bias) shaped per channel, None where the case has no such parameter."""
    weight = optional(inputs, "weight", case.weight)
    bias = optional(inputs, "bias", bool(case.bias))
    return (
        None if weight is None else per_channel(weight, ndim),
        None if bias is None else per_channel(bias, ndim),
    )


def momentum_factor(case: Case) -> float:
    """PyTorch's update factor: momentum, or 1/num_batches_tracked = 1/(0 + 1) for the cumulative average."""
    return 1.0 if case.momentum is None else case.momentum


def running_update(case: Case, inputs: Mapping[str, Array], mean: Array, var: Array) -> dict[str, Array]:
    """running = (1 - m) * running + m * batch, with the unbiased batch variance for running_var."""
    m, count = momentum_factor(case), case.rows
    unbiased = var * (count / (count - 1))
    return {
        "running_mean": (1.0 - m) * inputs["running_mean"] + m * mean,
        "running_var": (1.0 - m) * inputs["running_var"] + m * unbiased,
    }


def training(case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    """Batch statistics; mean and rstd are returned per channel."""
    x = inputs["x"]
    axes = stat_axes(x.ndim)
    weight, bias = channel_params(case, inputs, x.ndim)
    mean, centred, var = moments(x, axes)
    rstd = inverse_std(var, case.eps)
    xhat = centred * rstd
    out = {
        "y": affine(xhat, weight, bias),
        "mean": mean.reshape(-1),
        "rstd": rstd.reshape(-1),
        **running_update(case, inputs, mean.reshape(-1), var.reshape(-1)),
    }
    if grad:
        dy = inputs["dy"]
        out["dx"] = centred_backward(dy if weight is None else dy * weight, xhat, rstd, axes)
        out.update(param_grads(dy, xhat, axes, case))
    return out


def inference(case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    """Running statistics as constants, so dx is just dy * weight * rstd."""
    x = inputs["x"]
    axes = stat_axes(x.ndim)
    rstd = per_channel(inverse_std(inputs["running_var"], case.eps), x.ndim)
    weight, bias = channel_params(case, inputs, x.ndim)
    xhat = (x - per_channel(inputs["running_mean"], x.ndim)) * rstd
    out = {"y": affine(xhat, weight, bias)}
    if grad:
        dy = inputs["dy"]
        out["dx"] = (dy if weight is None else dy * weight) * rstd
        out.update(param_grads(dy, xhat, axes, case))
    return out


def evaluate(case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    """Training or eval mode, as ``case.training`` says."""
    mode = training if case.training else inference
    return mode(case, inputs, grad=grad)
