"""Fake backends for the meta-tests: one correct NumPy implementation and deliberately broken variants.

Loaded into a conformance run with ``-p fakes.core`` (tests/ on PYTHONPATH). Each broken fake
changes exactly one thing; the meta-tests assert the suite catches it and names the output.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numpy as np

import conformance
from conformance import oracle
from conformance.adapter.backend import FEATURES, Capabilities
from conformance.model.case import ADD_OPS, GROUP_OPS, OPS, Case
from conformance.model.dtypes import numpy_dtype, round_to, stats_dtype
from conformance.model.geometry import geometry
from conformance.model.outputs import output_dtype, produced

F = np.ndarray
# The broken variants in this module each target the row and batch ops; GroupNorm/InstanceNorm have
# their own in fakes.group. The correct fake and the misbehaving adapters run every op.
ROW_AND_BATCH_OPS = frozenset(OPS) - GROUP_OPS


class Prepared:
    def __init__(self, fake: NumpyFake, case: Case, inputs: dict[str, F], grad: bool) -> None:
        self.fake, self.case, self.inputs, self.grad = fake, case, inputs, grad
        self.result: dict[str, F] = {}

    def __call__(self) -> None:
        self.result = self.fake.compute(self.case, self.inputs, self.grad)

    def synchronize(self) -> None:
        pass

    def outputs(self) -> dict[str, Any]:
        return self.result


class NumpyFake:
    """Correct reference-semantics implementation computing in float32 (float64 for float64)."""

    name = "fake-numpy"
    ops: frozenset[str] = frozenset(OPS)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            ops=self.ops,
            dtypes=frozenset({"float64", "float32", "float16", "bfloat16"}),
            features=frozenset(FEATURES),
            device="cpu",
            device_name="numpy",
        )

    def prepare(self, case: Case, inputs: dict[str, F], *, grad: bool) -> Prepared:
        return Prepared(self, case, inputs, grad)

    # The eps this fake's "library" uses when none is given (the fingerprint's optional hook).
    default_eps = 1e-5

    def prepare_default_eps(self, case: Case, inputs: dict[str, F]) -> Prepared:
        return Prepared(self, dataclasses.replace(case, eps=self.default_eps), inputs, False)

    # ------------------------------------------------------------------ hooks the broken fakes override
    def work(self, case: Case) -> Any:
        return numpy_dtype(stats_dtype(case.dtype))

    def stats(self, x: F, axes: tuple[int, ...]) -> tuple[F, F]:
        mean = x.mean(axis=axes, keepdims=True)
        return mean, np.square(x - mean).mean(axis=axes, keepdims=True)

    def rstd(self, var: F, eps: float) -> F:
        return 1.0 / np.sqrt(var + np.asarray(eps, var.dtype))

    def axes(self, case: Case, x: F) -> tuple[int, ...]:
        if case.op == "batch_norm":
            return (0, *range(2, x.ndim))
        return tuple(range(x.ndim - case.norm_ndim, x.ndim))

    def running_var_batch(self, var: F, count: int) -> F:
        return var * (count / (count - 1))

    def ln_dx(self, g: F, xhat: F, rstd: F, axes: tuple[int, ...]) -> F:
        return rstd * (
            g - g.mean(axis=axes, keepdims=True) - xhat * (g * xhat).mean(axis=axes, keepdims=True)
        )

    def add_bias(self, y: F, b: F) -> F:
        return y + b

    def store(self, case: Case, total: F) -> F:
        """The add ops' sum as stored in the stream's dtype (rounded to nearest)."""
        return total.astype(numpy_dtype(case.stream_dtype))

    # ------------------------------------------------------------------ the computation
    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        if case.op in GROUP_OPS:
            return self._grouped(case, inputs, grad)
        w = self.work(case)
        out: dict[str, F] = {}
        x = inputs["x"].astype(w)
        if case.op in ADD_OPS:
            # The sum in the working precision, stored in the stream's dtype; the norm reads the stored
            # value or (norm_input "exact") the working-precision sum.
            total = x + inputs["residual"].astype(w)
            out["residual_out"] = self.store(case, total)
            x = out["residual_out"].astype(w) if case.norm_input == "rounded" else total
        axes = self.axes(case, x)
        p = self._params(case, inputs, x.ndim, w)
        if case.op in ("rms_norm", "add_rms_norm"):
            rstd = self.rstd(np.square(x).mean(axis=axes, keepdims=True), case.eps)
            xhat = x * rstd
            scale = p["weight"] + np.asarray(case.weight_offset, w) if case.weight else np.ones((), w)
            out["y"] = xhat * scale
            g_dx = lambda g: rstd * (g - xhat * (g * xhat).mean(axis=axes, keepdims=True))  # noqa: E731
        else:
            mean, var = self._mean_var(case, inputs, x, axes, w, out)
            rstd = self.rstd(var, case.eps)
            xhat = (x - mean) * rstd
            scale = p["weight"] if case.weight else np.ones((), w)
            out["y"] = self.add_bias(xhat * scale, p["bias"]) if case.bias else xhat * scale
            batch_stats = case.op in ("layer_norm", "add_layer_norm") or case.training
            g_dx = (lambda g: self.ln_dx(g, xhat, rstd, axes)) if batch_stats else (lambda g: g * rstd)
        if grad:
            dy = inputs["dy"].astype(w)
            out["dx"] = g_dx(dy * scale)
            if case.op in ADD_OPS:
                out["dx"] = out["dx"] + inputs["dresidual_out"].astype(w)
                out["dresidual"] = out["dx"]
            # Parameter gradients reduce over every axis the parameters broadcast along.
            true_axes = NumpyFake.axes(self, case, x)
            param_axes = true_axes if case.op == "batch_norm" else tuple(range(x.ndim - case.norm_ndim))
            if case.weight:
                out["dweight"] = (dy * xhat).sum(axis=param_axes).reshape(case.param_shape)
            if case.bias:
                out["dbias"] = dy.sum(axis=param_axes).reshape(case.param_shape)
        return self._rounded(case, out)

    def _grouped(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        """GroupNorm / InstanceNorm on the view (N, G, C/G, spatial), where a group is the last two axes."""
        geo, w = geometry(case), self.work(case)
        x = inputs["x"].astype(w).reshape(geo.shape)
        names = ("weight", "bias", "running_mean", "running_var")
        p = {k: inputs[k].astype(w).reshape(geo.param_shape) for k in names if k in inputs}
        out: dict[str, F] = {}
        if case.uses_batch_stats:
            mean, var = self.stats(x, geo.group_axes)
            if case.training:
                m = 1.0 if case.momentum is None else case.momentum
                instances = case.shape[:2]
                batch_var = self.running_var_batch(var.reshape(instances), geo.shape[3]).mean(axis=0)
                out["running_mean"] = (1 - m) * inputs["running_mean"].astype(w) + m * mean.reshape(
                    instances
                ).mean(axis=0)
                out["running_var"] = (1 - m) * inputs["running_var"].astype(w) + m * batch_var
        else:
            mean, var = p["running_mean"], p["running_var"]
        rstd = self.rstd(var, case.eps)
        xhat = (x - mean) * rstd
        scale = p["weight"] if case.weight else np.ones((), w)
        y = xhat * scale
        out["y"] = (self.add_bias(y, p["bias"]) if case.bias else y).reshape(case.shape)
        if grad:
            dy = inputs["dy"].astype(w).reshape(geo.shape)
            g = dy * scale
            dx = self.ln_dx(g, xhat, rstd, geo.group_axes) if case.uses_batch_stats else g * rstd
            out["dx"] = dx.reshape(case.shape)
            if case.weight:
                out["dweight"] = (dy * xhat).sum(axis=geo.reduce_axes).reshape(-1)
            if case.bias:
                out["dbias"] = dy.sum(axis=geo.reduce_axes).reshape(-1)
        return self._rounded(case, out)

    def _params(self, case: Case, inputs: dict[str, F], ndim: int, w: Any) -> dict[str, F]:
        shape = [1] * ndim
        if case.op == "batch_norm":
            shape[1] = case.shape[1]
        else:
            shape[ndim - case.norm_ndim :] = case.param_shape
        return {
            k: inputs[k].astype(w).reshape(shape)
            for k in ("weight", "bias", "running_mean", "running_var")
            if k in inputs
        }

    def _mean_var(
        self, case: Case, inputs: dict[str, F], x: F, axes: tuple[int, ...], w: Any, out: dict[str, F]
    ) -> tuple[F, F]:
        if case.op == "batch_norm" and not case.training:
            p = self._params(case, inputs, x.ndim, w)
            return p["running_mean"], p["running_var"]
        mean, var = self.stats(x, axes)
        if case.op == "batch_norm":
            count = x.size // case.shape[1]
            m = 1.0 if case.momentum is None else case.momentum
            rm = inputs["running_mean"].astype(w)
            rv = inputs["running_var"].astype(w)
            out["running_mean"] = (1 - m) * rm + m * mean.reshape(-1)
            out["running_var"] = (1 - m) * rv + m * self.running_var_batch(var.reshape(-1), count)
        return mean, var

    def _rounded(self, case: Case, out: dict[str, F]) -> dict[str, F]:
        return {k: np.ascontiguousarray(v.astype(numpy_dtype(output_dtype(case, k)))) for k, v in out.items()}


conformance.register("fake-numpy")(NumpyFake)


@conformance.register("fake-eps-outside-sqrt")
class EpsOutsideSqrt(NumpyFake):
    """The seed document's RMSNorm writing: x / (sigma + eps)."""

    name = "fake-eps-outside-sqrt"
    ops = ROW_AND_BATCH_OPS

    def rstd(self, var: F, eps: float) -> F:
        return 1.0 / (np.sqrt(var) + np.asarray(eps, var.dtype))


