"""Fakes for the ledger's models: a backend that rounds eps to float32 before use (an ONNX FLOAT
attribute in a float64 graph), which an entry with the ``eps_float32`` model explains, and one that
rounds it to bfloat16, a deviation of the same kind and another size, which that entry must not
explain; ``eps_bfloat16`` is a third party's model of the second, named as ``module:function``.

Loaded with ``-p normconf_ledger_fakes`` (tests/ on PYTHONPATH)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
from normconf_fakes import ROW_AND_BATCH_OPS, F, NumpyFake

import conformance
from conformance import oracle
from conformance.model.case import Case
from conformance.model.dtypes import round_to


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
