"""Fakes for the ledger's models: a backend that rounds eps to float32 before use (an ONNX FLOAT
attribute in a float64 graph), which an entry with the ``eps_float32`` model explains, and one that
rounds it to bfloat16, a deviation of the same kind and another size, which that entry must not
explain; ``eps_bfloat16`` is a third party's model of the second, named as ``module:function``.

Loaded with ``-p fakes.ledger`` (tests/ on PYTHONPATH)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

import conformance
from conformance import oracle
from conformance.model.case import OPS, Case
from conformance.model.dtypes import numpy_dtype, round_to
from conformance.model.outputs import output_dtype

from fakes.core import ROW_AND_BATCH_OPS, F, NumpyFake, directed


def _bfloat16(eps: float) -> float:
    return float(round_to(np.asarray([eps]), "bfloat16").astype(np.float64)[0])


@conformance.register("fake-eps-float32")
class EpsFloat32(NumpyFake):
    name = "fake-eps-float32"
    ops = ROW_AND_BATCH_OPS

    def rstd(self, var: F, eps: float) -> F:
        return super().rstd(var, float(np.float32(eps)))


@conformance.register("fake-eps-bfloat16")
class EpsBfloat16(NumpyFake):
    name = "fake-eps-bfloat16"
    ops = ROW_AND_BATCH_OPS

    def rstd(self, var: F, eps: float) -> F:
        return super().rstd(var, _bfloat16(eps))


def eps_bfloat16(case: Case, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference with eps rounded to bfloat16 first."""
    rounded = dataclasses.replace(case, eps=_bfloat16(case.eps))
    return oracle.evaluate(rounded, inputs, grad="dy" in inputs)


# ------------------------------------------------------------------ one fake per model, and its near miss
# Each pair deviates in the way a model of conformance.judging.models describes and in a way of the same
# kind and another size (or shape) that the model must not explain. They are plain backends: the tests
# run them through the real judge (tests/judging/test_ledger_models.py).


class _PerCase(NumpyFake):
    """A fake whose hooks need the case they run for."""

    ops = frozenset(OPS)
    case: Case

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        self.case = case
        return super().compute(case, inputs, grad)


@conformance.register("fake-eps-dropped")
class EpsDropped(NumpyFake):
    """A graph whose eps was folded away (onnxscript's optimizer drops x + c for |c| <= 1e-8)."""

    name = "fake-eps-dropped"
    ops = ROW_AND_BATCH_OPS

    def rstd(self, var: F, eps: float) -> F:
        return super().rstd(var, 0.0)


@conformance.register("fake-float64-in-float32")
class Float64InFloat32(NumpyFake):
    """Float64 cases computed in float32 throughout (Keras, the Hugging Face classes, OpenVINO's CPU
    plugin): what ``float32_execution`` explains."""

    name = "fake-float64-in-float32"
    narrow = np.float32

    def work(self, case: Case) -> Any:
        return self.narrow if case.dtype == "float64" else super().work(case)

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        narrowed = (
            {k: v.astype(self.narrow) for k, v in inputs.items()} if case.dtype == "float64" else inputs
        )
        return super().compute(case, narrowed, grad)


@conformance.register("fake-float64-in-float16")
class Float64InFloat16(Float64InFloat32):
    """Float64 computed in float16: narrower than float32_execution says."""

    name = "fake-float64-in-float16"
    narrow = np.float16


@conformance.register("fake-rstd-cubed")
class RstdCubed(NumpyFake):
    """LayerNorm's backward through d rsqrt(v) = -rsqrt(v)**3 / 2 formed in the working dtype: for rows
    of |x| ~ 5e17 in float32 it underflows and dx loses its variance term."""

    name = "fake-rstd-cubed"
    ops = ROW_AND_BATCH_OPS

    def ln_dx(self, g: F, xhat: F, rstd: F, axes: tuple[int, ...]) -> F:
        centred = xhat / rstd
        cubed = rstd**3
        return rstd * (g - g.mean(axis=axes, keepdims=True)) - centred * cubed * (g * centred).mean(
            axis=axes, keepdims=True
        )


