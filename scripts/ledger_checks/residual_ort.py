"""Verify the fused residual ops' (add_rms_norm, add_layer_norm) ledger entries of onnxruntime,
onnxruntime-contrib, openvino and openvino-default.

For every failed, xfailed or xpassed forward record of the add ops in the given results files, rerun the
backend on the case's inputs and judge its outputs with the suite's own comparison and tolerances against
the oracle, and against the oracle re-evaluated under each suspected cause:

- exact: the norm reads the unrounded sum (norm_input "exact") instead of the sum as stored:
         onnxruntime-contrib's float16/bfloat16 SkipLayerNormalization kernels (they sum in float32 and
         round only input_skip_bias_sum); onnxruntime under float32 parameters, where ORT's
         InsertCastTransformer runs the float16 Add in float32 and hands the float32 result straight to
         the LayerNormalization that the graph feeds Cast(residual_out) (ortcast below shows it);
         OpenVINO, whose CPU plugin runs half graphs in f32.
- eps32: eps rounded to float32 (ONNX's epsilon attribute is a FLOAT): float64 cases of onnxruntime.
- twin:  (openvino*) the same graph in float32 on the exactly upcast inputs, its outputs rounded to the
         case's dtypes as the plugin rounds them (bfloat16: (bits + ((bits & 0x10000) >> 1)) >> 16;
         float16: nearest-even; float64: exact), compared bit for bit.
- mvn:   (openvino, bfloat16 add_layer_norm) where the plugin runs the residual Add in bf16 (a CPU with
         AVX512-BF16: norm_precision f32+bf16) it splits LayerNormalization into an MVN whose output is
         stored in bf16 by its Convert, then the affine in f32: y rounded twice (mvn_bf16 below).
- ortcast: (onnxruntime) the graph ORT runs, written out at ORT_DISABLE_ALL: whether the
         LayerNormalization / RMSNormalization reads the Add's own output rather than residual_out.

A cause is confirmed when its variant's worst_ratio is <= 1 where the oracle's is not (or the twin
matches bit for bit); mvn and ortcast are measured.

Usage (from the repository root): python scripts/ledger_checks/residual_ort.py RESULTS.jsonl...
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import common
import ml_dtypes
import numpy as np

from conformance.model import residual
from conformance.model.case import ADD_LAYER_NORM, ADD_OPS, Case
from conformance.model.outputs import forward_outputs
from conformance.results.result import Result

BACKENDS = ("onnxruntime", "onnxruntime-contrib", "openvino", "openvino-default")


def judged(
    record: Result, cause: str, changed: Case, inputs: common.Arrays, out: common.Arrays
) -> common.Finding:
    """The outputs against the oracle of the case and against that of ``changed`` (the cause)."""
    case = common.case_of(record)
    names = forward_outputs(case)
    now = common.ratios(case, inputs, common.expected(case, inputs), out, names)
    after = common.ratios(changed, inputs, common.expected(changed, inputs), out, names)
    return common.Finding(record, cause, common.explains(now, after), f"oracle {now} | {cause} {after}")


def mvn_bf16(record: Result, case: Case, inputs: common.Arrays, out: common.Arrays) -> common.Finding:
    """(openvino, bfloat16 add_layer_norm with the bf16 Add) Whether y is the plugin's split LayerNorm:
    the MVN of the stored bfloat16 sum in f32, its output z stored in bf16 by the plugin's Convert
    (plugin_bf16), then z * w + b in f32 rounded to nearest-even: two roundings of y."""
    h = residual.stored(case, inputs).astype(np.float32).reshape(-1, case.shape[-1])
    mean = h.mean(axis=-1, keepdims=True, dtype=np.float32)
    var = np.square(h - mean).mean(axis=-1, keepdims=True, dtype=np.float32)
    z = (h - mean) / np.sqrt(var + np.float32(case.eps))
    z = (common.plugin_bf16(z).astype(np.uint32) << 16).view(np.float32)
    w = np.asarray(inputs.get("weight", 1.0), dtype=np.float32)
    b = np.asarray(inputs.get("bias", 0.0), dtype=np.float32)
    y = (z * w + b).astype(ml_dtypes.bfloat16).reshape(case.shape)
    share = float(np.mean(y.view(np.uint16) == np.asarray(out["y"]).view(np.uint16)))
    return common.Finding(record, "mvn", None, f"y == split-MVN model on {share:.4%} of elements")


def ortcast(record: Result, case: Case, inputs: common.Arrays) -> common.Finding:
    """Which tensor the normalization node reads in the graph ORT runs (written out unoptimized)."""
    import onnx
    import onnxruntime  # type: ignore[import-untyped]  # ships no type information

    from backends.onnx import graphs

    conventions = graphs.OnnxRuntime()
    spec = graphs.build(case, conventions.plan(case, inputs), conventions)
    with tempfile.TemporaryDirectory() as folder:
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.optimized_model_filepath = str(Path(folder) / "ran.onnx")
        onnxruntime.InferenceSession(
            spec.model().SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        nodes = onnx.load(options.optimized_model_filepath).graph.node
    norm = next(n for n in nodes if n.op_type in ("LayerNormalization", "RMSNormalization"))
    add = next(n for n in nodes if n.op_type == "Add")
    reads = "the Add's output" if norm.input[0] == add.output[0] else f"{norm.input[0]}"
    return common.Finding(record, "ortcast", None, f"norm reads {reads} ({add.output[0]})")


def verify(record: Result) -> Iterator[common.Finding]:
    case = common.case_of(record)
    inputs = common.inputs_of(case)
    out = common.run(common.backend(record.backend), case, inputs, grad=False)
    if case.norm_input == "rounded" and case.dtype != "float64":
        yield judged(record, "exact", dataclasses.replace(case, norm_input="exact"), inputs, out)
    if case.dtype == "float64":
        yield judged(record, "eps32", dataclasses.replace(case, eps=float(np.float32(case.eps))), inputs, out)
    if record.backend.startswith("openvino"):
        same = common.float32_twin(record.backend, case, inputs, out, grad=False)
        detail = ", ".join(f"{k} {'==' if v else '!='} twin" for k, v in same.items())
        yield common.Finding(record, "twin", all(same.values()), detail)
        if case.op == ADD_LAYER_NORM and case.dtype == "bfloat16" and case.param_dtype is None:
            yield mvn_bf16(record, case, inputs, out)
    elif record.backend == "onnxruntime" and case.dtype != "float64":
        yield ortcast(record, case, inputs)


def findings(paths: list[str]) -> Iterator[common.Finding]:
    for record in common.forward_records(paths, BACKENDS, ADD_OPS):
        yield from verify(record)


if __name__ == "__main__":
    common.report(findings(sys.argv[1:]))
