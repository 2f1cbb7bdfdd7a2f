"""Verify the GroupNorm/InstanceNorm ledger entries of onnxruntime and onnx-export
(conformance/judging/deviations/onnx.toml).

For every failing forward case in the given results files, rerun the backend on the case's inputs and
compare its y with the float64 oracle and with the oracle re-evaluated under each suspected cause:

- eps32:   eps rounded to float32 (ONNX's epsilon attribute is a FLOAT; the GroupNormalization function
           body holds it as a float constant and casts it to the stash type),
- onepass: the variance as E[x^2] - E[x]^2 (the ONNX GroupNormalization function body, which ORT 1.32
           inlines: it has no GroupNormalization kernel), in the stash precision (float32, float64 for
           float64),
           with eps32; the affine applied in the stash precision and y rounded once to x's dtype.
           NumPy sums in another order than ORT's ReduceMean, so on `offset` rows (mean/spread = kappa)
           it reproduces the size of the cancellation, not its bits; hence also
- stash32: (onnx-export at opset 21, float64) the function body with stash_type 1 as the exporter
           emits it: statistics one-pass in float32, the normalized value cast back to float64 for the
           affine (torch.onnx writes GroupNormalization-21 without stash_type: ONNX's default, float32),
           NumPy's float32 sums differ from ORT's in the last bits, so the decisive test is
- stash64: the exported model rerun with stash_type set to 11 (DOUBLE): the float32 error disappears,
           leaving the eps32 difference (1e-16 level against the eps32 oracle),
- shifted: the backend rerun on x - kappa (exact: Sterbenz), which GroupNorm's y does not depend on;
           with the mean removed E[x^2] - E[x]^2 no longer cancels, so if the error was the one-pass
           variance's, the shifted run agrees with the oracle (twopass: NumPy's two-pass in the stash
           precision, for scale).

openvino / openvino-default (float64 and bfloat16 failures, forward and training): the CPU plugin runs
f64 graphs in f32 and bfloat16 graphs in f32 with its own output rounding; verified by comparing the
backend's outputs bit for bit with the float32 twin case (same graph in float32 on the inputs cast to
float32, exactly for bfloat16) — for bfloat16 rounded by the plugin's
bfloat16_t::round_to_nearest_even, (bits + ((bits & 0x10000) >> 1)) >> 16.

A cause is confirmed when its variant reproduces the backend's y far better than the oracle does
(columns: max |actual - variant| for each; the closest is printed last).

Usage: .venv/bin/python scripts/ledger_checks/groups_onnx.py RESULTS.jsonl... (run from /work/main)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from conformance import oracle
from conformance.model.case import Case
from conformance.model.dtypes import numpy_dtype, stats_dtype
from conformance.model.inputs import OFFSET_KAPPA, make_inputs


def backend(name: str):
    if name == "onnxruntime":
        from backends.onnx.graphs import OnnxRuntime

        return OnnxRuntime()
    from backends.onnx.export import OnnxExport

    return OnnxExport()


def with_eps(case: Case, inputs, eps: float) -> np.ndarray:
    """The oracle's y with ``eps`` in place of case.eps (every other step float64)."""
    import dataclasses

    return oracle.evaluate(dataclasses.replace(case, eps=eps), inputs, grad=False)["y"]


def one_pass(case: Case, inputs, two_pass: bool = False, stash: str | None = None) -> np.ndarray:
    """The GroupNormalization function body: E[x^2] - E[x]^2 in the stash precision, float32 eps; with
    ``stash`` the statistics in that dtype and the affine in the parameters' own."""
    s = np.dtype(stash or stats_dtype(case.weight_dtype))
    n, c = case.shape[:2]
    g = case.groups
    x = inputs["x"].astype(s).reshape(n, g, -1)
    mean = x.mean(axis=-1, keepdims=True, dtype=s)
    if two_pass:
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True, dtype=s)
    else:
        var = (x * x).mean(axis=-1, keepdims=True, dtype=s) - mean * mean
    xhat = ((x - mean) / np.sqrt(var + s.type(np.float32(case.eps)))).reshape(n, c, -1)
    if stash:
        s = np.dtype(stats_dtype(case.weight_dtype))
        xhat = xhat.astype(s)
    w = inputs["weight"].astype(s) if case.weight else np.ones(c, s)
    b = inputs["bias"].astype(s) if case.bias else np.zeros(c, s)
    y = xhat * w[:, None] + b[:, None]
    return y.reshape(case.shape).astype(numpy_dtype(case.dtype)).astype(np.float64)