@conformance.register("fake-unbiased-variance")
class UnbiasedVariance(NumpyFake):
    name = "fake-unbiased-variance"
    ops = ROW_AND_BATCH_OPS

    def stats(self, x: F, axes: tuple[int, ...]) -> tuple[F, F]:
        mean, var = super().stats(x, axes)
        n = int(np.prod([x.shape[a] for a in axes]))
        return mean, var * (n / max(n - 1, 1))


@conformance.register("fake-one-pass-variance")
class OnePassVariance(NumpyFake):
    name = "fake-one-pass-variance"
    ops = ROW_AND_BATCH_OPS

    def stats(self, x: F, axes: tuple[int, ...]) -> tuple[F, F]:
        mean = x.mean(axis=axes, keepdims=True)
        return mean, np.square(x).mean(axis=axes, keepdims=True) - np.square(mean)


@conformance.register("fake-low-precision-stats")
class LowPrecisionStats(NumpyFake):
    """Statistics (and everything else) in the activation dtype, as a naive half kernel does."""

    name = "fake-low-precision-stats"
    ops = ROW_AND_BATCH_OPS

    def work(self, case: Case) -> Any:
        return numpy_dtype(case.dtype)


@conformance.register("fake-ln-dx-no-mean-terms")
class LayerNormDxNoMeanTerms(NumpyFake):
    name = "fake-ln-dx-no-mean-terms"
    ops = ROW_AND_BATCH_OPS

    def ln_dx(self, g: F, xhat: F, rstd: F, axes: tuple[int, ...]) -> F:
        return rstd * g


