"""Fake GroupNorm/InstanceNorm backends: one correct NumPy implementation and broken variants.

Loaded into a conformance run with ``-p fakes.group`` (tests/ on PYTHONPATH). Each broken fake
changes exactly one thing in ``GroupFake``; tests/suite/test_meta_group_fakes.py asserts the suite catches it
(the check and output that fail, and the fingerprint answer that names it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import conformance
from conformance.adapter.backend import FEATURES, Capabilities
from conformance.model.case import Case
from conformance.model.dtypes import numpy_dtype, stats_dtype
from conformance.model.geometry import geometry

from fakes.core import Prepared

F = np.ndarray
Axes = tuple[int, ...]


@conformance.register("fake-group-numpy")
class GroupFake:
    """Correct reference-semantics GroupNorm and InstanceNorm computing in float32 (float64 for float64).

    Computed on the geometry view (N, G, C/G, spatial) of x, where a group is the last two axes:
    biased two-pass variance per (sample, group), eps inside the root, per-channel affine, and
    InstanceNorm running statistics updated with the batch mean of the instance means and of the
    unbiased instance variances (momentum None: factor 1, the first step of a cumulative average).
    """

    name = "fake-group-numpy"
    # The eps this fake's "library" uses when none is given (the fingerprint's optional hook).
    default_eps = 1e-5

    def capabilities(self) -> Capabilities:
        # channels_last changes only the memory layout a backend computes on; NumPy computes the same
        # values from either, so the feature is honoured trivially.
        return Capabilities(
            ops=frozenset({"group_norm", "instance_norm"}),
            dtypes=frozenset({"float64", "float32", "float16", "bfloat16"}),
            features=frozenset(FEATURES),
            device="cpu",
            device_name="numpy",
        )

    def prepare(self, case: Case, inputs: dict[str, F], *, grad: bool) -> Prepared:
        return Prepared(self, case, inputs, grad)

    def prepare_default_eps(self, case: Case, inputs: dict[str, F]) -> Prepared:
        return Prepared(self, dataclasses.replace(case, eps=self.default_eps), inputs, False)

    # ------------------------------------------------------------------ hooks the broken fakes override
    def work(self, case: Case) -> Any:
        return numpy_dtype(stats_dtype(case.dtype))

    def axes(self, case: Case) -> Axes:
        """The axes of the view one mean and variance reduce: the group's channels and spatial values."""
        return (2, 3)

    def stats(self, x: F, axes: Axes) -> tuple[F, F]:
        mean = x.mean(axis=axes, keepdims=True)
        return mean, np.square(x - mean).mean(axis=axes, keepdims=True)

    def rstd(self, var: F, eps: float) -> F:
        rstd: F = np.ones((), var.dtype) / np.sqrt(var + np.asarray(eps, var.dtype))
        return rstd

    def param(self, case: Case, inputs: dict[str, F], name: str, w: Any) -> F | None:
        """A per-channel parameter shaped (G, C/G, 1) against the view; None where the case has none."""
        if name not in inputs:
            return None
        values: F = inputs[name].astype(w).reshape(geometry(case).param_shape)
        return values

    def affine(self, x: F, mean: F, rstd: F, xhat: F, weight: F | None, bias: F | None) -> F:
        """y from the normalized values: xhat * weight + bias."""
        y = xhat if weight is None else xhat * weight
        return y if bias is None else y + bias

    def running(self, case: Case, inputs: dict[str, F], mean: F, var: F, w: Any) -> dict[str, F]:
        """InstanceNorm's update: the batch mean of the instance means and unbiased instance variances."""
        n, c = case.shape[:2]
        count = int(np.prod(case.shape[2:]))
        m = np.asarray(1.0 if case.momentum is None else case.momentum, w)
        batch_mean = mean.reshape(n, c).mean(axis=0)
        batch_var = (var * np.asarray(count / (count - 1), w)).reshape(n, c).mean(axis=0)
        one = np.ones((), w)
        return {
            "running_mean": (one - m) * inputs["running_mean"].astype(w) + m * batch_mean,
            "running_var": (one - m) * inputs["running_var"].astype(w) + m * batch_var,
        }

    # ------------------------------------------------------------------ the computation
    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        w = self.work(case)
        geo = geometry(case)
        x = inputs["x"].astype(w).reshape(geo.shape)
        out: dict[str, F] = {}
        axes = self.axes(case)
        if case.uses_batch_stats:
            mean, var = self.stats(x, axes)
            if case.training:
                out.update(self.running(case, inputs, mean, var, w))
        else:
            mean = inputs["running_mean"].astype(w).reshape(geo.param_shape)
            var = inputs["running_var"].astype(w).reshape(geo.param_shape)
        rstd = self.rstd(var, case.eps)
        xhat = (x - mean) * rstd
        weight, bias = self.param(case, inputs, "weight", w), self.param(case, inputs, "bias", w)
        out["y"] = self.affine(x, mean, rstd, xhat, weight, bias)
        if grad:
            dy = inputs["dy"].astype(w).reshape(geo.shape)
            g = dy if weight is None else dy * weight
            if case.uses_batch_stats:
                mean_g = g.mean(axis=axes, keepdims=True)
                mean_gx = (g * xhat).mean(axis=axes, keepdims=True)
                out["dx"] = rstd * (g - mean_g - xhat * mean_gx)
            else:
                out["dx"] = g * rstd  # running statistics are constants
            if weight is not None:
                out["dweight"] = (dy * xhat).sum(axis=geo.reduce_axes).reshape(-1)
            if bias is not None:
                out["dbias"] = dy.sum(axis=geo.reduce_axes).reshape(-1)
        return self._rounded(case, out)

    def _rounded(self, case: Case, out: dict[str, F]) -> dict[str, F]:
        act, par = numpy_dtype(case.dtype), numpy_dtype(case.weight_dtype)
        shaped = {k: v.reshape(case.shape) if k in ("y", "dx") else v for k, v in out.items()}
        return {
            k: np.ascontiguousarray(v.astype(act if k in ("y", "dx") else par)) for k, v in shaped.items()
        }