def stash64(case: Case, inputs, opset: int) -> np.ndarray:
    """The onnx-export model of ``case`` with its GroupNormalization's stash_type set to DOUBLE."""
    import torch

    from backends.common import ort_support as _ort
    from backends.onnx import export as ex

    values = ex._values(case, inputs)
    model = ex._export(case, torch.float64, values, opset)
    for node in model.graph.node:
        if node.op_type == "GroupNormalization":
            for attribute in node.attribute:
                if attribute.name == "stash_type":
                    attribute.i = 11
    session = _ort.session(model, "the exported graph with stash_type DOUBLE")
    feeds = {"x": inputs["x"], **{name: values[name] for name in ex._state_names(case)}}
    return session.run(None, feeds)[0]


def plugin_bf16(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + ((bits & 0x10000) >> 1)) >> 16).astype(np.uint16)


def openvino(name: str, case: Case, check: str) -> str:
    """Whether the backend's outputs are the float32 twin's (rounded by the plugin for bfloat16)."""
    import dataclasses

    from backends.openvino import runtime as ovr

    make = ovr.OpenVINO if name == "openvino" else ovr.OpenVINODefault
    inputs = make_inputs(case, grad=False)
    prepared = make().prepare(case, inputs, grad=False)
    prepared()
    twin = dataclasses.replace(case, dtype="float32", param_dtype=None)
    single = {k: v.astype(np.float32) for k, v in inputs.items()}
    reference = make().prepare(twin, single, grad=False)
    reference()
    verdicts = []
    for output, value in prepared.outputs().items():
        expected = reference.outputs()[output]
        if case.dtype == "bfloat16" and output == "y":
            same = np.array_equal(value.view(np.uint16), plugin_bf16(expected))
        elif value.dtype == np.float64:
            same = np.array_equal(value.astype(np.float32), expected, equal_nan=True)
        else:
            same = np.array_equal(value.astype(np.float32), expected.astype(np.float32), equal_nan=True)
        verdicts.append(f"{output} {'==' if same else '!='} float32 twin")
    return ", ".join(verdicts)


def main(paths: list[str]) -> None:
    seen = set()
    for path in paths:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") != "result" or r["outcome"] not in ("failed", "xfailed"):
                continue
            if r["check"] != "forward" and not (
                r["backend"].startswith("openvino") and r["check"] == "training"
            ):
                continue
            key = (r["backend"], r["case"]["id"], path)
            if key in seen:
                continue
            seen.add(key)
            case = Case.from_dict(r["case"])
            info = (r.get("extra") or {}).get("info") or {}
            if r["backend"].startswith("openvino"):
                print(
                    f"{r['backend']:16s} {r['check']:8s} {case.id:56s} "
                    f"{openvino(r['backend'], case, r['check'])}"
                )
                continue
            # Rerun at the opset the result was measured at.
            variable = (
                "NORMCONF_ONNX_OPSET" if r["backend"] == "onnx-export" else "NORMCONF_ORT_GROUP_NORM_OPSET"
            )
            if case.op == "group_norm" or r["backend"] == "onnx-export":
                os.environ[variable] = str(info["opset"])
            inputs = make_inputs(case, grad=False)
            prepared = backend(r["backend"]).prepare(case, inputs, grad=False)
            prepared()
            y = prepared.outputs()["y"].astype(np.float64)
            extra = ""
            variants = {
                "oracle": oracle.evaluate(case, inputs, grad=False)["y"],
                "eps32": with_eps(case, inputs, float(np.float32(case.eps))),
            }
            if case.op == "group_norm":
                variants["onepass"] = one_pass(case, inputs)
                if case.dtype == "float64" and r["backend"] == "onnx-export" and info["opset"] >= 21:
                    variants["stash32"] = one_pass(case, inputs, stash="float32")
                    again = stash64(case, inputs, info["opset"])
                    extra = (
                        f"  | stash64 rerun vs oracle {np.max(np.abs(again - variants['oracle'])):.3g},"
                        f" vs eps32 oracle {np.max(np.abs(again - variants['eps32'])):.3g}"
                    )
            diffs = {k: float(np.max(np.abs(y - v))) for k, v in variants.items()}
            best = min(diffs, key=diffs.get)
            text = "  ".join(f"{k} {v:.3g}" for k, v in diffs.items())
            if case.dist == "offset":
                kappa = OFFSET_KAPPA[case.dtype]
                x = inputs["x"]
                moved = {**inputs, "x": (x.astype(np.float64) - kappa).astype(x.dtype)}
                assert np.array_equal(moved["x"].astype(np.float64) + kappa, x.astype(np.float64))  # exact
                again = backend(r["backend"]).prepare(case, moved, grad=False)
                again()
                shifted = again.outputs()["y"].astype(np.float64)
                expected = variants["oracle"]
                text += f"  | oracle vs: shifted {np.max(np.abs(shifted - expected)):.3g}"
                text += f"  twopass {np.max(np.abs(one_pass(case, inputs, two_pass=True) - expected)):.3g}"
            print(f"{r['backend']:12s} {info.get('opset')} {case.id:56s} {text}  -> {best}{extra}")


if __name__ == "__main__":
    main(sys.argv[1:])
