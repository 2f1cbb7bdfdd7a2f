"""onnxruntime: one hand-built ONNX graph per case signature (onnx.helper), run by ONNX Runtime.

LayerNormalization-17, RMSNormalization-23, BatchNormalization-15 (inference, and training_mode=1
with the running-statistic outputs), add_rms_norm as Add then RMSNormalization. PyTorch conventions
are translated in the graph, each explained where it is built and in docs/onnx.md: momentum (ONNX's
is 1 - m), the unbiased running variance (ONNX's is biased), Gemma's offset, absent weight or bias.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from backends import _ort
from backends._translate import offset_scale, old_value_momentum
from conformance.adapter.backend import FEATURES, Capabilities, Inputs, Prepared
from conformance.model.case import Case
from conformance.model.dtypes import numpy_dtype, stats_dtype

OPSETS = {"layer_norm": 17, "rms_norm": 23, "add_rms_norm": 23, "batch_norm": 15}
# ORT's CPU LayerNormalization has kernels for stash_type FLOAT only, float64 inputs included (their
# statistics are still accumulated in double: float64 cases pass float64 tolerances); RMSNormalization
# is a function in ORT 1.2x and follows stash_type: DOUBLE keeps float64 statistics in float64.
STASH = {"float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE}
IR_VERSION = 10  # what onnxruntime 1.20+ reads; opset 23 needs IR 10 or later


@dataclass
class Spec:
    """A graph under construction: nodes, typed inputs/outputs, and what the case feeds into them."""

    case: Case
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)  # contract output -> graph output name
    values: list[onnx.ValueInfoProto] = field(default_factory=list)

    def input(self, name: str, dtype: str, shape: Sequence[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, _ort.ONNX_TYPES[dtype], shape))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> list[str]:
        self.nodes.append(helper.make_node(op, inputs, outputs, **attrs))
        return outputs

    def output(self, contract: str, graph_name: str, dtype: str, shape: Sequence[int | str]) -> None:
        self.values.append(helper.make_tensor_value_info(graph_name, _ort.ONNX_TYPES[dtype], shape))
        self.outputs[contract] = graph_name

    def constant(self, name: str, value: float, dtype: str) -> str:
        array = np.asarray([value], dtype=numpy_dtype(dtype))
        tensor = helper.make_tensor(name, _ort.ONNX_TYPES[dtype], [1], array.astype(np.float64).tolist())
        self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        return name

    def cast(self, name: str, source: str, dtype: str, to: str) -> str:
        """``name`` = ``source`` cast from ``dtype`` to ``to`` (no node when they are equal)."""
        if dtype == to:
            return source
        return self.node("Cast", [source], [name], to=_ort.ONNX_TYPES[to])[0]

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.case.op, self.inputs, self.values)
        opset = helper.make_opsetid("", OPSETS[self.case.op])
        return helper.make_model(graph, opset_imports=[opset], ir_version=IR_VERSION)


def x_shape(case: Case) -> list[int | str]:
    """x's shape with every dimension the parameters do not fix left symbolic (one session per signature)."""
    if case.op == "batch_norm":
        return ["n", case.shape[1], *(f"l{i}" for i in range(len(case.shape) - 2))]
    lead = len(case.shape) - case.norm_ndim
    return [*(f"d{i}" for i in range(lead)), *case.param_shape]


def scale_dtype(case: Case, inputs: Inputs) -> str:
    """The dtype the LN/RMS scale is held in: the parameter dtype, or wider where Gemma's 1 + w needs it."""
    if case.weight_offset:
        return str(offset_scale(inputs["weight"], case.weight_offset, case.weight_dtype).dtype)
    return case.weight_dtype


def _row_norm(spec: Spec, op: str, compute: str, inputs: list[str]) -> None:
    """The normalization of a row op in ``compute`` dtype, between Casts from and to the activation dtype.

    A parameter dtype other than x's (mixed precision, or Gemma's widened 1 + w) is expressed as
    ONNX expresses it: LayerNormalization-17 binds X, Scale and B to one type, and ORT's
    RMSNormalization-23 function body binds X and scale together, so the normalization runs in the
    parameters' dtype and y is rounded once to the activation dtype, as torch's mixed kernels do.
    """
    case = spec.case
    source = spec.cast("x_wide", inputs[0], case.dtype, compute)
    result = "y" if compute == case.dtype else "y_wide"
    stash = STASH["float32"] if op == "LayerNormalization" else STASH[stats_dtype(compute)]
    spec.node(op, [source, *inputs[1:]], [result], axis=-case.norm_ndim, epsilon=case.eps, stash_type=stash)
    spec.cast("y", result, compute, case.dtype)
    spec.output("y", "y", case.dtype, x_shape(case))