@conformance.register("fake-bn-biased-running-var")
class BatchNormBiasedRunningVar(NumpyFake):
    name = "fake-bn-biased-running-var"
    ops = ROW_AND_BATCH_OPS

    def running_var_batch(self, var: F, count: int) -> F:
        return var


@conformance.register("fake-bias-ignored")
class BiasIgnored(NumpyFake):
    name = "fake-bias-ignored"
    ops = ROW_AND_BATCH_OPS

    def add_bias(self, y: F, b: F) -> F:
        return y


@conformance.register("fake-wrong-axes")
class WrongAxes(NumpyFake):
    """Normalizes only the last dim whatever norm_ndim says (BN: over the batch axis only)."""

    name = "fake-wrong-axes"
    ops = ROW_AND_BATCH_OPS

    def axes(self, case: Case, x: F) -> tuple[int, ...]:
        return (0,) if case.op == "batch_norm" else (x.ndim - 1,)


@conformance.register("fake-degenerate-param-grads")
class DegenerateParamGrads(NumpyFake):
    """LayerNorm whose parameter gradients take xhat = 2^-12 on rows without spread (zero rows,
    constant rows, rows of one element) instead of the computed value, as a backward that puts a guard
    value where it fears 0/0; every other row, and every other output, is correct."""

    name = "fake-degenerate-param-grads"
    ops = ROW_AND_BATCH_OPS
    guard = 2.0**-12

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        if not (grad and case.weight and case.op == "layer_norm"):
            return out
        x = inputs["x"].astype(np.float64)
        axes = tuple(range(x.ndim - case.norm_ndim, x.ndim))
        flat = (x == x.max(axis=axes, keepdims=True)).all(axis=axes, keepdims=True)
        dy = inputs["dy"].astype(np.float64)
        extra = (dy * np.where(flat, self.guard, 0.0)).sum(axis=tuple(range(x.ndim - case.norm_ndim)))
        out["dweight"] = (out["dweight"].astype(np.float64) + extra).astype(out["dweight"].dtype)
        return out


