"""Verify the suspected cause of every torch-nn / torch-functional / torch-compile GroupNorm and
InstanceNorm failure in results files by recomputing the oracle with that cause.

Usage (from the repository root): python scripts/ledger_checks/groups_torch.py RESULTS.jsonl...
Causes (each prints, per failing output: torch vs oracle, the cause's model vs oracle, torch vs model):
  half_stats     torch's CPU GroupNorm and InstanceNorm (batch_norm on the (1, N*C, ...) view) keep the
                 mean and rstd they save in the activation dtype (torch.native_group_norm /
                 native_batch_norm return float16/bfloat16 for half inputs); the model is the float64
                 reference with every group's mean and rstd rounded to the activation dtype: the
                 backward of both ops, and InstanceNorm's forward, read them. Confirmed where torch fails
                 against the oracle and passes against the model.
  momentum_zero  nn.InstanceNorm*d with momentum=None passes momentum 0.0 to F.instance_norm: confirmed
                 where the oracle recomputed with momentum 0.0 (running statistics = their inputs) equals
                 torch's failing outputs bit for bit.
  rounding       rounding-bias records ('rounds with a bias', no output beyond tolerance): torch's and the
                 half_stats model's bias in ulps (measured).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import common
import numpy as np

from conformance.judging import models, rounding
from conformance.model.case import GROUP_OPS, Case
from conformance.model.dtypes import round_to
from conformance.results.result import Result

BACKENDS = ("torch-nn", "torch-functional", "torch-compile")


def momentum_zero(record: Result, case: Case, actual: common.Arrays) -> common.Finding:
    names = common.failing(record)
    zero = common.expected(case, common.inputs_of(case), momentum=0.0)
    same = bool(names) and all(np.array_equal(actual[k], zero[k].astype(actual[k].dtype)) for k in names)
    return common.Finding(
        record, "momentum_zero", same, f"{list(names)} torch == oracle(momentum=0.0): {same}"
    )


def half_stats(record: Result, case: Case, actual: common.Arrays) -> common.Finding:
    inputs = common.inputs_of(case)
    reference = common.expected(case, inputs)
    model = {**reference, **models.half_statistics(case, inputs)}  # the oracle's mean/rstd scale tolerances
    names = common.failing(record)
    now = common.ratios(case, inputs, reference, actual, names)
    against = common.ratios(case, inputs, model, actual, names)
    detail = (
        f"torch/oracle {now} model/oracle {common.ratios(case, inputs, reference, model, names)}"
        f" torch/model {against}"
    )
    return common.Finding(record, "half_stats", common.explains(now, against), detail)


def bias(record: Result, case: Case, actual: common.Arrays) -> common.Finding:
    inputs = common.inputs_of(case)
    reference = common.expected(case, inputs)
    model = {**reference, **models.half_statistics(case, inputs)}
    out = "dx" if "'dx'" in record.reason else "y"

    def measured(values: np.ndarray) -> str:
        found = rounding.bias(values, reference[out], case.dtype)
        return "-" if found is None else f"{found.bias:+.3f}/{found.drift:+.3f} (limit {found.limit:.3f})"

    detail = (
        f"{out} bias/drift torch {measured(actual[out])} half_stats model"
        f" {measured(round_to(model[out], case.dtype))} correctly rounded"
        f" {measured(round_to(reference[out], case.dtype))}"
    )
    return common.Finding(record, "rounding", None, detail)


def verify(record: Result) -> common.Finding:
    case = common.case_of(record)
    grad = common.grad_of(record)
    actual = common.run(common.backend(record.backend), case, common.inputs_of(case), grad=grad)
    if record.check == "training" and case.momentum is None:
        return momentum_zero(record, case, actual)
    if common.failing(record):
        return half_stats(record, case, actual)
    return bias(record, case, actual)


def findings(paths: list[str]) -> Iterator[common.Finding]:
    for record in common.records(paths, backends=lambda name: name in BACKENDS, ops=GROUP_OPS):
        yield verify(record)


if __name__ == "__main__":
    common.report(findings(sys.argv[1:]))
