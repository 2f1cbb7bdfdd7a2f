"""Verify the GroupNorm/InstanceNorm ledger entries of onnxruntime, onnx-export and openvino
(conformance/judging/deviations/onnx.toml, openvino.toml).

For every failing forward case in the given results files, rerun the backend (at the opset the record
was measured at) on the case's inputs and compare its y with the float64 oracle and with the oracle
re-evaluated under each suspected cause:

- eps32:   eps rounded to float32 (ONNX's epsilon attribute is a FLOAT; the GroupNormalization function
           body holds it as a float constant and casts it to the stash type),
- onepass: the variance as E[x^2] - E[x]^2 (the ONNX GroupNormalization function body, which ORT 1.32
           inlines: it has no GroupNormalization kernel), in the stash precision (float32, float64 for
           float64), with eps32; the affine applied in the stash precision and y rounded once to x's
           dtype. NumPy sums in another order than ORT's ReduceMean, so on `offset` rows (mean/spread =
           kappa) it reproduces the size of the cancellation, not its bits; hence also
- stash32: (onnx-export at opset >= 21, float64) the function body with stash_type 1 as the exporter
           emits it: statistics one-pass in float32, the normalized value cast back to float64 for the
           affine (torch.onnx writes GroupNormalization-21 without stash_type: ONNX's default, float32).
The line of these distances (max |actual - variant|) is measured; the closest is printed last. Verdicts:

- one_pass: (offset rows) the backend rerun on x - kappa (exact: Sterbenz), which GroupNorm's y does not
           depend on: with the mean removed E[x^2] - E[x]^2 no longer cancels, so the cause is confirmed
           where that run passes against the oracle while the record's fails (twopass: NumPy's two-pass
           in the stash precision, for scale),
- stash64: (onnx-export at opset >= 21, float64) the exported model rerun with stash_type set to 11
           (DOUBLE): confirmed where it passes against the eps32 oracle while the export fails,
- float32_twin: (openvino, openvino-default: float64 and bfloat16 failures, forward and training) the CPU
           plugin runs f64 graphs in f32 and bfloat16 graphs in f32 with its own output rounding: every
           output equals, bit for bit, the float32 twin case (same graph in float32 on the inputs cast to
           float32, exactly for bfloat16), for bfloat16 rounded by the plugin's
           bfloat16_t::round_to_nearest_even, (bits + ((bits & 0x10000) >> 1)) >> 16.

Usage (from the repository root): python scripts/ledger_checks/groups_onnx.py RESULTS.jsonl...
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import common
import numpy as np
import onnx

from backends.onnx.export import Info, OnnxExport
from conformance.model.case import GROUP_NORM, GROUP_OPS, Case
from conformance.model.dtypes import numpy_dtype, stats_dtype
from conformance.model.inputs import OFFSET_KAPPA
from conformance.results.result import Result

DOUBLE = onnx.TensorProto.DOUBLE


class DoubleStash(OnnxExport):
    """onnx-export at a given opset with every GroupNormalization's stash_type set to DOUBLE (11), the
    only change: through the adapter's own transform step, between the export and the session."""

    def __init__(self, opset: int) -> None:
        super().__init__()
        self._opset = opset

    def target_opset(self) -> int:
        return self._opset

    def transform(self, case: Case, model: onnx.ModelProto) -> tuple[onnx.ModelProto, Info]:
        for node in model.graph.node:
            if node.op_type == "GroupNormalization":
                stash = [a for a in node.attribute if a.name == "stash_type"]
                if stash:
                    stash[0].i = DOUBLE
                else:
                    node.attribute.append(onnx.helper.make_attribute("stash_type", DOUBLE))
        return model, {"stash_type": "DOUBLE"}


def one_pass(
    case: Case, inputs: common.Arrays, two_pass: bool = False, stash: str | None = None
) -> np.ndarray:
    """The GroupNormalization function body: E[x^2] - E[x]^2 in the stash precision, float32 eps; with
    ``stash`` the statistics in that dtype and the affine in the parameters' own."""
    # 'large' float64 rows overflow a float32 stash and a cancelled variance may fall below -eps: both
    # are what the function body does too.
    with np.errstate(invalid="ignore", over="ignore"):
        return _function_body(case, inputs, two_pass, stash)


def _function_body(case: Case, inputs: common.Arrays, two_pass: bool, stash: str | None) -> np.ndarray:
    s = np.dtype(stash or stats_dtype(case.weight_dtype))
    n, c = case.shape[:2]
    x = inputs["x"].astype(s).reshape(n, case.groups, -1)
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
    y: np.ndarray = xhat * w[:, None] + b[:, None]
    return y.reshape(case.shape).astype(numpy_dtype(case.dtype)).astype(np.float64)


def distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b)))


def closest(record: Result, case: Case, inputs: common.Arrays, y: np.ndarray) -> common.Finding:
    """How far y is from the oracle and from each variant (measured: NumPy cannot follow ORT's sums)."""
    reference = common.expected(case, inputs)["y"]
    variants = {
        "oracle": reference,
        "eps32": common.expected(case, inputs, eps=float(np.float32(case.eps)))["y"],
    }
    if case.op == GROUP_NORM:
        variants["onepass"] = one_pass(case, inputs)
        if case.dtype == "float64" and common.info(record).get("opset", 0) >= 21:
            variants["stash32"] = one_pass(case, inputs, stash="float32")
    diffs = {k: distance(y, v) for k, v in variants.items()}
    text = "  ".join(f"{k} {v:.3g}" for k, v in diffs.items())
    return common.Finding(record, "closest", None, f"{text} -> {min(diffs, key=lambda k: diffs[k])}")


def shifted(record: Result, case: Case, inputs: common.Arrays, y: np.ndarray) -> common.Finding:
    """The backend rerun on x - kappa against the oracle (y does not depend on the shift)."""
    kappa = OFFSET_KAPPA[case.dtype]
    x = inputs["x"]
    moved = {**inputs, "x": (x.astype(np.float64) - kappa).astype(x.dtype)}
    assert np.array_equal(moved["x"].astype(np.float64) + kappa, x.astype(np.float64)), "the shift is exact"
    chosen = common.at_opset(record.backend, common.info(record).get("opset"))
    again = common.run(chosen, case, moved, grad=False)["y"]
    reference = common.expected(case, inputs)
    now = common.ratios(case, inputs, reference, {"y": y}, ("y",))
    after = common.ratios(case, inputs, reference, {"y": again}, ("y",))
    twopass = distance(one_pass(case, inputs, two_pass=True), reference["y"])
    detail = (
        f"y vs oracle {now['y']}, shifted run vs oracle {after['y']}"
        f" (max abs {distance(again, reference['y']):.3g};"
        f" NumPy two-pass {twopass:.3g})"
    )
    return common.Finding(record, "one_pass", common.explains(now, after), detail)


def stash64(record: Result, case: Case, inputs: common.Arrays, y: np.ndarray) -> common.Finding:
    """The exported model rerun with stash_type DOUBLE, against the eps32 oracle."""
    again = common.run(DoubleStash(int(common.info(record)["opset"])), case, inputs, grad=False)["y"]
    now = common.ratios(case, inputs, common.expected(case, inputs), {"y": y}, ("y",))
    eps32 = common.expected(case, inputs, eps=float(np.float32(case.eps)))
    after = common.ratios(case, inputs, eps32, {"y": again}, ("y",))
    off = distance(again, eps32["y"])
    detail = f"y vs oracle {now['y']}, stash64 rerun vs eps32 oracle {after['y']} (max abs {off:.3g})"
    return common.Finding(record, "stash64", common.explains(now, after), detail)


def openvino(record: Result, case: Case) -> common.Finding:
    inputs = common.inputs_of(case)
    actual = common.run(common.backend(record.backend), case, inputs, grad=False)
    same = common.float32_twin(record.backend, case, inputs, actual, grad=False)
    detail = ", ".join(f"{k} {'==' if v else '!='} float32 twin" for k, v in same.items())
    return common.Finding(record, "float32_twin", all(same.values()), detail)


def verify(record: Result) -> Iterator[common.Finding]:
    case = common.case_of(record)
    if record.backend.startswith("openvino"):
        yield openvino(record, case)
        return
    inputs = common.inputs_of(case)
    opset = common.info(record).get("opset")
    y = common.run(common.at_opset(record.backend, opset), case, inputs, grad=False)["y"]
    yield closest(record, case, inputs, y)
    if case.dist == "offset":
        yield shifted(record, case, inputs, y)
    exported = record.backend.startswith("onnx-export")
    if exported and case.op == GROUP_NORM and case.dtype == "float64" and (opset or 0) >= 21:
        yield stash64(record, case, inputs, y)


def ours(record: Result) -> bool:
    """Forward records of the ONNX and OpenVINO backends; OpenVINO's training records too."""
    if not record.backend.startswith(("onnx", "openvino")):
        return False
    return record.check == "forward" or (record.backend.startswith("openvino") and record.check == "training")


def findings(paths: list[str]) -> Iterator[common.Finding]:
    for record in common.records(
        paths, backends=lambda name: name.startswith(("onnx", "openvino")), ops=GROUP_OPS
    ):
        if ours(record):
            yield from verify(record)


if __name__ == "__main__":
    common.report(findings(sys.argv[1:]))