# ---------------------------------------------------------------------- rounding and non-finite fakes
HALF = ("float16", "bfloat16")


def directed(values: F, dtype: str, mode: str) -> F:
    """float64 values rounded to a half dtype toward zero (``mode="zero"``) or toward +inf ("up"),
    by stepping the nearest-even result one ulp where it lies on the wrong side."""
    near = round_to(values, dtype)
    back = near.astype(np.float64)
    bits = near.view(np.uint16).copy()
    finite = np.isfinite(values)
    if mode == "zero":
        bits[finite & (np.abs(back) > np.abs(values))] -= 1  # one step smaller in magnitude, same sign
    else:
        up = finite & (back < values)
        bits[up & ~np.signbit(back)] += 1  # +0 and positive values: one step larger
        bits[up & np.signbit(back)] -= 1  # negative values: one step smaller in magnitude
    rounded: F = bits.view(near.dtype)
    return rounded


class _ExactThenDirected(NumpyFake):
    """Every output computed exactly (the float64 oracle; x + residual exact), then each half-precision
    output rounded in ``mode`` instead of to nearest; float32/float64 outputs round to nearest."""

    mode = "zero"

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        exact = oracle.evaluate(case, inputs, grad=grad)
        if case.op == "add_rms_norm":
            exact["residual_out"] = inputs["x"].astype(np.float64) + inputs["residual"].astype(np.float64)
        out = {}
        for name in produced(case, grad):
            dtype = output_dtype(case, name)
            out[name] = (
                directed(exact[name], dtype, self.mode) if dtype in HALF else round_to(exact[name], dtype)
            )
        return out


@conformance.register("fake-truncated-half")
class TruncatedHalf(_ExactThenDirected):
    name = "fake-truncated-half"
    ops = ROW_AND_BATCH_OPS
    mode = "zero"


@conformance.register("fake-rounds-up")
class RoundsUp(_ExactThenDirected):
    name = "fake-rounds-up"
    ops = ROW_AND_BATCH_OPS
    mode = "up"


@conformance.register("fake-truncated-residual")
class TruncatedResidual(NumpyFake):
    """Correct, but the residual stream x + residual is stored truncated (as a float32 -> half cast
    that drops bits does); y normalizes the correctly rounded sum."""

    name = "fake-truncated-residual"
    ops = ROW_AND_BATCH_OPS

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        if case.op == "add_rms_norm" and case.dtype in HALF:
            exact = inputs["x"].astype(np.float64) + inputs["residual"].astype(np.float64)
            out["residual_out"] = directed(exact, case.dtype, "zero")
        return out


@conformance.register("fake-nonfinite-rows-zeroed")
class NonfiniteRowsZeroed(NumpyFake):
    """Rows (channels) holding a NaN or an Inf come out as zeros, and add nothing to dweight/dbias."""

    name = "fake-nonfinite-rows-zeroed"
    ops = ROW_AND_BATCH_OPS

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        x = inputs["x"]
        axes = NumpyFake.axes(self, case, x)
        bad = ~np.isfinite(x.astype(np.float64)).all(axis=axes, keepdims=True)
        if not bad.any():
            return super().compute(case, inputs, grad)
        cleaned = {**inputs, "x": np.where(bad, np.zeros_like(x), x)}
        if grad:
            cleaned["dy"] = np.where(bad, np.zeros_like(inputs["dy"]), inputs["dy"])
        out = super().compute(case, cleaned, grad)
        for name in ("y", "dx"):
            if name in out:
                out[name] = np.where(bad, np.zeros_like(out[name]), out[name])
        return out


@conformance.register("fake-nan-dropping-clamp")
class NanDroppingClamp(NumpyFake):
    """One-pass statistics in float64 with the variance (RMSNorm: the mean square) clamped by a
    NaN-dropping maximum, fmax(var, 0), as fmaxf and several kernel languages' max do: a NaN in a row
    becomes a variance of 0 and the rest of the row comes out finite."""

    name = "fake-nan-dropping-clamp"
    ops = ROW_AND_BATCH_OPS

    def stats(self, x: F, axes: tuple[int, ...]) -> tuple[F, F]:
        wide = x.astype(np.float64)
        mean = wide.mean(axis=axes, keepdims=True)
        var = np.fmax(np.square(wide).mean(axis=axes, keepdims=True) - np.square(mean), 0.0)
        return mean.astype(x.dtype), var.astype(x.dtype)

    def rstd(self, var: F, eps: float) -> F:
        return 1.0 / np.sqrt(np.fmax(var, np.zeros((), var.dtype)) + np.asarray(eps, var.dtype))


