"""Verify the rsqrt-underflow entries of the fused residual ops (add_rms_norm, add_layer_norm) of
torch-nn, torch-functional, torch-compile, hf-*, keras, keras-jax and flax.

On `large` rows (|h| ~ 5e17 in float32 and bfloat16, 1e150 in float64) the derivative of rsqrt(v) that
autograd or the kernel forms (rstd**3, or -rsqrt(v) / (2 v) under JAX) underflows, and dL/dh loses the
variance-path term of the norm's gradient. For every failed or xfailed backward record of a `large`
add-op case in the given results files, rerun the backend and compare dx and dresidual with the oracle
and with dL/dh recomputed without that term:

    RMSNorm:   rstd * g + dresidual_out             (g = scale * dy)
    LayerNorm: rstd * (g - mean(g)) + dresidual_out

The cause is confirmed when the backend passes against the second (worst_ratio <= 1) and not the first.

Usage (from the repository root): python scripts/ledger_checks/residual_rsqrt.py RESULTS.jsonl...
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import common
import numpy as np

from conformance.model import residual
from conformance.model.case import ADD_LAYER_NORM, ADD_OPS, Case
from conformance.results.result import Result

GRADS = ("dx", "dresidual")


def without_variance_term(case: Case, inputs: common.Arrays) -> np.ndarray:
    """dL/dh with the norm's gradient reduced to its rstd-scaled term (activation shape, float64)."""
    n = int(np.prod(case.param_shape))
    h = residual.normalized(case, inputs).reshape(-1, n)
    if case.op == ADD_LAYER_NORM:
        h = h - h.mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt((h * h).mean(axis=1, keepdims=True) + case.eps)
    scale = np.asarray(inputs["weight"], np.float64).reshape(1, n) if case.weight else 1.0
    scale = scale + case.weight_offset
    g = np.asarray(inputs["dy"], np.float64).reshape(-1, n) * scale
    if case.op == ADD_LAYER_NORM:
        g = g - g.mean(axis=1, keepdims=True)
    dnorm = rstd * g
    dh: np.ndarray = dnorm + np.asarray(inputs["dresidual_out"], np.float64).reshape(-1, n)
    return dh.reshape(case.shape)


def verify(record: Result) -> common.Finding:
    case = common.case_of(record)
    inputs = common.inputs_of(case)
    actual = common.run(common.backend(record.backend), case, inputs, grad=True)
    reference = common.expected(case, inputs)
    now = common.ratios(case, inputs, reference, actual, GRADS)
    dropped = without_variance_term(case, inputs)
    after = common.ratios(case, inputs, {**reference, "dx": dropped, "dresidual": dropped}, actual, GRADS)
    detail = f"oracle {now} | without the variance term {after}"
    return common.Finding(record, "rsqrt_grad", common.explains(now, after), detail)


def findings(paths: list[str]) -> Iterator[common.Finding]:
    for record in common.records(paths, checks=("backward",), ops=ADD_OPS):
        if record.case.get("dist") == "large":
            yield verify(record)


if __name__ == "__main__":
    common.report(findings(sys.argv[1:]))
