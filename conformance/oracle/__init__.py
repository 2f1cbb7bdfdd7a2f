"""The float64 NumPy oracle: expected outputs and gradients of a Case, one module per op.

It reads the rounded inputs upcast to float64, so it sees exactly the bits a backend sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from conformance.model.case import (
    ADD_LAYER_NORM,
    ADD_RMS_NORM,
    BATCH_NORM,
    GROUP_NORM,
    INSTANCE_NORM,
    LAYER_NORM,
    RMS_NORM,
    Case,
)
from conformance.oracle import (
    add_layer_norm,
    add_rms_norm,
    batch_norm,
    group_norm,
    instance_norm,
    layer_norm,
    rms_norm,
)
from conformance.oracle.common import Array

__all__ = ["ORACLES", "OpOracle", "evaluate"]


class OpOracle(Protocol):
    """What an op module provides: float64 inputs in, float64 outputs out."""

    def evaluate(self, case: Case, inputs: Mapping[str, Array], *, grad: bool) -> dict[str, Array]: ...


ORACLES: Mapping[str, OpOracle] = {
    LAYER_NORM: layer_norm,
    RMS_NORM: rms_norm,
    BATCH_NORM: batch_norm,
    ADD_RMS_NORM: add_rms_norm,
    GROUP_NORM: group_norm,
    INSTANCE_NORM: instance_norm,
    ADD_LAYER_NORM: add_layer_norm,
}


def evaluate(case: Case, inputs: Mapping[str, np.ndarray], *, grad: bool) -> dict[str, np.ndarray]:
    """Expected outputs of ``case``: ``y``, BN-training running stats, ``mean``/``rstd``, and gradients.

    Raises NotImplementedError for an op without an oracle, ValueError when ``grad`` lacks ``dy``.
    """
    oracle = ORACLES.get(case.op)
    if oracle is None:
        raise NotImplementedError(f"no oracle for op={case.op}; oracles exist for {', '.join(ORACLES)}")
    if grad and "dy" not in inputs:
        raise ValueError(f"grad=True needs inputs['dy'] for case {case.id}; got {sorted(inputs)}")
    upcast = {name: np.asarray(values, dtype=np.float64) for name, values in inputs.items()}
    return oracle.evaluate(case, upcast, grad=grad)