@conformance.register("fake-mutates-inputs")
class MutatesInputs(NumpyFake):
    """Centres x in place, as an in-place kernel writing through a shared buffer would."""

    name = "fake-mutates-inputs"
    ops = ROW_AND_BATCH_OPS

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        inputs["x"] -= inputs["x"].mean(dtype=np.float64).astype(inputs["x"].dtype)
        return out


@conformance.register("fake-nondeterministic")
class Nondeterministic(NumpyFake):
    """Perturbs the last bit on every other call, like a racing atomic reduction."""

    name = "fake-nondeterministic"
    ops = ROW_AND_BATCH_OPS
    calls = 0

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        Nondeterministic.calls += 1
        if Nondeterministic.calls % 2:
            y = out["y"].copy()
            bits = y.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[y.itemsize])
            bits.flat[0] ^= 1  # flip the lowest mantissa bit of one element
            out["y"] = y
        return out


@conformance.register("fake-prepare-log")
class PrepareLog(NumpyFake):
    """Correct; appends "pid case-id" per prepare() to $NORMCONF_FAKE_PREPARE_LOG, so a test can see
    which worker prepared which case (signature grouping under xdist)."""

    name = "fake-prepare-log"

    def prepare(self, case: Case, inputs: dict[str, F], *, grad: bool) -> Prepared:
        with open(os.environ["NORMCONF_FAKE_PREPARE_LOG"], "a") as log:
            log.write(f"{os.getpid()} {case.id}\n")
        return super().prepare(case, inputs, grad=grad)


# ---------------------------------------------------------------------- robustness fakes
def _selected(case: Case) -> bool:
    """The one case these fakes misbehave on; every other case runs correctly."""
    return case.id == "layer_norm-float32-6x40-eps1e-05-normal"


class _Misbehaving(NumpyFake):
    def misbehave(self, out: dict[str, F]) -> dict[str, Any]:
        raise NotImplementedError

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        return self.misbehave(out) if _selected(case) else out


@conformance.register("fake-hangs")
class Hangs(_Misbehaving):
    name = "fake-hangs"

    def misbehave(self, out: dict[str, F]) -> dict[str, Any]:
        time.sleep(3600)
        return out


@conformance.register("fake-raises")
class Raises(_Misbehaving):
    name = "fake-raises"

    def misbehave(self, out: dict[str, F]) -> dict[str, Any]:
        raise RuntimeError("kernel launch failed: invalid configuration argument")


@conformance.register("fake-missing-output")
class MissingOutput(_Misbehaving):
    name = "fake-missing-output"

    def misbehave(self, out: dict[str, F]) -> dict[str, Any]:
        return {k: v for k, v in out.items() if k != "y"}


@conformance.register("fake-wrong-shape")
class WrongShape(_Misbehaving):
    name = "fake-wrong-shape"

    def misbehave(self, out: dict[str, F]) -> dict[str, Any]:
        return {k: v.reshape(-1) for k, v in out.items()}


@conformance.register("fake-not-array")
class NotArray(_Misbehaving):
    name = "fake-not-array"

    def misbehave(self, out: dict[str, F]) -> dict[str, Any]:
        return {k: v.tolist() for k, v in out.items()}


@conformance.register("fake-crashes")
class Crashes(_Misbehaving):
    """Dies natively (SIGABRT) mid-call, as a segfaulting extension would."""

    name = "fake-crashes"

    def misbehave(self, out: dict[str, F]) -> dict[str, Any]:
        os.abort()


@conformance.register("fake-unsupported-late")
class UnsupportedLate(_Misbehaving):
    """Raises Unsupported from __call__, where the contract makes it an error, not a skip."""

    name = "fake-unsupported-late"

    def misbehave(self, out: dict[str, F]) -> dict[str, Any]:
        raise conformance.Unsupported("changed its mind after prepare()")


@conformance.register("fake-unavailable")
class Unavailable(NumpyFake):
    name = "fake-unavailable"

    def capabilities(self) -> Capabilities:
        raise conformance.BackendUnavailable("needs a device this machine does not have")
