"""Verify the add-op ledger entries of onnx-export and onnx-export-optimized
(conformance/judging/deviations/onnx.toml).

For every failing or xfailed forward case of the add ops in the given results files, rerun the backend
on the case's inputs and compare its y with the float64 oracle and with the oracle re-evaluated under
each suspected cause:

- exact:   the norm reads the unrounded sum (norm_input "exact"): com.microsoft SkipLayerNormalization /
           SkipSimplifiedLayerNormalization add x + residual in float32, normalize that sum and round
           only the copy they store as residual_out (the fourth output) to the activation dtype,
- noeps:   eps ~ 0: onnxscript's optimizer drops x + c for |c| <= 1e-8 (rule add_0), so RMSNorm with
           eps = 1e-12 exported below opset 23 has none,
- eps32:   eps rounded to float32 (ONNX's epsilon attribute is a FLOAT).

residual_out is compared too: it must be the sum rounded once to the stream's dtype, whichever sum the
norm reads. Each variant prints y's worst_ratio against it (the suite's comparison and tolerances) and
max |actual - variant|; a cause is confirmed where y passes against its variant and fails against the
oracle.

Usage (from the repository root): python scripts/ledger_checks/residual_export.py RESULTS.jsonl...
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator

import common
import numpy as np

from conformance.model import residual
from conformance.model.case import ADD_OPS, Case
from conformance.results.result import Result

BACKENDS = ("onnx-export", "onnx-export-optimized")


def variants(case: Case) -> dict[str, Case]:
    """The case under each suspected cause (the oracle of each is what the backend is compared with)."""
    return {
        "exact": dataclasses.replace(case, norm_input="exact"),
        # The smallest normal float64 stands for no eps (a Case takes a positive one).
        "noeps": dataclasses.replace(case, eps=float(np.finfo(np.float64).tiny)),
        "eps32": dataclasses.replace(case, eps=float(np.float32(case.eps))),
    }


def verify(record: Result) -> Iterator[common.Finding]:
    case = common.case_of(record)
    inputs = common.inputs_of(case)
    chosen = common.at_opset(record.backend, common.info(record).get("opset"))
    outputs = common.run(chosen, case, inputs, grad=False)
    stored = np.array_equal(outputs["residual_out"].astype(np.float64), residual.stored(case, inputs))
    graph = common.info(record).get("fused_graph", common.info(record).get("graph", ""))
    now = common.ratios(case, inputs, common.expected(case, inputs), outputs, ("y",))
    for cause, changed in variants(case).items():
        model = common.expected(changed, inputs)
        after = common.ratios(case, inputs, model, outputs, ("y",))
        off = float(np.max(np.abs(outputs["y"].astype(np.float64) - model["y"])))
        detail = (
            f"y vs oracle {now['y']}, vs {cause} {after['y']} (max abs {off:.3g}); residual_out"
            f" {'stored' if stored else 'NOT the rounded sum'} [{graph}]"
        )
        yield common.Finding(record, cause, stored and common.explains(now, after), detail)


def findings(paths: list[str]) -> Iterator[common.Finding]:
    for record in common.forward_records(paths, BACKENDS, ADD_OPS):
        yield from verify(record)


if __name__ == "__main__":
    common.report(findings(sys.argv[1:]))
