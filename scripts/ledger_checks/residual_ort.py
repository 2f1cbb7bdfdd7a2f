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
matches bit for bit).

Usage: .venv/bin/python scripts/ledger_checks/residual_ort.py RESULTS.jsonl... (run from /work/main)
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

from conformance import oracle
from conformance.judging.tolerances import read_tolerances
from conformance.judging.verdict import compare_outputs
from conformance.model import residual
from conformance.model.case import ADD_OPS, Case
from conformance.model.inputs import make_inputs
from conformance.model.outputs import forward_outputs

TOLERANCES = read_tolerances()
BACKENDS = ("onnxruntime", "onnxruntime-contrib", "openvino", "openvino-default")


def backend(name: str):
    if name == "onnxruntime":
        from backends.onnx.graphs import OnnxRuntime

        return OnnxRuntime()
    if name == "onnxruntime-contrib":
        from backends.onnx.contrib import OnnxRuntimeContrib

        return OnnxRuntimeContrib()
    from backends.openvino import runtime as ovr

    return ovr.OpenVINO() if name == "openvino" else ovr.OpenVINODefault()


def run(name: str, case: Case, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    prepared = backend(name).prepare(case, inputs, grad=False)
    prepared()
    return dict(prepared.outputs())


def ratios(case: Case, inputs, out) -> str:
    """worst_ratio per forward output against the oracle of ``case``."""
    expected = oracle.evaluate(case, inputs, grad=False)
    found = compare_outputs(case, inputs, expected, out, forward_outputs(case), TOLERANCES)
    return " ".join(f"{c.output} {c.worst_ratio:.3g}" for c in found)


def plugin_bf16(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + ((bits & 0x10000) >> 1)) >> 16).astype(np.uint16)


def twin(name: str, case: Case, inputs, out) -> str:
    """Whether each output is the float32 twin graph's, rounded as the plugin rounds."""
    single = dataclasses.replace(case, dtype="float32", param_dtype=None, residual_dtype=None)
    reference = run(name, single, {k: v.astype(np.float32) for k, v in inputs.items()})
    verdicts = []
    for output, value in out.items():
        want = reference[output]
        if value.dtype.name == "bfloat16":
            same = np.array_equal(value.view(np.uint16), plugin_bf16(want))
        else:
            same = np.array_equal(value, want.astype(value.dtype), equal_nan=True)
        verdicts.append(f"{output} {'==' if same else '!='} twin")
    return ", ".join(verdicts)


def mvn_bf16(case: Case, inputs, out) -> str:
    """(openvino, bfloat16 add_layer_norm with the bf16 Add) Whether y is the plugin's split LayerNorm:
    the MVN of the stored bfloat16 sum in f32, its output z stored in bf16 by the plugin's Convert
    (plugin_bf16), then z * w + b in f32 rounded to nearest-even: two roundings of y."""
    h = residual.stored(case, inputs).astype(np.float32).reshape(-1, case.shape[-1])
    mean = h.mean(axis=-1, keepdims=True, dtype=np.float32)
    var = np.square(h - mean).mean(axis=-1, keepdims=True, dtype=np.float32)
    z = (h - mean) / np.sqrt(var + np.float32(case.eps))
    z = (plugin_bf16(z).astype(np.uint32) << 16).view(np.float32)
    w = np.asarray(inputs.get("weight", 1.0), dtype=np.float32)
    b = np.asarray(inputs.get("bias", 0.0), dtype=np.float32)
    y = (z * w + b).astype(ml_dtypes.bfloat16).reshape(case.shape)
    share = float(np.mean(y.view(np.uint16) == np.asarray(out["y"]).view(np.uint16)))
    return f"y == split-MVN model on {share:.4%} of elements"


def ortcast(case: Case, inputs) -> str:
    """Which tensor the normalization node reads in the graph ORT runs (written out unoptimized)."""
    import onnx

    from backends.common import ort_support as _ort
    from backends.onnx import graphs

    conventions = graphs.OnnxRuntime()
    spec = graphs.build(case, conventions.plan(case, inputs), conventions)
    with tempfile.TemporaryDirectory() as folder:
        options = _ort.ort.SessionOptions()
        options.graph_optimization_level = _ort.ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.optimized_model_filepath = str(Path(folder) / "ran.onnx")
        _ort.ort.InferenceSession(
            spec.model().SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        nodes = onnx.load(options.optimized_model_filepath).graph.node
    norm = next(n for n in nodes if n.op_type in ("LayerNormalization", "RMSNormalization"))
    add = next(n for n in nodes if n.op_type == "Add")
    reads = "the Add's output" if norm.input[0] == add.output[0] else f"{norm.input[0]}"
    return f"norm reads {reads} ({add.output[0]})"


def main(paths: list[str]) -> None:
    seen = set()
    for path in paths:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") != "result" or r["check"] != "forward" or r["backend"] not in BACKENDS:
                continue
            if r["outcome"] not in ("failed", "xfailed", "xpassed") or r["case"]["op"] not in ADD_OPS:
                continue
            case = Case.from_dict(r["case"])
            if (r["backend"], case.id) in seen:
                continue
            seen.add((r["backend"], case.id))
            inputs = make_inputs(case, grad=False)
            out = run(r["backend"], case, inputs)
            parts = [f"oracle: {ratios(case, inputs, out)}"]
            if case.norm_input == "rounded" and case.dtype != "float64":
                parts.append(f"exact: {ratios(dataclasses.replace(case, norm_input='exact'), inputs, out)}")
            if case.dtype == "float64":
                eps32 = dataclasses.replace(case, eps=float(np.float32(case.eps)))
                parts.append(f"eps32: {ratios(eps32, inputs, out)}")
            if r["backend"].startswith("openvino"):
                parts.append(twin(r["backend"], case, inputs, out))
                if case.op == "add_layer_norm" and case.dtype == "bfloat16" and case.param_dtype is None:
                    parts.append(mvn_bf16(case, inputs, out))
            elif r["backend"] == "onnxruntime" and case.dtype != "float64":
                parts.append(ortcast(case, inputs))
            print(f"{r['backend']:19s} {r['outcome']:8s} {case.id:62s} | " + " | ".join(parts))


if __name__ == "__main__":
    main(sys.argv[1:])
