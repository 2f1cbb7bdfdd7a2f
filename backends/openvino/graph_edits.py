"""Edits of onnx_graphs' hand-built graphs for the OpenVINO adapters: the eps left out, and MatMul fences.

The graphs themselves come from backends/onnx/graphs.py (one builder for every ONNX runtime); this module
only rewrites a built ``Spec`` in place, so the normalization node and its translations stay the
builder's own.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from backends.common import ort_support as _ort
from backends.onnx.graphs import Spec
from conformance.model.dtypes import numpy_dtype

# The ONNX ops that carry the normalization's epsilon attribute (ONNX default 1e-5 for each).
NORMS = frozenset(
    {
        "LayerNormalization",
        "RMSNormalization",
        "BatchNormalization",
        "GroupNormalization",
        "InstanceNormalization",
    }
)
# What a fence is made of: the activation as a column, times the 1 x 1 matrix [[1]], back to its shape.
_AXES, _ONE = "fence_axes", "fence_one"


def drop_eps(spec: Spec) -> Spec:
    """The graph with no epsilon attribute on its normalization nodes, so the runtime applies ONNX's
    default (the fingerprint's default-eps hook: what a model exported without eps computes)."""
    for node in spec.nodes:
        if node.op_type in NORMS:
            kept = [a for a in node.attribute if a.name != "epsilon"]
            del node.attribute[:]
            node.attribute.extend(kept)
    return spec


def fence(spec: Spec) -> Spec:
    """The normalization between two MatMul nodes, as in a transformer block (or a conv net's BN between
    convolutions): x enters through a MatMul and y leaves through one.

    OpenVINO's CPU plugin lowers nodes to bf16 under its default precision policy only where they are
    not in the graph's tail: it walks back from every output and keeps in f32 each node reached before
    a MatMul/FullyConnected/Convolution (intel_cpu Graph::EnforceInferencePrecision). A lone norm between
    graph inputs and outputs is therefore always f32; inside a model it is lowered. The fence puts the
    case's norm where a deployed model has it.

    Each MatMul multiplies the activation, viewed as a column (..., n, 1), by the 1 x 1 matrix [[1]]:
    exact in every dtype (x * 1 = x, also for Inf and NaN), so the graph computes the same function as
    the unfenced one. An n x n identity would be the same MatMul decision at n^2 the memory (600 MB at
    n = 12288) and would spread a NaN or Inf across its row (0 * Inf = NaN).
    """
    case = spec.case
    for node in spec.nodes:
        node.input[:] = ["x_fenced" if name == "x" else name for name in node.input]
        node.output[:] = ["y_norm" if name == "y" else name for name in node.output]
    head = [
        helper.make_node(
            "Constant", [], [_AXES], value=helper.make_tensor(_AXES, onnx.TensorProto.INT64, [1], [-1])
        ),
        helper.make_node("Constant", [], [_ONE], value=_one(case.dtype)),
        *_through_matmul("x", "x_fenced", "x_in"),
    ]
    spec.nodes[:0] = head
    spec.nodes.extend(_through_matmul("y_norm", "y", "y_out"))
    return spec


def _one(dtype: str) -> onnx.TensorProto:
    """The 1 x 1 matrix [[1]] in ``dtype``, stored as raw bytes: OpenVINO 2026.4's ONNX frontend reads a
    BFLOAT16 tensor's int32_data as numbers, not as bits (bits 0x3F80, 1.0, become 16256.0)."""
    one = np.ones((1, 1), numpy_dtype(dtype))
    return helper.make_tensor(_ONE, _ort.ONNX_TYPES[dtype], [1, 1], one.tobytes(), raw=True)


def _through_matmul(source: str, target: str, prefix: str) -> list[onnx.NodeProto]:
    """``target`` = Squeeze(MatMul(Unsqueeze(``source``, -1), [[1]]), -1): ``source`` through one MatMul."""
    return [
        helper.make_node("Unsqueeze", [source, _AXES], [f"{prefix}_column"]),
        helper.make_node("MatMul", [f"{prefix}_column", _ONE], [f"{prefix}_matmul"]),
        helper.make_node("Squeeze", [f"{prefix}_matmul", _AXES], [target]),
    ]


def ops(spec: Spec) -> str:
    """The graph's ops in order, Constants left out (what each result records as ``graph``)."""
    return "+".join(node.op_type for node in spec.nodes if node.op_type != "Constant")
