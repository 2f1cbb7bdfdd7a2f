"""The residual stream of the fused add ops: what is stored, and what the norm reads.

``h = x + residual`` is stored as ``residual_out`` in the stream's dtype (the activation dtype, or
float32 for "residual in fp32" models). The norm reads either that stored value (``norm_input =
"rounded"``) or the sum before its rounding (``"exact"``: a kernel that keeps h in float32 registers).
The oracle, the judging and the fingerprint ask these questions of a case, so the answers live here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conformance.model.case import ADD_OPS, Case
from conformance.model.dtypes import round_to


def exact_sum(inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """x + residual in float64: exact for every pair of float32/float16/bfloat16 values (the
    exponents of a sum that float64 cannot hold differ by more than 29 binades)."""
    total: np.ndarray = np.asarray(inputs["x"], dtype=np.float64) + np.asarray(
        inputs["residual"], dtype=np.float64
    )
    return total


def stored(case: Case, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """residual_out: the sum rounded once to the stream's dtype, as float64."""
    with np.errstate(over="ignore"):
        rounded: np.ndarray = round_to(exact_sum(inputs), case.stream_dtype).astype(np.float64)
    return rounded


def normalized(case: Case, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """What the norm of an add op reads (float64); x itself for every other op."""
    if case.op not in ADD_OPS:
        return np.asarray(inputs["x"], dtype=np.float64)
    return stored(case, inputs) if case.norm_input == "rounded" else exact_sum(inputs)
