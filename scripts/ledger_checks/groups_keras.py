"""Verify the suspected cause of every keras / keras-jax GroupNorm/InstanceNorm failure in a results
file by recomputing with that cause. Run once per Keras backend, in process (the script sets
KERAS_BACKEND itself):

  python scripts/ledger_checks/groups_keras.py RESULTS.jsonl keras
  python scripts/ledger_checks/groups_keras.py RESULTS.jsonl keras-jax

Causes (confirmed where every failing output passes with the cause, or is its float32 run bit for bit):
  float64     Keras computes float64 in float32: every failing output must be bit-identical to the
              adapter's float32 run of the same case on the inputs rounded to float32 (cast back up),
              or (XLA orders a float64-policy graph's float32 reductions its own way) read as float32
              pass the float32 case's tolerances against the oracle of the rounded inputs
  one_pass    (torch backend) keras.ops.moments is E[x^2] - E[x]^2 in float32, unclamped: rerun with
              the backend's moments replaced by a two-pass one (the only change); must pass
  rsqrt_grad  oracle dx recomputed with the variance path dropped, dx = rstd * (g - mean g) per group:
              the derivative of rsqrt(v) underflows for v ~ 1e35 (float32) and bf16 'large' groups
              (torch: -0.5 rsqrt(v)^3; JAX: -rsqrt(v) / (2 v)); must pass
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import common

from conformance.adapter.backend import Backend
from conformance.model.case import GROUP_OPS, Case
from conformance.results.result import Result


def two_pass_run(chosen: Backend, case: Case, inputs: common.Arrays, *, grad: bool) -> dict[str, Any]:
    """The adapter's outputs with Keras' torch-backend moments computed two-pass, the only change.

    GroupNormalization calls keras.ops.moments, which looks up the backend's nn.moments at each call;
    neither Keras' layer nor the adapter offers a choice of variance, so Keras' function is swapped for
    this run (a Keras global, not the adapter's).
    """
    import torch
    from keras.src.backend.torch import nn as torch_nn

    def moments(x: Any, axes: Any, keepdims: bool = False, synchronized: bool = False) -> Any:
        mean = torch.mean(x, dim=axes, keepdim=True)
        var = torch.mean(torch.square(x - mean), dim=axes, keepdim=True)
        return (mean, var) if keepdims else (mean.squeeze(axes), var.squeeze(axes))

    with common.replaced(vars(torch_nn), {"moments": moments}):
        return common.run(chosen, case, inputs, grad=grad)


def verify(chosen: Backend, record: Result) -> common.Finding:
    case = common.case_of(record)
    grad = common.grad_of(record)
    inputs = common.inputs_of(case)
    failing = common.failing(record)
    actual = common.run(chosen, case, inputs, grad=grad)
    if case.dtype == "float64":
        detail, ok = common.float64_as_float32(chosen, case, inputs, actual, failing, grad=grad)
        return common.Finding(record, "float64", ok, f"failing={list(failing)} {detail}")
    reference = common.expected(case, inputs)
    now = common.ratios(case, inputs, reference, actual, failing)
    if case.dist == "large":
        cause, model = "rsqrt_grad", {**reference, "dx": common.without_group_variance_path(case, inputs)}
        fixed = common.ratios(case, inputs, model, actual, failing)
    else:
        cause = "one_pass"
        fixed = common.ratios(case, inputs, reference, two_pass_run(chosen, case, inputs, grad=grad), failing)
    detail = f"failing={list(failing)} rerun={now} with-cause={fixed}"
    return common.Finding(record, cause, common.explains(now, fixed), detail)


def findings(results: str, name: str) -> Iterator[common.Finding]:
    chosen = common.keras_here(name)
    for record in common.records([results], backends=lambda found: found == name, ops=GROUP_OPS):
        yield verify(chosen, record)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("backend", choices=tuple(common.KERAS_BACKENDS))
    args = parser.parse_args()
    common.report(findings(args.results, args.backend))


if __name__ == "__main__":
    main()