@conformance.register("fake-gn-per-channel-stats")
class PerChannelStats(GroupFake):
    """GroupNorm computed as InstanceNorm: mean and variance per channel instead of per group."""

    name = "fake-gn-per-channel-stats"

    def axes(self, case: Case) -> Axes:
        return (3,)


@conformance.register("fake-gn-per-group-affine")
class PerGroupAffine(GroupFake):
    """Weight and bias per group: every channel takes its group's first channel's parameter."""

    name = "fake-gn-per-group-affine"

    def param(self, case: Case, inputs: dict[str, F], name: str, w: Any) -> F | None:
        values = super().param(case, inputs, name, w)
        if values is None:
            return None
        first: F = np.broadcast_to(values[:, :1], values.shape)
        return first


@conformance.register("fake-gn-one-pass-variance")
class OnePassVariance(GroupFake):
    """Variance as E[x^2] - E[x]^2 in float32: digits cancel on groups far from zero."""

    name = "fake-gn-one-pass-variance"

    def stats(self, x: F, axes: Axes) -> tuple[F, F]:
        mean = x.mean(axis=axes, keepdims=True)
        return mean, np.square(x).mean(axis=axes, keepdims=True) - np.square(mean)


@conformance.register("fake-gn-one-pass-scaled")
class OnePassScaled(OnePassVariance):
    """The one-pass variance in the form Keras' GroupNormalization computes: centred after scaling,
    x * inv + (bias - mean * inv) with inv = weight * rstd, where the large products cancel."""

    name = "fake-gn-one-pass-scaled"

    def affine(self, x: F, mean: F, rstd: F, xhat: F, weight: F | None, bias: F | None) -> F:
        inv = rstd if weight is None else rstd * weight
        shift = -mean * inv if bias is None else bias - mean * inv
        y: F = x * inv + shift
        return y


@conformance.register("fake-in-frozen-running-stats")
class FrozenRunningStats(GroupFake):
    """InstanceNorm training normalizes with instance statistics but returns the running statistics it
    was given, as a momentum of 0 (torch.nn.InstanceNorm's momentum=None) does."""

    name = "fake-in-frozen-running-stats"

    def running(self, case: Case, inputs: dict[str, F], mean: F, var: F, w: Any) -> dict[str, F]:
        return {"running_mean": inputs["running_mean"].copy(), "running_var": inputs["running_var"].copy()}