def layer_norm(spec: Spec, compute: str, backend: OnnxRuntime) -> None:
    case = spec.case
    x = spec.input("x", case.dtype, x_shape(case))
    # LayerNormalization requires Scale: a case without weight gets ones (exact); B is optional.
    inputs = [x, spec.input("weight", compute, list(case.param_shape))]
    if case.bias:
        inputs.append(spec.input("bias", compute, list(case.param_shape)))
    _row_norm(spec, "LayerNormalization", compute, inputs)


def rms_norm(spec: Spec, compute: str, backend: OnnxRuntime) -> None:
    case = spec.case
    x = spec.input("x", case.dtype, x_shape(case))
    if case.op == "add_rms_norm":
        # The residual stream: x + residual in the activation dtype, kept as residual_out.
        residual = spec.input("residual", case.dtype, x_shape(case))
        x = spec.node("Add", [x, residual], ["residual_out"])[0]
        spec.output("residual_out", x, case.dtype, x_shape(case))
    # RMSNormalization requires scale: ones without weight; Gemma's 1 + w is fed pre-added (exactly).
    _row_norm(spec, "RMSNormalization", compute, [x, spec.input("weight", compute, list(case.param_shape))])


def batch_norm(spec: Spec, compute: str, backend: OnnxRuntime) -> None:
    case, p = spec.case, spec.case.weight_dtype
    channels = [case.shape[1]]
    # BatchNormalization requires scale and B: ones and zeros stand in for absent ones (exact).
    names = ["x", "weight", "bias", "running_mean", "running_var"]
    x, weight, bias, mean, var = (
        spec.input(name, case.dtype if name == "x" else p, x_shape(case) if name == "x" else channels)
        for name in names
    )
    momentum = backend.onnx_momentum(case)
    if not case.training:
        spec.node(
            "BatchNormalization", [x, weight, bias, mean, var], ["y"], epsilon=case.eps, momentum=momentum
        )
        spec.output("y", "y", case.dtype, x_shape(case))
        return
    spec.node(
        "BatchNormalization",
        [x, weight, bias, mean, var],
        ["y", "new_running_mean", "onnx_running_var"],
        epsilon=case.eps,
        momentum=momentum,
        training_mode=1,
    )
    spec.output("y", "y", case.dtype, x_shape(case))
    spec.output("running_mean", "new_running_mean", p, channels)
    # A graph output of its own (ORT allocates it per run): as an intermediate, ORT's kernel writes it
    # into the input_var buffer it aliases (KernelDef Alias(4, 2)) and repeated runs drift (observed).
    spec.values.append(helper.make_tensor_value_info("onnx_running_var", _ort.ONNX_TYPES[p], channels))
    _unbiased_running_var(spec, backend, spec.input("prior_running_var", p, channels), "onnx_running_var")


def _unbiased_running_var(spec: Spec, backend: OnnxRuntime, prior: str, onnx_var: str) -> None:
    """PyTorch's running_var from ONNX's, which blends in the biased batch variance.

    ONNX gives r = k v + (1 - k) b (b biased, k the momentum attribute, 1 - m); PyTorch wants
    k v + (1 - k) c b with c = count / (count - 1), count = elements per channel (read from x's shape at
    run time). Since (1 - k) b = r - k v, that is c r - k v / (count - 1): formed in the statistics
    dtype, rounded once to the parameter dtype.
    ``prior`` is v fed a second time, so no other node reads the input_var that ORT's kernel aliases.
    """
    case, p = spec.case, spec.case.weight_dtype
    s = stats_dtype(p)
    size = spec.node("Size", ["x"], ["size"])[0]
    per_channel = spec.node("Div", [size, spec.node("Shape", ["x"], ["c"], start=1, end=2)[0]], ["count_i"])
    count = spec.node("Cast", per_channel, ["count"], to=_ort.ONNX_TYPES[s])[0]
    less = spec.node("Sub", [count, spec.constant("one", 1.0, s)], ["count_m1"])[0]
    bessel = spec.node("Div", [count, less], ["bessel"])[0]
    # The weight ONNX gave v: the momentum attribute as stored, a 32-bit float.
    kept = float(np.float32(backend.onnx_momentum(case)))
    old = spec.node("Div", [spec.constant("keep", kept, s), less], ["old_weight"])[0]
    scaled = spec.node("Mul", [spec.cast("onnx_var_s", onnx_var, p, s), bessel], ["scaled"])[0]
    removed = spec.node("Mul", [spec.cast("prior_s", prior, p, s), old], ["removed"])[0]
    total = spec.node("Sub", [scaled, removed], ["new_var_s"])[0]
    spec.output("running_var", spec.cast("new_running_var", total, s, p), p, [case.shape[1]])


