"""Fake backends that break one metamorphic property each (and the oracle as a backend).

Loaded into a conformance run with ``-p fakes.property`` (tests/ on PYTHONPATH). Each
changes one thing in the correct NumPy fake; tests/properties/test_properties.py
asserts its property catches it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import conformance
from conformance import oracle
from conformance.adapter.backend import Capabilities
from conformance.model.case import GROUP_OPS, OPS, Case
from conformance.model.dtypes import numpy_dtype

from fakes.core import F, NumpyFake
from fakes.group import GroupFake

# The NumPy-fake variants below break a LayerNorm/RMSNorm property; GroupNorm/InstanceNorm ones derive
# from fakes.group.GroupFake. Each declares only the ops it was written for.
ROW_AND_BATCH_OPS = frozenset(OPS) - GROUP_OPS


@conformance.register("fake-batch-statistics")
class BatchStatistics(NumpyFake):
    """Rows leak into each other: LN/RMS statistics over the whole batch, as a BatchNorm would."""

    name = "fake-batch-statistics"
    ops = ROW_AND_BATCH_OPS

    def axes(self, case: Case, x: F) -> tuple[int, ...]:
        if case.op == "batch_norm":
            return super().axes(case, x)
        return tuple(range(x.ndim))


@conformance.register("fake-variance-about-zero")
class VarianceAboutZero(NumpyFake):
    """Centres x but takes the variance about zero (mean of x^2): not shift invariant."""

    name = "fake-variance-about-zero"
    ops = ROW_AND_BATCH_OPS

    def stats(self, x: F, axes: tuple[int, ...]) -> tuple[F, F]:
        return x.mean(axis=axes, keepdims=True), np.square(x).mean(axis=axes, keepdims=True)


@conformance.register("fake-variance-floor")
class VarianceFloor(NumpyFake):
    """Floors the variance at a hard-coded 1e-2 before adding eps: not scale invariant."""

    name = "fake-variance-floor"
    ops = ROW_AND_BATCH_OPS

    def rstd(self, var: F, eps: float) -> F:
        return super().rstd(np.maximum(var, np.asarray(1e-2, var.dtype)), eps)


@conformance.register("fake-odd-rows")
class OddRows(NumpyFake):
    """Odd-numbered rows take a code path with a wrong constant: outputs depend on row position."""

    name = "fake-odd-rows"
    ops = ROW_AND_BATCH_OPS

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        if case.op != "batch_norm":
            y = out["y"].reshape(-1, *case.param_shape).copy()
            y[1::2] = (y[1::2].astype(np.float64) * 1.125).astype(y.dtype)
            out["y"] = y.reshape(case.shape)
        return out


@conformance.register("fake-spreads-nan")
class SpreadsNaN(NumpyFake):
    """A non-finite input anywhere poisons every output (a global pre-scale by max |x|)."""

    name = "fake-spreads-nan"
    ops = ROW_AND_BATCH_OPS

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        if not np.isfinite(inputs["x"].astype(np.float64)).all():
            out["y"] = np.full_like(out["y"], np.nan)
        return out


@conformance.register("fake-constant-rows-copied")
class ConstantRowsCopied(NumpyFake):
    """Rows with zero variance skip the normalization and copy x through (an early exit)."""

    name = "fake-constant-rows-copied"
    ops = ROW_AND_BATCH_OPS

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        if case.op == "layer_norm":
            x = inputs["x"].reshape(-1, *case.param_shape)
            flat = x.reshape(x.shape[0], -1).astype(np.float64)
            constant = (flat == flat[:, :1]).all(axis=1)
            y = out["y"].reshape(x.shape).copy()
            y[constant] = x[constant]
            out["y"] = y.reshape(case.shape)
        return out


@conformance.register("fake-single-feature")
class SingleFeature(NumpyFake):
    """Rows of one element are returned unchanged ("nothing to normalize")."""

    name = "fake-single-feature"
    ops = ROW_AND_BATCH_OPS

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        if case.op != "batch_norm" and int(np.prod(case.param_shape)) == 1:
            out["y"] = inputs["x"].copy()
        return out


# ---------------------------------------------------------------------- GroupNorm / InstanceNorm
@conformance.register("fake-gn-sample-statistics")
class SampleStatistics(GroupFake):
    """Groups leak into each other: statistics over the whole sample (every channel), as a LayerNorm."""

    name = "fake-gn-sample-statistics"

    def axes(self, case: Case) -> tuple[int, ...]:
        return (1, 2, 3)


@conformance.register("fake-gn-batch-statistics")
class GroupBatchStatistics(GroupFake):
    """Samples leak into each other: each group's statistics over the whole batch."""

    name = "fake-gn-batch-statistics"

    def axes(self, case: Case) -> tuple[int, ...]:
        return (0, 2, 3)


@conformance.register("fake-gn-variance-about-zero")
class GroupVarianceAboutZero(GroupFake):
    """Centres each group but takes its variance about zero: not shift invariant."""

    name = "fake-gn-variance-about-zero"

    def stats(self, x: F, axes: tuple[int, ...]) -> tuple[F, F]:
        return x.mean(axis=axes, keepdims=True), np.square(x).mean(axis=axes, keepdims=True)


@conformance.register("fake-gn-variance-floor")
class GroupVarianceFloor(GroupFake):
    """Floors each group's variance at a hard-coded 1e-2 before adding eps: not scale invariant."""

    name = "fake-gn-variance-floor"

    def rstd(self, var: F, eps: float) -> F:
        return super().rstd(np.maximum(var, np.asarray(1e-2, var.dtype)), eps)


# fake -> the property that must catch it
BREAKS = {
    "fake-batch-statistics": "row_independence",
    "fake-variance-about-zero": "shift_invariance",
    "fake-variance-floor": "scale_invariance",
    "fake-odd-rows": "row_permutation",
    "fake-spreads-nan": "nonfinite_containment",
    "fake-constant-rows-copied": "constant_rows",
    "fake-single-feature": "feature_size_one",
    "fake-gn-sample-statistics": "group_independence",
    "fake-gn-batch-statistics": "sample_independence",
    "fake-gn-variance-about-zero": "group_shift_invariance",
    "fake-gn-variance-floor": "group_scale_invariance",
}


class _OraclePrepared:
    def __init__(self, case: Case, inputs: dict[str, F], grad: bool) -> None:
        self.case, self.inputs, self.grad = case, inputs, grad
        self.result: dict[str, F] = {}

    def __call__(self) -> None:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            exact = oracle.evaluate(self.case, self.inputs, grad=self.grad)
        act, par = numpy_dtype(self.case.dtype), numpy_dtype(self.case.weight_dtype)
        self.result = {
            name: value.astype(act if name in ("y", "dx", "residual_out") else par)
            for name, value in exact.items()
            if name not in ("mean", "rstd")
        }

    def synchronize(self) -> None:
        pass

    def outputs(self) -> dict[str, Any]:
        return self.result


@conformance.register("fake-oracle")
class OracleBackend(NumpyFake):
    """The float64 oracle rounded once to each output's dtype: the best any backend can do."""

    name = "fake-oracle"

    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities(), ops=frozenset(OPS))

    def prepare(self, case: Case, inputs: dict[str, F], *, grad: bool) -> Any:
        return _OraclePrepared(case, inputs, grad)
