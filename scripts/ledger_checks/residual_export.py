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
norm reads. A cause is confirmed when its variant reproduces the backend's y far better than the oracle
does (columns: max |actual - variant| for each, then the ratio to y's allowance
rtol * max(1, |y|) of the worst variant-to-oracle distance; the closest is printed last).

Usage: .venv/bin/python scripts/ledger_checks/residual_export.py RESULTS.jsonl...
(run from /work/main; onnx-export-optimized is built from backends.onnx.optimized directly).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np

from conformance import oracle
from conformance.model import residual
from conformance.model.case import ADD_OPS, Case
from conformance.model.inputs import make_inputs


def backend(name: str):
    if name == "onnx-export-optimized":
        from backends.onnx.optimized import OnnxExportOptimized

        return OnnxExportOptimized()
    from backends.onnx.export import OnnxExport

    return OnnxExport()


def variants(case: Case, inputs) -> dict[str, np.ndarray]:
    """The oracle's y under the case's conventions and under each suspected cause."""

    def y(changed: Case) -> np.ndarray:
        return oracle.evaluate(changed, inputs, grad=False)["y"]

    return {
        "oracle": y(case),
        "exact": y(dataclasses.replace(case, norm_input="exact")),
        # The smallest normal float64 stands for no eps (a Case takes a positive one).
        "noeps": y(dataclasses.replace(case, eps=float(np.finfo(np.float64).tiny))),
        "eps32": y(dataclasses.replace(case, eps=float(np.float32(case.eps)))),
    }


def main(paths: list[str]) -> None:
    seen = set()
    for path in paths:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") != "result" or r["outcome"] not in ("failed", "xfailed", "xpassed"):
                continue
            if r["check"] != "forward" or r["case"]["op"] not in ADD_OPS:
                continue
            if r["backend"] not in ("onnx-export", "onnx-export-optimized"):
                continue  # the other backends' records (a results file of every backend) are not ours
            key = (r["backend"], r["case"]["id"])
            if key in seen:
                continue
            seen.add(key)
            case = Case.from_dict(r["case"])
            info = (r.get("extra") or {}).get("info") or {}
            if info.get("opset"):
                os.environ["NORMCONF_ONNX_OPSET"] = str(info["opset"])
            inputs = make_inputs(case, grad=False)
            prepared = backend(r["backend"]).prepare(case, inputs, grad=False)
            prepared()
            outputs = prepared.outputs()
            actual = outputs["y"].astype(np.float64)
            stored = np.array_equal(outputs["residual_out"].astype(np.float64), residual.stored(case, inputs))
            found = variants(case, inputs)
            diffs = {k: float(np.max(np.abs(actual - v))) for k, v in found.items()}
            best = min(diffs, key=lambda k: diffs[k])
            tolerance = [c["tolerance"]["rtol"] for c in r["comparisons"] if c["output"] == "y"]
            allowance = (tolerance[0] if tolerance else float("nan")) * max(
                1.0, float(np.max(np.abs(actual)))
            )
            text = "  ".join(f"{k} {v:.3g}" for k, v in diffs.items())
            print(
                f"{r['backend']:22s} {r['outcome']:8s} {case.id:60s} {text}  (y allowance {allowance:.3g},"
                f" residual_out {'stored' if stored else 'NOT the rounded sum'}) -> {best}"
                f" [{info.get('fused_graph', info.get('graph', ''))}]"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