@conformance.register("fake-half-statistics")
class HalfStatistics(_PerCase):
    """Mean and rstd held in ``held`` (default: the activation dtype), as torch's native_layer_norm
    returns them for half inputs and its backward reads them: what ``half_statistics`` explains."""

    name = "fake-half-statistics"
    held: str | None = None

    def _hold(self, values: F) -> F:
        return round_to(values.astype(np.float64), self.held or self.case.dtype).astype(values.dtype)

    def stats(self, x: F, axes: tuple[int, ...]) -> tuple[F, F]:
        mean, var = super().stats(x, axes)  # the variance of the exact mean, in float32
        return self._hold(mean), var

    def rstd(self, var: F, eps: float) -> F:
        return self._hold(super().rstd(var, eps))


@conformance.register("fake-bfloat16-statistics")
class Bfloat16Statistics(HalfStatistics):
    """Statistics held in bfloat16 whatever the activation dtype: three bits fewer than float16's."""

    name = "fake-bfloat16-statistics"
    held = "bfloat16"


@conformance.register("fake-exact-sum")
class ExactSum(NumpyFake):
    """The norm reads x + residual before its rounding; residual_out is the rounded copy."""

    name = "fake-exact-sum"

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        return super().compute(dataclasses.replace(case, norm_input="exact"), inputs, grad)


@conformance.register("fake-truncated-sum-read")
class TruncatedSumRead(NumpyFake):
    """The norm reads x + residual rounded toward zero instead of the stored (nearest) copy: another
    sum than the one the case asks for, and not the exact one either (forward only)."""

    name = "fake-truncated-sum-read"

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        exact = inputs["x"].astype(np.float64) + inputs["residual"].astype(np.float64)
        read = {k: v.astype(np.float64) for k, v in inputs.items()}
        read["x"], read["residual"] = directed(exact, case.dtype, "zero").astype(np.float64), 0 * exact
        out = oracle.evaluate(case, read, grad=False)
        out["residual_out"] = exact
        return {k: round_to(v, output_dtype(case, k)) for k, v in out.items()}


@conformance.register("fake-bn-doubled-running-var")
class DoubledRunningVar(NumpyFake):
    """running_var blended with twice the batch variance: no convention, a bug."""

    name = "fake-bn-doubled-running-var"
    ops = ROW_AND_BATCH_OPS

    def running_var_batch(self, var: F, count: int) -> F:
        return 2 * var


@conformance.register("fake-rounded-xhat")
class RoundedXhat(NumpyFake):
    """RMSNorm returning weight * xhat.to(activation dtype) (LlamaRMSNorm): what ``rounded_xhat`` explains;
    ``xhat_dtype`` rounds xhat to another dtype than the activation's."""

    name = "fake-rounded-xhat"
    xhat_dtype: str | None = None

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        x = inputs["x"].astype(np.float32)
        rstd = 1.0 / np.sqrt(np.square(x).mean(axis=-1, keepdims=True) + np.float32(case.eps))
        xhat = (x * rstd).astype(numpy_dtype(self.xhat_dtype or case.dtype)).astype(np.float32)
        w = inputs["weight"].astype(np.float32)
        out["y"] = (w * xhat).astype(numpy_dtype(output_dtype(case, "y")))
        if grad:
            dy = inputs["dy"].astype(np.float32)
            out["dweight"] = (dy * xhat).sum(axis=0).astype(numpy_dtype(output_dtype(case, "dweight")))
        return out


@conformance.register("fake-float16-xhat")
class Float16Xhat(RoundedXhat):
    name = "fake-float16-xhat"
    xhat_dtype = "float16"


@conformance.register("fake-weight-grad-in-dtype")
class WeightGradInDtype(NumpyFake):
    """Float32 parameters read through a cast to the activation dtype: dweight and dbias come back
    rounded to it (``rounded_to``, default the activation dtype)."""

    name = "fake-weight-grad-in-dtype"
    rounded_to: str | None = None

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        for name in ("dweight", "dbias"):
            if name in out:
                held = round_to(out[name].astype(np.float64), self.rounded_to or case.dtype)
                out[name] = held.astype(out[name].dtype)
        return out


@conformance.register("fake-weight-grad-in-bfloat16")
class WeightGradInBfloat16(WeightGradInDtype):
    name = "fake-weight-grad-in-bfloat16"
    rounded_to = "bfloat16"


