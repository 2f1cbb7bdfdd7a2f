"""onnxruntime-contrib: ONNX Runtime's fused residual kernels, one com.microsoft node per graph.

``SkipLayerNormalization`` (add_layer_norm) and ``SkipSimplifiedLayerNormalization`` (add_rms_norm) are
the ops ORT's transformer optimizer (onnxruntime.transformers) fuses Add + LayerNormalization and Add +
SimplifiedLayerNormalization into, so exported transformer models run these kernels, not the standard
graphs of backends/onnx/graphs.py. The contrib op spec (ORT docs/ContribOperators.md, and the schema ORT
registers): inputs (input, skip, gamma, beta, bias), outputs (output, mean, inv_std_var,
input_skip_bias_sum), attribute epsilon (a 32-bit float); the norm is over the last axis; type T binds
input, skip, gamma, beta, bias, output and input_skip_bias_sum to one type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from backends.common import ort_support as _ort
from backends.common.translate import offset_scale
from backends.onnx.graphs import IR_VERSION
from conformance.adapter.backend import FEATURES, Capabilities, Inputs, Outputs, Prepared, Unsupported
from conformance.model.case import ADD_LAYER_NORM, Case
from conformance.model.dtypes import numpy_dtype, round_to

DOMAIN = "com.microsoft"
DOMAIN_OPSET = 1
ONNX_OPSET = 17  # the default domain's opset import; the graph holds no default-domain node
OPS = {ADD_LAYER_NORM: "SkipLayerNormalization", "add_rms_norm": "SkipSimplifiedLayerNormalization"}
# The schema's T: the CPU provider also registers double kernels, but a double graph fails ORT's schema
# check at session creation (INVALID_GRAPH: "Type 'tensor(double)' ... is invalid"), so float64 cases
# cannot be built at all (ORT 1.32, measured).
DTYPES = frozenset({"float32", "float16", "bfloat16"})
# Contract name -> the op's formal parameter it is passed as. The graph's inputs and outputs carry the
# contract names; "bias" (a vector added to the sum before the norm) and the statistics outputs (mean,
# inv_std_var) are left empty: the contract has neither.
FORMAL_INPUTS = {"x": "input", "residual": "skip", "weight": "gamma", "bias": "beta"}
FORMAL_OUTPUTS = {"y": "output", "residual_out": "input_skip_bias_sum"}
# Why each left-out feature cannot be expressed by one node whose T binds every tensor to one type.
NOT_DECLARED = {
    "residual_dtype": "not declared: T binds skip (the residual) and input_skip_bias_sum (residual_out) to"
    " input's type, so a float32 stream with half activations needs the float32 kernel between Casts: the"
    " float32 kernel again, not the half kernel a half model fuses into (onnxruntime runs that graph)",
    "param_dtype": "not declared: T binds gamma and beta to input's type; float32 parameters with half"
    " activations would be rounded to the half type (other bits) or run the float32 kernel between Casts",
    "backward": "not declared: ONNX Runtime inference sessions have no autograd",
    "channels_last": "not declared: ONNX tensors have no memory format",
    "float64": "not declared: the schema's T is float, float16, bfloat16 (a double graph is INVALID_GRAPH)",
}
_FEATURES = frozenset(FEATURES) - {"backward", "channels_last", "residual_dtype", "param_dtype"}


def hidden(case: Case) -> int:
    """The kernel's row length: the op normalizes the last axis, so trailing norm_ndim axes are one row."""
    return int(np.prod(case.param_shape))


def model(case: Case) -> onnx.ModelProto:
    """The one-node graph of ``case``: x and residual as (rows, hidden), gamma (and beta) as (hidden,)."""
    t, size = _ort.ONNX_TYPES[case.dtype], hidden(case)
    row: list[str | int | None] = ["rows", size]
    names = ["x", "residual", "weight"] + (["bias"] if case.bias else [])
    inputs = [helper.make_tensor_value_info(n, t, row if n in ("x", "residual") else [size]) for n in names]
    outputs = [helper.make_tensor_value_info(n, t, row) for n in FORMAL_OUTPUTS]
    # Outputs by position: output, mean, inv_std_var (unused: empty names), input_skip_bias_sum.
    node = helper.make_node(
        OPS[case.op], names, ["y", "", "", "residual_out"], domain=DOMAIN, epsilon=case.eps
    )
    graph = helper.make_graph([node], case.op, inputs, outputs)
    opsets = [helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, DOMAIN_OPSET)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def gamma(case: Case, inputs: Inputs) -> np.ndarray:
    """gamma as the kernel takes it: the weight, ones without one (exact), or Gemma's 1 + w.

    SkipSimplifiedLayerNormalization has no offset, and gamma has input's type: 1 + w is fed only where
    that type holds it exactly (checked on the case's weights), since a rounded 1 + w is another model,
    not a translation; elsewhere the case is Unsupported, with how many values would round.
    """
    dtype = numpy_dtype(case.dtype)
    if not case.weight:
        return np.ones(case.param_shape, dtype)
    if not case.weight_offset:
        return np.asarray(inputs["weight"])
    scale = offset_scale(inputs["weight"], case.weight_offset, case.weight_dtype).astype(np.float64)
    held = round_to(scale, case.dtype)
    inexact = int(np.count_nonzero(held.astype(np.float64) != scale))
    if inexact:
        raise Unsupported(
            f"{OPS[case.op]} has no weight offset and gamma has input's type {case.dtype}:"
            f" {case.weight_offset} + weight rounds {inexact} of {scale.size} values to {case.dtype}, so the"
            " scale would not be the case's"
        )
    return held


