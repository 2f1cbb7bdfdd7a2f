"""Fake backends for the fused residual add ops and the aliasing contract, over the correct NumPy fake.

Loaded into a conformance run with ``-p fakes.residual`` (tests/ on PYTHONPATH). Each broken
fake changes one thing; tests/suite/test_meta_residual_fakes.py asserts the suite catches it (the check and
output, or the aliasing message, and the fingerprint answer where one names it). The in-place fakes
compute into the very arrays they were given, as an in-place kernel writes its input buffers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

import conformance
from conformance.adapter.backend import Capabilities
from conformance.model.case import ADD_OPS, Case

from fakes.core import ROW_AND_BATCH_OPS, NumpyFake

F = np.ndarray


@conformance.register("fake-add-exact-sum")
class ExactSum(NumpyFake):
    """Normalizes the unrounded float32 sum whatever the case asks (the sum kept in registers)."""

    name = "fake-add-exact-sum"
    ops = ADD_OPS

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        return super().compute(dataclasses.replace(case, norm_input="exact"), inputs, grad)


@conformance.register("fake-add-float32-stream")
class Float32Stream(NumpyFake):
    """Returns residual_out as the float32 sum even where the stream is the activation dtype."""

    name = "fake-add-float32-stream"
    ops = ADD_OPS

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        out["residual_out"] = inputs["x"].astype(np.float32) + inputs["residual"].astype(np.float32)
        return out


@conformance.register("fake-add-no-residual-grad")
class NoResidualGrad(NumpyFake):
    """Drops the cotangent of residual_out: dx = dresidual = d norm / dh . dy only."""

    name = "fake-add-no-residual-grad"
    ops = ADD_OPS

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        if grad:
            inputs = {**inputs, "dresidual_out": np.zeros_like(inputs["dresidual_out"])}
        return super().compute(case, inputs, grad)


class _InPlace:
    """Prepared of an in-place fake: writes ``targets`` (output -> input) into the given inputs.

    A call must be repeatable, so it starts from copies of the inputs as given; with ``restore`` it
    also puts them back first, as an adapter of an in-place kernel does before each timed call."""

    def __init__(self, fake: InPlaceBase, case: Case, inputs: dict[str, F], grad: bool) -> None:
        self.fake, self.case, self.inputs, self.grad = fake, case, inputs, grad
        self.pristine = {k: v.copy() for k, v in inputs.items()}
        self.result: dict[str, F] = {}

    def __call__(self) -> None:
        for name, value in self.pristine.items():
            self.inputs[name][...] = value
        self.result = NumpyFake.compute(self.fake, self.case, dict(self.pristine), self.grad)
        for out, target in self.fake.writes(self.case).items():
            if out in self.result and target in self.inputs:
                self.inputs[target][...] = self.fake.written(out, self.result, self.pristine)
                if self.fake.returns_buffer:
                    self.result[out] = self.inputs[target]

    def synchronize(self) -> None:
        pass

    def outputs(self) -> dict[str, Any]:
        return self.result


class InPlaceBase(NumpyFake):
    ops = ADD_OPS
    declared: ClassVar[dict[str, str]] = {}
    returns_buffer = True

    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities(), aliases=self.declared)

    def writes(self, case: Case) -> dict[str, str]:
        """output -> the input it is written into (only where the dtypes agree)."""
        return {"y": "x", "residual_out": "residual"} if case.residual_dtype is None else {"y": "x"}

    def written(self, out: str, result: dict[str, F], pristine: dict[str, F]) -> F:
        return result[out]

    def prepare(self, case: Case, inputs: dict[str, F], *, grad: bool) -> Any:
        return _InPlace(self, case, inputs, grad)


@conformance.register("fake-add-inplace-declared")
class InPlaceDeclared(InPlaceBase):
    """Correct and declared, as vLLM's fused_add_rms_norm: y into x's buffer, the sum into residual's."""

    name = "fake-add-inplace-declared"
    declared: ClassVar[dict[str, str]] = {"y": "x", "residual_out": "residual"}


@conformance.register("fake-add-inplace-undeclared")
class InPlaceUndeclared(InPlaceBase):
    """Updates the residual buffer in place and returns it as residual_out, declaring nothing."""

    name = "fake-add-inplace-undeclared"

    def writes(self, case: Case) -> dict[str, str]:
        return {"residual_out": "residual"} if case.residual_dtype is None else {}


@conformance.register("fake-add-inplace-stale")
class InPlaceStale(InPlaceBase):
    """Declares residual_out as residual's buffer, returns a correct copy, but leaves x in the buffer."""

    name = "fake-add-inplace-stale"
    declared: ClassVar[dict[str, str]] = {"residual_out": "residual"}
    returns_buffer = False

    def writes(self, case: Case) -> dict[str, str]:
        return {"residual_out": "residual"} if case.residual_dtype is None else {}

    def written(self, out: str, result: dict[str, F], pristine: dict[str, F]) -> F:
        return pristine["x"]


class _Returning:
    def __init__(self, result: dict[str, F]) -> None:
        self.result = result

    def __call__(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def outputs(self) -> dict[str, Any]:
        return self.result


@conformance.register("fake-output-aliases-input")
class OutputAliasesInput(NumpyFake):
    """Writes y over the x it was given and returns that array: every row op, undeclared."""

    name = "fake-output-aliases-input"
    ops = ROW_AND_BATCH_OPS

    def prepare(self, case: Case, inputs: dict[str, F], *, grad: bool) -> Any:
        fake = self

        class Overwriting(_Returning):
            def __call__(self) -> None:
                self.result = fake.compute(case, {k: v.copy() for k, v in inputs.items()}, grad)
                inputs["x"][...] = self.result["y"]
                self.result["y"] = inputs["x"]

        return Overwriting({})


@conformance.register("fake-shared-gradient")
class SharedGradient(NumpyFake):
    """Returns one array as both dx and dresidual (they are equal in value; one buffer is not)."""

    name = "fake-shared-gradient"
    ops = ADD_OPS

    def compute(self, case: Case, inputs: dict[str, F], grad: bool) -> dict[str, F]:
        out = super().compute(case, inputs, grad)
        if grad and out["dx"].dtype == out["dresidual"].dtype:
            out["dresidual"] = out["dx"]
        return out
