"""Which sum an add op's output normalized, read from a case's own y: the stored (rounded) x + residual
or the unrounded one. The fingerprint's ``add_*.sum`` questions ask a crafted probe; this asks every
half-precision add-op case a run executes, so each forward result says it (``extra.info``
``sum_normalized``, ``sum_evidence``), whatever the backend fused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from conformance import oracle
from conformance.model.case import ADD_OPS, NORM_INPUTS, Case
from conformance.model.dtypes import round_to

# The share of the telling elements one sum must hold to be named; below it the answer is "mixed".
SUM_MAJORITY = 0.9


def sum_read(
    case: Case, inputs: Mapping[str, np.ndarray], y: np.ndarray
) -> dict[str, str | int | float | bool]:
    """Where the oracle's y for the stored sum and for the unrounded sum round to different values of
    the activation dtype, how many of the output's values are each one's. Only for a half-precision
    stream (a float32 stream stores the sum it normalizes, so the two agree); {} otherwise."""
    if case.op not in ADD_OPS or case.stream_dtype not in ("float16", "bfloat16"):
        return {}
    given = {k: v for k, v in inputs.items() if k not in ("dy", "dresidual_out")}
    sums = {
        name: round_to(
            oracle.evaluate(dataclasses.replace(case, norm_input=name), given, grad=False)["y"], case.dtype
        )
        for name in NORM_INPUTS
    }
    rounded, exact = (sums[name].astype(np.float64) for name in NORM_INPUTS)
    telling = rounded != exact  # NaN never tells: it compares unequal to itself in both
    telling &= ~(np.isnan(rounded) | np.isnan(exact))
    actual = np.asarray(y).astype(np.float64)[telling]
    agree = {name: int(np.sum(actual == sums[name].astype(np.float64)[telling])) for name in NORM_INPUTS}
    count = int(telling.sum())
    evidence = ", ".join(f"{name} {n}/{count}" for name, n in agree.items())
    if not count:
        return {"sum_normalized": "indistinguishable", "sum_evidence": evidence}
    best = max(agree, key=lambda name: agree[name])
    answer = best if agree[best] >= SUM_MAJORITY * count else "mixed"
    return {"sum_normalized": answer, "sum_evidence": evidence}
