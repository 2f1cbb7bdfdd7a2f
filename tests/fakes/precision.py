"""A fake with an execution-precision policy for the fingerprint's ``*.execution.float32`` questions and
the questions they gate: ``fake-executes-float32-in-bfloat16`` computes a float32 case as a bfloat16 one
(inputs rounded to bfloat16, the bfloat16 results returned as float32), as an inference-precision policy
on a CPU with bfloat16 arithmetic does, and is correct in every other respect. (Its float64 counterpart,
``fake-float64-in-float32``, is the ledger's: tests/fakes/ledger.py.)
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

    def compute(self, case: Case, inputs: dict[str, np.ndarray], grad: bool) -> dict[str, np.ndarray]:
        if case.dtype != "float32":
            return super().compute(case, inputs, grad)
        narrow = dataclasses.replace(case, dtype="bfloat16", param_dtype=None, residual_dtype=None)
        rounded = {name: round_to(value.astype(np.float64), "bfloat16") for name, value in inputs.items()}
        out = super().compute(narrow, rounded, grad)
        return {name: value.astype(np.float64).astype(np.float32) for name, value in out.items()}