@conformance.register("fake-truncating-convert")
class TruncatingConvert(NumpyFake):
    """bfloat16 outputs computed in float32 and converted as OpenVINO's CPU plugin does,
    (bits + ((bits & 0x10000) >> 1)) >> 16: round half up only when the kept last bit is odd."""

    name = "fake-truncating-convert"

    def _rounded(self, case: Case, out: dict[str, F]) -> dict[str, F]:
        done = {}
        for name, values in out.items():
            if output_dtype(case, name) != "bfloat16":
                done[name] = values.astype(numpy_dtype(output_dtype(case, name)))
                continue
            done[name] = _guard_bfloat16(values)
        return done

    def store(self, case: Case, total: F) -> F:
        # The add ops' stored sum is a bfloat16 output converted from float32 too (an AVX2 CPU's
        # OpenVINO: x + residual in float32, then its conversion): the norm reads that.
        return _guard_bfloat16(total) if case.stream_dtype == "bfloat16" else super().store(case, total)


def _guard_bfloat16(values: F) -> F:
    """float32 values converted to bfloat16 as OpenVINO's CPU plugin converts without AVX512-BF16."""
    bits = np.ascontiguousarray(values.astype(np.float32)).view(np.uint32).astype(np.uint64)
    kept = (((bits + ((bits & 0x10000) >> 1)) >> 16) << 16).astype(np.uint32)
    return kept.view(np.float32).astype(numpy_dtype("bfloat16"))


@conformance.register("fake-bfloat16-execution")
class Bfloat16Execution(NumpyFake):
    """float32 and float16 cases run as bfloat16 ones (a bf16 precision policy): inputs rounded to
    bfloat16, float32 statistics, the outputs rounded to bfloat16 and handed back in the case's dtype.
    With ``bfloat16_statistics`` the statistics are held in bfloat16 too."""

    name = "fake-bfloat16-execution"
    bfloat16_statistics = False

    def work(self, case: Case) -> Any:
        if self.bfloat16_statistics and case.dtype != "float64":
            return numpy_dtype("bfloat16")
        return super().work(case)

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        if case.dtype in ("float64", "bfloat16"):
            return super().compute(case, inputs, grad)
        narrow = dataclasses.replace(case, dtype="bfloat16", param_dtype=None)
        rounded = {k: v.astype(numpy_dtype("bfloat16")) for k, v in inputs.items()}
        out = super().compute(narrow, rounded, grad)
        return {k: v.astype(numpy_dtype(output_dtype(case, k))) for k, v in out.items()}


@conformance.register("fake-bfloat16-statistics-execution")
class Bfloat16StatisticsExecution(Bfloat16Execution):
    name = "fake-bfloat16-statistics-execution"
    bfloat16_statistics = True


@conformance.register("fake-one-pass-unclamped")
class OnePassUnclamped(NumpyFake):
    """GroupNorm whose variance is E[x^2] - E[x]^2 in float32, not clamped, each group's sums taken
    as eight float32 lanes accumulated in order and folded in halves (an AVX2 reduction): on offset
    groups most digits cancel, on constant ones about half the residues are negative (NaN with a tiny
    eps). ``lanes = 1`` sums element by element instead: the same formula, another rounding."""

    name = "fake-one-pass-unclamped"
    ops = frozenset({"group_norm"})
    lanes = 8

    def _sum(self, rows: F) -> F:
        whole = rows.shape[1] - rows.shape[1] % self.lanes
        acc = rows[:, : self.lanes].copy()
        for start in range(self.lanes, whole, self.lanes):
            acc = acc + rows[:, start : start + self.lanes]
        while acc.shape[1] > 1:
            acc = acc[:, : acc.shape[1] // 2] + acc[:, acc.shape[1] // 2 :]
        total = acc[:, 0]
        for k in range(whole, rows.shape[1]):
            total = total + rows[:, k]
        return total

    def stats(self, x: F, axes: tuple[int, ...]) -> tuple[F, F]:
        rows = x.reshape(x.shape[0] * x.shape[1], -1)
        count = np.asarray(rows.shape[1], rows.dtype)
        mean = self._sum(rows) / count
        var = self._sum(rows * rows) / count - mean * mean
        keep = (x.shape[0], x.shape[1], 1, 1)
        return mean.reshape(keep), var.reshape(keep)

    def rstd(self, var: F, eps: float) -> F:
        with np.errstate(invalid="ignore"):  # the negative residues' NaN is the deviation
            return super().rstd(var, eps)


@conformance.register("fake-one-pass-unclamped-sequential")
class OnePassUnclampedSequential(OnePassUnclamped):
    name = "fake-one-pass-unclamped-sequential"
    lanes = 1
