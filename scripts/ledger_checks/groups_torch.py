"""Verify the suspected cause of every torch-nn / torch-functional / torch-compile GroupNorm and
InstanceNorm failure in results files by recomputing the oracle with that cause.

Usage (from /work/main): .venv/bin/python scripts/ledger_checks/groups_torch.py RESULTS.jsonl...
Causes (each prints, per failing output: torch vs oracle, the cause's model vs oracle, torch vs model):
  half_stats     torch's CPU GroupNorm and InstanceNorm (batch_norm on the (1, N*C, ...) view) keep the
                 mean and rstd they save in the activation dtype (torch.native_group_norm /
                 native_batch_norm return float16/bfloat16 for half inputs); the model is the float64
                 reference with every group's mean and rstd rounded to the activation dtype: the
                 backward of both ops, and InstanceNorm's forward, read them. torch must pass against
                 the model (ratio <= 1) while failing against the oracle.
  momentum_zero  nn.InstanceNorm*d with momentum=None passes momentum 0.0 to F.instance_norm: the oracle
                 recomputed with momentum 0.0 (running statistics = their inputs) must equal torch's
                 outputs bit for bit.
Rounding-bias failures ('rounds with a bias') print torch's and the half_stats model's bias in ulps.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from backends.torch.compiled import TorchCompile
from backends.torch.eager import TorchEager
from backends.torch.modules import TorchFunctional, TorchNN
from conformance import oracle
from conformance.judging import models, rounding, tolerances
from conformance.judging.verdict import compare_outputs
from conformance.model.case import Case
from conformance.model.dtypes import round_to
from conformance.model.inputs import make_inputs

TABLE = tolerances.read_tolerances()
BACKENDS = {b.name: b for b in (TorchNN(), TorchFunctional(), TorchEager())}


def backend(name: str):
    if name not in BACKENDS and name == "torch-compile":
        BACKENDS[name] = TorchCompile()
    return BACKENDS[name]


def run(name: str, case: Case, inputs, grad: bool):
    given = inputs if grad else {k: v for k, v in inputs.items() if k != "dy"}
    p = backend(name).prepare(case, given, grad=grad)
    p()
    return p.outputs()


def ratios(case, inputs, expected, actual, names):
    return {
        c.output: round(c.worst_ratio, 3)
        for c in compare_outputs(case, inputs, expected, actual, names, TABLE)
    }


def half_stats(case: Case, inputs) -> dict[str, np.ndarray]:
    """The reference with each group's mean and rstd rounded to the activation dtype (the ledger's model)."""
    return dict(models.half_statistics(case, inputs))


def verify(record: dict) -> None:
    case = Case.from_dict(record["case"])
    check, name = record["check"], record["backend"]
    grad = check in ("backward", "determinism", "inputs_unchanged")
    inputs = make_inputs(case, grad=grad)
    actual = run(name, case, inputs, grad)
    expected = oracle.evaluate(case, inputs, grad=grad)
    failing = [c["output"] for c in record.get("comparisons", []) if not c["worst_ratio"] <= 1]
    head = f"{name} {check} {case.id}"
    if check == "training" and case.momentum is None:
        zero = oracle.evaluate(dataclasses.replace(case, momentum=0.0), inputs, grad=False)
        same = all(np.array_equal(actual[k], zero[k].astype(actual[k].dtype)) for k in failing)
        print(f"{head}: momentum_zero {failing} torch == oracle(momentum=0.0) bit for bit: {same}")
        return
    model = {**expected, **half_stats(case, inputs)}  # the oracle's mean/rstd scale the tolerances
    if failing:
        print(
            f"{head}: half_stats torch/oracle {ratios(case, inputs, expected, actual, failing)}"
            f" model/oracle {ratios(case, inputs, expected, model, failing)}"
            f" torch/model {ratios(case, inputs, model, actual, failing)}"
        )
        return
    out = "dx" if "'dx'" in record["reason"] else "y"
    torch_bias = rounding.bias(actual[out], expected[out], case.dtype)
    model_bias = rounding.bias(round_to(model[out], case.dtype), expected[out], case.dtype)
    float_bias = rounding.bias(round_to(expected[out], case.dtype), expected[out], case.dtype)
    print(
        f"{head}: rounding {out} torch bias/drift {torch_bias.bias:+.3f}/{torch_bias.drift:+.3f}"
        f" half_stats model {model_bias.bias:+.3f}/{model_bias.drift:+.3f}"
        f" correctly rounded {float_bias.bias:+.3f}/{float_bias.drift:+.3f} (limit {torch_bias.limit:.3f})"
    )


def main() -> None:
    for path in sys.argv[1:]:
        for line in Path(path).read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "result" and record["outcome"] in ("failed", "xfailed"):
                verify(record)


if __name__ == "__main__":
    main()
