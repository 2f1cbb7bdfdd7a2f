"""Fakes with an execution-precision policy for the fingerprint's ``*.execution.float32`` and
``*.execution.float16`` questions and the questions they gate: ``fake-executes-float32-in-bfloat16``
computes a float32 case as a bfloat16 one (inputs rounded to bfloat16, the bfloat16 results returned as
float32), as an inference-precision policy on a CPU with bfloat16 arithmetic does, and is correct in
every other respect; ``fake-executes-float16-in-bfloat16`` does the same to float16 cases. (Their
float64 counterpart, ``fake-float64-in-float32``, is the ledger's: tests/fakes/ledger.py.)
"""

from __future__ import annotations

import dataclasses

import numpy as np

import conformance
from conformance.model.case import Case
from conformance.model.dtypes import round_to

from fakes.core import NumpyFake


@conformance.register("fake-executes-float32-in-bfloat16")
class Float32InBfloat16(NumpyFake):
    name = "fake-executes-float32-in-bfloat16"
    given = "float32"  # the case dtype computed in bfloat16; every other dtype is computed as given

    def compute(self, case: Case, inputs: dict[str, np.ndarray], grad: bool) -> dict[str, np.ndarray]:
        if case.dtype != self.given:
            return super().compute(case, inputs, grad)
        narrow = dataclasses.replace(case, dtype="bfloat16", param_dtype=None, residual_dtype=None)
        rounded = {name: round_to(value.astype(np.float64), "bfloat16") for name, value in inputs.items()}
        out = super().compute(narrow, rounded, grad)
        return {name: value.astype(np.float64).astype(self.given) for name, value in out.items()}


@conformance.register("fake-executes-float16-in-bfloat16")
class Float16InBfloat16(Float32InBfloat16):
    """float16 graphs in bfloat16, as OpenVINO's default precision policy runs them on a CPU with
    bfloat16 arithmetic."""

    name = "fake-executes-float16-in-bfloat16"
    given = "float16"


@conformance.register("fake-bf16-guard-rounding")
class Bfloat16GuardRounding(NumpyFake):
    """bfloat16 y converted from float32 by its guard bit alone (the bits below it dropped, then round half
    to even), as OpenVINO's CPU plugin converts: a value past the midpoint whose kept last bit is even
    rounds down. Correct in every other respect; the fingerprint's bit-level questions must still name
    its conventions (the reference ones)."""

    name = "fake-bf16-guard-rounding"

    def _rounded(self, case: Case, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rounded = super()._rounded(case, out)
        if case.dtype == "bfloat16" and "y" in out:
            wide = np.asarray(out["y"], dtype=np.float32)
            bits = (wide.view(np.uint32) >> 15).astype(np.uint64)  # the bfloat16 bits and the guard bit
            guard, odd = bits & 1, (bits >> 1) & 1
            kept = (bits >> 1) + (guard & odd)
            rounded["y"] = (kept << 16).astype(np.uint32).view(np.float32).astype(rounded["y"].dtype)
        return rounded
