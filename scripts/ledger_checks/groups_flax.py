"""Verify the suspected cause of every flax GroupNorm/InstanceNorm failure in a results file by
recomputing with that cause.

Usage (from the repository root): python scripts/ledger_checks/groups_flax.py RESULTS.jsonl...
Causes (confirmed where a failing output fails against the oracle and every one passes with the cause):
  one_pass    flax rerun with use_fast_variance=False on linen.GroupNorm / linen.InstanceNorm (the only
              change; the default True computes var = max(0, E[x^2] - E[x]^2) in float32/float64);
              every listed output must then pass
  rsqrt_grad  oracle dx recomputed with the variance path dropped, dx = rstd * (g - mean g) per group
              (g = dy * w): JAX's d rsqrt(v) = -rsqrt(v) / (2 v) underflows for v ~ 1e35 (float32),
              1e300 (float64) and bf16's 'large' rows; the adapter's dx must then pass
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import common

from conformance.model.case import GROUP_OPS
from conformance.results.result import Result


def verify(record: Result) -> common.Finding:
    case = common.case_of(record)
    grad = common.grad_of(record)
    inputs = common.inputs_of(case)
    names = common.compared(record)
    reference = common.expected(case, inputs)
    actual = common.run(common.backend("flax"), case, inputs, grad=grad)
    now = common.ratios(case, inputs, reference, actual, names)
    if case.dist == "large":
        cause = "rsqrt_grad"
        fixed = common.ratios(
            case, inputs, {**reference, "dx": common.without_group_variance_path(case, inputs)}, actual, names
        )
    else:
        cause = "one_pass"
        fixed = common.ratios(case, inputs, reference, common.flax_two_pass(case, inputs, grad=grad), names)
    failing = common.failing(record)
    detail = f"failing={list(failing)} rerun={now} with-cause={fixed}"
    return common.Finding(record, cause, common.explains(now, fixed, failing), detail)


def findings(paths: list[str]) -> Iterator[common.Finding]:
    for record in common.records(paths, backends=lambda name: name == "flax", ops=GROUP_OPS):
        yield verify(record)


if __name__ == "__main__":
    common.report(findings(sys.argv[1:]))
