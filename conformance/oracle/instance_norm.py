"""InstanceNorm oracle: GroupNorm with one channel per group, plus torch's optional running statistics.

Instance statistics (training, or no running statistics) normalize each (sample, channel) over its
spatial values. A training step with running statistics updates them with the batch average of the
instance means and of the unbiased instance variances, ``running = (1 - m) * running + m * batch``
(momentum None: the cumulative average, whose first step has factor 1, as for BatchNorm). Eval with
running statistics treats them as constants, like BatchNorm eval.
"""

from __future__ import annotations

from collections.abc import Mapping

from conformance.model.case import Case
from conformance.model.geometry import geometry
from conformance.oracle.batch_norm import momentum_factor
from conformance.oracle.common import Array, affine, inverse_std, moments, param_grads
from conformance.oracle.group_norm import batch_statistics, view_params


def running_update(case: Case, inputs: Mapping[str, Array]) -> dict[str, Array]:
    """The update from instance statistics: their batch mean, each variance made unbiased over the
    spatial count first."""
    geo = geometry(case)
    mean, _, var = moments(inputs["x"].reshape(geo.shape), geo.group_axes)
    m = momentum_factor(case)
    count = case.param_terms // case.shape[0]
    unbiased = (var * (count / (count - 1))).reshape(case.shape[:2]).mean(axis=0)
    return {
        "running_mean": (1.0 - m) * inputs["running_mean"] + m * mean.reshape(case.shape[:2]).mean(axis=0),
        "running_var": (1.0 - m) * inputs["running_var"] + m * unbiased,
    }


def running_statistics(case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    """Eval with running statistics: they are constants, so dx = dy * weight * rstd per channel."""
    geo = geometry(case)
    x = inputs["x"].reshape(geo.shape)
    weight, bias = view_params(case, inputs, geo)
    rstd = inverse_std(inputs["running_var"], case.eps).reshape(geo.param_shape)
    xhat = (x - inputs["running_mean"].reshape(geo.param_shape)) * rstd
    out = {"y": affine(xhat, weight, bias).reshape(case.shape)}
    if grad:
        dy = inputs["dy"].reshape(geo.shape)
        out["dx"] = ((dy if weight is None else dy * weight) * rstd).reshape(case.shape)
        sums = param_grads(dy, xhat, geo.reduce_axes, case)
        out.update({name: values.reshape(-1) for name, values in sums.items()})
    return out


def evaluate(case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]:
    if not case.uses_batch_stats:
        return running_statistics(case, inputs, grad=grad)
    out = batch_statistics(case, inputs, grad=grad)
    if case.training:
        out.update(running_update(case, inputs))
    return out