def feeds(case: Case, inputs: Inputs) -> dict[str, np.ndarray]:
    """Graph inputs by contract name; x and residual viewed as (rows, hidden), parameters flattened."""
    row = hidden(case)
    fed: dict[str, np.ndarray] = {
        name: np.asarray(inputs[name]).reshape(-1, row) for name in ("x", "residual")
    }
    fed["weight"] = gamma(case, inputs).reshape(row)
    if case.bias:
        fed["bias"] = np.asarray(inputs["bias"]).reshape(row)
    return fed


@dataclass(frozen=True)
class Built:
    """A cached session and what its results record."""

    session: object
    info: Mapping[str, str | int | float | bool]


class ContribPrepared:
    """The session with the case's inputs bound as (rows, hidden); outputs come back in the case's shape."""

    def __init__(self, inner: _ort.OrtPrepared, shape: tuple[int, ...]) -> None:
        self._inner, self._shape = inner, shape

    def __call__(self) -> None:
        self._inner()

    def synchronize(self) -> None:
        self._inner.synchronize()

    def outputs(self) -> Outputs:
        return {name: value.reshape(self._shape) for name, value in self._inner.outputs().items()}

    def info(self) -> dict[str, str | int | float | bool]:
        return self._inner.info()

    def buffers(self) -> dict[str, np.ndarray]:
        # The graph's input names are the contract's: the copies ORT reads and the buffers it writes.
        return self._inner.host_buffers()


class OnnxRuntimeContrib:
    """ORT's com.microsoft SkipLayerNormalization / SkipSimplifiedLayerNormalization; forward only."""

    name = "onnxruntime-contrib"

    def __init__(self) -> None:
        self._cache = _ort.Cache()

    def capabilities(self) -> Capabilities:
        notes = {
            "ops": ", ".join(f"{op}: {DOMAIN}.{contrib}-{DOMAIN_OPSET}" for op, contrib in OPS.items()),
            "exact_sum": "declared: for float16 and bfloat16 the CPU kernels form input + skip in float32,"
            " normalize that unrounded sum and round only input_skip_bias_sum to T (measured bit for bit,"
            " tests/backends/onnx/test_onnxruntime_contrib.py); float32 sums in float32. The same graph"
            " serves both"
            " norm_input conventions, so the default (rounded) half cases show where the two differ",
            "weight_offset": "declared where exact: gamma = 1 + w is fed when input's type holds it exactly"
            " (checked per case), else Unsupported (the op has no offset; a rounded 1 + w is another scale)",
            "multi_axis": "the trailing norm_ndim axes are viewed as one row (the op normalizes the last"
            " axis): the same values in the same order",
            **NOT_DECLARED,
        }
        caps = _ort.capabilities(_FEATURES, notes, ops=frozenset(OPS))
        return Capabilities(
            ops=caps.ops,
            dtypes=DTYPES,
            features=caps.features,
            device=caps.device,
            device_name=caps.device_name,
            notes={**caps.notes, "dtypes": NOT_DECLARED["float64"]},
        )

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        fed = feeds(case, inputs)
        key = (case.op, case.dtype, case.bias, case.eps, hidden(case))
        built, hit = self._cache.get(key, lambda: self._build(case))
        assert isinstance(built, Built), "the cache holds Built entries"
        dtypes = _ort.output_dtypes(built.session)
        rows = int(np.prod(case.shape)) // hidden(case)
        bound = tuple(_ort.Bound(name, name, (rows, hidden(case)), dtypes[name]) for name in FORMAL_OUTPUTS)
        inner = _ort.OrtPrepared(built.session, fed, bound, {**built.info, "cached": hit})
        return ContribPrepared(inner, case.shape)

    def _build(self, case: Case) -> Built:
        graph = model(case)
        what = f"{DOMAIN}.{OPS[case.op]} with {case.dtype}"
        sess = _ort.session(graph, what)
        used = [name for name in FORMAL_INPUTS if name in graph.graph.node[0].input]
        info: dict[str, str | int | float | bool] = {**_ort.session_info(sess), "opset": DOMAIN_OPSET}
        info |= {"op": OPS[case.op], "domain": DOMAIN, "graph": OPS[case.op]}
        info["inputs"] = ", ".join(f"{FORMAL_INPUTS[name]}={name}" for name in used)
        info["outputs"] = ", ".join(f"{formal}={name}" for name, formal in FORMAL_OUTPUTS.items())
        return Built(sess, info)