BUILDERS = {
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "add_rms_norm": rms_norm,
    "batch_norm": batch_norm,
}


def build(case: Case, compute: str, backend: OnnxRuntime) -> Spec:
    """The graph of ``case`` with LN/RMS parameters in ``compute`` dtype."""
    spec = Spec(case)
    BUILDERS[case.op](spec, compute, backend)
    return spec


def feeds(case: Case, inputs: Inputs, compute: str) -> dict[str, np.ndarray]:
    """Graph inputs from the case's inputs, with the translations for parameters ONNX requires."""
    fed = {name: inputs[name] for name in ("x", "residual", "running_mean", "running_var") if name in inputs}
    dtype = numpy_dtype(compute if case.op != "batch_norm" else case.weight_dtype)
    ones, zeros = np.ones(case.param_shape, dtype), np.zeros(case.param_shape, dtype)
    if case.weight_offset:
        fed["weight"] = offset_scale(inputs["weight"], case.weight_offset, case.weight_dtype)
    else:
        fed["weight"] = inputs["weight"] if case.weight else ones
    if case.bias:
        fed["bias"] = inputs["bias"]
    elif case.op == "batch_norm":
        fed["bias"] = zeros
    if case.training:
        fed["prior_running_var"] = inputs["running_var"]
    return fed


@dataclass(frozen=True)
class Built:
    """A cached session and what its results record."""

    session: object
    outputs: Mapping[str, str]
    info: Mapping[str, str | int | float | bool]


class OnnxRuntime:
    """Hand-built single-op ONNX graphs run by ONNX Runtime; forward only."""

    name = "onnxruntime"

    def __init__(self) -> None:
        self._cache = _ort.Cache()

    def capabilities(self) -> Capabilities:
        features = frozenset(FEATURES) - {"backward"}
        return _ort.capabilities(features, {"opsets": ", ".join(f"{op} {v}" for op, v in OPSETS.items())})

    def onnx_momentum(self, case: Case) -> float:
        """The BatchNormalization momentum attribute: ONNX keeps ``momentum`` of the old running value,
        PyTorch blends in ``m`` of the new one, so it is 1 - m (None, the cumulative average, is
        1 / num_batches_tracked = 1 on the first step, hence 0)."""
        return old_value_momentum(1.0 if case.momentum is None else case.momentum)

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        compute = scale_dtype(case, inputs)
        # What the graph depends on; leading dimensions and parameter values are run-time inputs.
        key: tuple[object, ...] = (case.op, case.dtype, case.weight_dtype, compute, tuple(x_shape(case)))
        key += (case.norm_ndim, case.bias, case.eps, case.training, case.momentum)
        built, hit = self._cache.get(key, lambda: self._build(case, compute))
        assert isinstance(built, Built), "the cache holds Built entries"
        dtypes = _ort.output_dtypes(built.session)
        bound = tuple(
            _ort.Bound(name, graph, _shape(case, name), dtypes[graph])
            for name, graph in built.outputs.items()
        )
        return _ort.OrtPrepared(
            built.session, feeds(case, inputs, compute), bound, {**built.info, "cached": hit}
        )

    def _build(self, case: Case, compute: str) -> Built:
        spec = build(case, compute, self)
        model = spec.model()
        onnx.checker.check_model(model, full_check=True)
        ops = "+".join(dict.fromkeys(node.op_type for node in spec.nodes if node.op_type in _NAMED))
        sess = _ort.session(
            model, f"{ops} (opset {OPSETS[case.op]}) with x {case.dtype}, parameters {compute}"
        )
        info: dict[str, str | int | float | bool] = {**_ort.session_info(sess), "opset": OPSETS[case.op]}
        info["graph"] = "+".join(node.op_type for node in spec.nodes if node.op_type != "Constant")
        if case.op == "batch_norm":
            info["onnx_momentum"] = self.onnx_momentum(case)
        return Built(sess, dict(spec.outputs), info)


_NAMED = frozenset({"LayerNormalization", "RMSNormalization", "BatchNormalization", "Add", "Cast"})


def _shape(case: Case, output: str) -> tuple[int, ...]:
    return case.shape if output in ("y", "residual_out") else case.param_shape
