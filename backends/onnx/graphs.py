"""onnxruntime: one hand-built ONNX graph per case signature (onnx.helper), run by ONNX Runtime.

LayerNormalization-17, RMSNormalization-23, BatchNormalization-15 (inference, and training_mode=1
with the running-statistic outputs), add_rms_norm and add_layer_norm as Add then RMSNormalization or
LayerNormalization (each residual convention spelled with Casts), GroupNormalization-21
(or -18, NORMCONF_ORT_GROUP_NORM_OPSET), and InstanceNormalization (eval with running statistics:
BatchNormalization). PyTorch conventions are translated in the graph, each explained where it is built
and in docs/onnx.md: momentum (ONNX's is 1 - m), the unbiased running variance (ONNX's is biased),
Gemma's offset, absent weight or bias, GroupNormalization-18's per-group affine, InstanceNorm's running
statistics (no ONNX op keeps them).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from backends.common import ort_support as _ort
from backends.common.translate import offset_scale, old_value_momentum
from conformance.adapter.backend import FEATURES, BackendUnavailable, Capabilities, Inputs, Prepared
from conformance.model.case import (
    ADD_LAYER_NORM,
    ADD_OPS,
    ADD_RMS_NORM,
    BATCH_NORM,
    CHANNEL_OPS,
    GROUP_NORM,
    INSTANCE_NORM,
    LAYER_NORM,
    RMS_NORM,
    Case,
)
from conformance.model.dtypes import numpy_dtype, stats_dtype

OPSETS = {
    LAYER_NORM: 17,
    RMS_NORM: 23,
    ADD_RMS_NORM: 23,
    ADD_LAYER_NORM: 17,
    BATCH_NORM: 15,
    GROUP_NORM: 21,
    INSTANCE_NORM: 22,
}
# GroupNormalization-21 takes PyTorch's per-channel scale and bias; -18 (deprecated by ONNX 1.16 for
# that reason) takes one per group and is translated (GroupAffine). The variable picks which one runs.
GROUP_NORM_VARIABLE = "NORMCONF_ORT_GROUP_NORM_OPSET"
GROUP_NORM_OPSETS = (18, 21)
# ORT's CPU LayerNormalization has kernels for stash_type FLOAT only, float64 inputs included (their
# statistics are still accumulated in double: float64 cases pass float64 tolerances); RMSNormalization
# is a function in ORT 1.2x and follows stash_type: DOUBLE keeps float64 statistics in float64.
STASH = {"float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE}
IR_VERSION = 10  # what onnxruntime 1.20+ reads; opset 23 needs IR 10 or later
# How GroupNormalization-18 (scale and bias per group) takes PyTorch's per-channel weight and bias:
# "per_group" where both are constant within each group (G = C, no affine): the group's values, exact;
# "composed" otherwise: scale 1, bias 0, then the per-channel weight and bias as Mul and Add, exact in
# real arithmetic (y = xhat * w + b either way). Every other graph takes them as they are: "per_channel".
GROUP_AFFINES = ("per_channel", "per_group", "composed")


def group_norm_opset() -> int:
    """The GroupNormalization opset the graphs use: NORMCONF_ORT_GROUP_NORM_OPSET, else 21."""
    raw = os.environ.get(GROUP_NORM_VARIABLE, "").strip()
    if not raw:
        return OPSETS["group_norm"]
    if not raw.isdigit() or int(raw) not in GROUP_NORM_OPSETS:
        raise BackendUnavailable(
            f"{GROUP_NORM_VARIABLE}={raw!r} is not allowed; allowed: 18 or 21"
            f" (default {OPSETS['group_norm']})"
        )
    return int(raw)


@dataclass(frozen=True)
class Plan:
    """What a case's graph depends on beyond the case: the dtype the normalization computes in, the
    opset, and how GroupNormalization-18 takes the per-channel affine (GROUP_AFFINES)."""

    compute: str
    opset: int
    affine: str = "per_channel"


@dataclass
class Spec:
    """A graph under construction: nodes, typed inputs/outputs, and what the case feeds into them."""

    case: Case
    plan: Plan
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

    def array(self, name: str, values: np.ndarray, onnx_type: int) -> str:
        """A Constant holding ``values`` as raw bytes (OpenVINO's frontend misreads bfloat16 int32_data)."""
        tensor = helper.make_tensor(name, onnx_type, list(values.shape), values.tobytes(), raw=True)
        self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        return name

    def axes(self, name: str, axes: Sequence[int]) -> str:
        return self.array(name, np.asarray(axes, np.int64), onnx.TensorProto.INT64)

    def cast(self, name: str, source: str, dtype: str, to: str) -> str:
        """``name`` = ``source`` cast from ``dtype`` to ``to`` (no node when they are equal)."""
        if dtype == to:
            return source
        return self.node("Cast", [source], [name], to=_ort.ONNX_TYPES[to])[0]

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.case.op, self.inputs, self.values)
        opset = helper.make_opsetid("", self.plan.opset)
        return helper.make_model(graph, opset_imports=[opset], ir_version=IR_VERSION)


def x_shape(case: Case) -> list[int | str]:
    """x's shape with every dimension the parameters do not fix left symbolic (one session per signature)."""
    if case.op in CHANNEL_OPS:
        return ["n", case.shape[1], *(f"l{i}" for i in range(len(case.shape) - 2))]
    lead = len(case.shape) - case.norm_ndim
    return [*(f"d{i}" for i in range(lead)), *case.param_shape]


def scale_dtype(case: Case, inputs: Inputs) -> str:
    """The dtype the LN/RMS scale is held in: the parameter dtype, or wider where Gemma's 1 + w needs it."""
    if case.weight_offset:
        return str(offset_scale(inputs["weight"], case.weight_offset, case.weight_dtype).dtype)
    return case.weight_dtype


def widest(first: str, second: str) -> str:
    """The narrowest dtype that holds every value of both exactly (float32 for bfloat16 with float16)."""
    if first == second:
        return first
    return "float64" if "float64" in (first, second) else "float32"


def sum_dtype(case: Case) -> str:
    """The dtype the add ops' Add runs in: one that holds x and residual exactly (the activation dtype,
    or float32 for a float32 stream), widened to float32 (float64 for float64) for the exact convention:
    the sum a fused kernel keeps in registers."""
    holds_both = widest(case.dtype, case.stream_dtype)
    return holds_both if case.norm_input == "rounded" else widest(holds_both, stats_dtype(case.dtype))


def norm_source_dtype(case: Case) -> str:
    """The dtype of what the normalization node reads: x; for the add ops the sum as stored in the
    stream's dtype (rounded), or the sum itself (exact)."""
    if case.op not in ADD_OPS:
        return case.dtype
    return case.stream_dtype if case.norm_input == "rounded" else sum_dtype(case)


def _normalize(spec: Spec, op: str, compute: str, inputs: list[str], **attrs: Any) -> None:
    """``op`` in ``compute`` dtype, between Casts from what it reads and to the activation dtype; its
    result is y.

    A parameter dtype other than x's (mixed precision, or Gemma's widened 1 + w) is expressed as
    ONNX expresses it: LayerNormalization-17, GroupNormalization and InstanceNormalization bind X,
    scale and bias to one type, and ORT's RMSNormalization-23 binds X and scale together, so the
    normalization runs in the parameters' dtype and y is rounded once to the activation dtype, as
    torch's mixed kernels do. The add ops' norm reads the sum, in ``norm_source_dtype``.
    """
    case = spec.case
    source = spec.cast("x_wide", inputs[0], norm_source_dtype(case), compute)
    result = "y" if compute == case.dtype else "y_wide"
    spec.node(op, [source, *inputs[1:]], [result], **attrs)
    spec.cast("y", result, compute, case.dtype)
    spec.output("y", "y", case.dtype, x_shape(case))


def _row_norm(spec: Spec, op: str, compute: str, inputs: list[str]) -> None:
    """The normalization of a row op over the trailing ``norm_ndim`` dims (see ``_normalize``)."""
    case = spec.case
    stash = STASH["float32"] if op == "LayerNormalization" else STASH[stats_dtype(compute)]
    _normalize(spec, op, compute, inputs, axis=-case.norm_ndim, epsilon=case.eps, stash_type=stash)


def residual_add(spec: Spec) -> str:
    """The add ops' residual stream: h = x + residual in ``sum_dtype``, residual_out = h in the stream's
    dtype; the name of what the norm reads (``norm_source_dtype``).

    - default: residual and residual_out in the activation dtype; the Add's result is residual_out and
      the norm's input (rounded once, read as stored);
    - residual_dtype float32: residual arrives in float32, x is Cast to float32 (exact), the Add's
      float32 result is residual_out and the norm's input;
    - norm_input exact: x (and a half residual) Cast to float32, the Add's float32 sum is what the
      norm reads, residual_out a Cast of it to the stream's dtype (the one rounding the stored copy has).
    """
    case, shape = spec.case, x_shape(spec.case)
    total, stream = sum_dtype(case), case.stream_dtype
    x = spec.cast("x_sum", spec.input("x", case.dtype, shape), case.dtype, total)
    residual = spec.cast("residual_sum", spec.input("residual", stream, shape), stream, total)
    h = spec.node("Add", [x, residual], ["residual_out" if total == stream else "sum"])[0]
    stored = spec.cast("residual_out", h, total, stream)
    spec.output("residual_out", stored, stream, shape)
    return stored if case.norm_input == "rounded" else h


def layer_norm(spec: Spec, compute: str, backend: OnnxRuntime) -> None:
    case = spec.case
    x = residual_add(spec) if case.op in ADD_OPS else spec.input("x", case.dtype, x_shape(case))
    # LayerNormalization requires Scale: a case without weight gets ones (exact); B is optional.
    inputs = [x, spec.input("weight", compute, list(case.param_shape))]
    if case.bias:
        inputs.append(spec.input("bias", compute, list(case.param_shape)))
    _row_norm(spec, "LayerNormalization", compute, inputs)


def rms_norm(spec: Spec, compute: str, backend: OnnxRuntime) -> None:
    case = spec.case
    x = residual_add(spec) if case.op in ADD_OPS else spec.input("x", case.dtype, x_shape(case))
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


def group_norm(spec: Spec, compute: str, backend: OnnxRuntime) -> None:
    """GroupNormalization: -21 with the per-channel weight and bias (ones and zeros where absent,
    exact) and statistics in ``backend.stash_type``; -18 with them per group, or composed."""
    case, plan = spec.case, spec.plan
    x = spec.input("x", case.dtype, x_shape(case))
    shape = [case.groups] if plan.affine == "per_group" else [case.shape[1]]
    weight, bias = (spec.input(name, compute, shape) for name in ("weight", "bias"))
    attrs: dict[str, Any] = {"num_groups": case.groups, "epsilon": case.eps}
    if plan.opset >= 21:
        attrs["stash_type"] = backend.stash_type(compute)
    if plan.affine == "composed":
        _composed_group_norm(spec, [x, weight, bias], attrs)
    else:
        _normalize(spec, "GroupNormalization", compute, [x, weight, bias], **attrs)


def _composed_group_norm(spec: Spec, inputs: list[str], attrs: dict[str, Any]) -> None:
    """GroupNormalization-18 with scale 1 and bias 0 per group (exact: xhat * 1 + 0 = xhat), then the
    per-channel weight and bias as Mul and Add, all in the parameters' dtype as the op itself runs."""
    case, compute = spec.case, spec.plan.compute
    x, weight, bias = inputs
    ones, zeros = (np.full(case.groups, value, numpy_dtype(compute)) for value in (1.0, 0.0))
    scale = spec.array("group_ones", ones, _ort.ONNX_TYPES[compute])
    shift = spec.array("group_zeros", zeros, _ort.ONNX_TYPES[compute])
    source = spec.cast("x_wide", x, case.dtype, compute)
    normalized = spec.node("GroupNormalization", [source, scale, shift], ["normalized"], **attrs)[0]
    spatial = len(case.shape) - 2
    if spatial:
        # (C,) -> (C, 1, ...): per channel against (N, C, spatial...).
        channel = spec.axes("channel_axes", range(1, spatial + 1))
        weight = spec.node("Unsqueeze", [weight, channel], ["weight_channels"])[0]
        bias = spec.node("Unsqueeze", [bias, channel], ["bias_channels"])[0]
    scaled = spec.node("Mul", [normalized, weight], ["scaled"])[0]
    result = "y" if compute == case.dtype else "y_wide"
    spec.node("Add", [scaled, bias], [result])
    spec.cast("y", result, compute, case.dtype)
    spec.output("y", "y", case.dtype, x_shape(case))


def instance_norm(spec: Spec, compute: str, backend: OnnxRuntime) -> None:
    """InstanceNormalization (scale and B required: ones and zeros where absent, exact); eval with
    running statistics is BatchNormalization's inference formula, (x - mean) / sqrt(var + eps) * w + b."""
    case = spec.case
    if not case.uses_batch_stats:
        batch_norm(spec, compute, backend)
        return
    x = spec.input("x", case.dtype, x_shape(case))
    weight, bias = (spec.input(name, compute, [case.shape[1]]) for name in ("weight", "bias"))
    _normalize(spec, "InstanceNormalization", compute, [x, weight, bias], epsilon=case.eps)
    if case.training:
        _instance_running_statistics(spec)


def _instance_running_statistics(spec: Spec) -> None:
    """PyTorch's InstanceNorm running update, which no ONNX op keeps: the batch averages of the instance
    means and of the unbiased instance variances, blended as (1 - m) * running + m * batch.

    Composed of ReduceMean/ReduceSum in the statistics dtype (two-pass variance), rounded once to the
    parameter dtype. Momentum None (the cumulative average) is 1 on the first step: exact for one step.
    """
    case, p = spec.case, spec.case.weight_dtype
    s = stats_dtype(p)
    channels = [case.shape[1]]
    spatial = spec.axes("spatial_axes", range(2, len(case.shape)))
    xs = spec.cast("x_stats", "x", case.dtype, s)
    mean = spec.node("ReduceMean", [xs, spatial], ["instance_mean"], keepdims=1)[0]
    deviation = spec.node("Sub", [xs, mean], ["deviation"])[0]
    squares = spec.node("Mul", [deviation, deviation], ["squares"])[0]
    total = spec.node("ReduceSum", [squares, spatial], ["squares_sum"], keepdims=0)[0]
    count = spec.node("ReduceProd", [spec.node("Shape", ["x"], ["spatial_shape"], start=2)[0]], ["count_i"])
    less = spec.node(
        "Sub", [spec.cast("count", count[0], "int64", s), spec.constant("one", 1.0, s)], ["less"]
    )
    variance = spec.node("Div", [total, less[0]], ["instance_var"])[0]  # (N, C), unbiased
    # The instance means keep their singleton spatial axes: averaging over them as well is exact.
    but_channel = spec.axes("batch_axes", [0, *range(2, len(case.shape))])
    m = 1.0 if case.momentum is None else case.momentum
    keep, blend = spec.constant("keep", 1.0 - m, s), spec.constant("blend", m, s)
    batches = {
        "running_mean": spec.node("ReduceMean", [mean, but_channel], ["batch_mean"], keepdims=0)[0],
        "running_var": spec.node(
            "ReduceMean", [variance, spec.axes("n_axis", [0])], ["batch_var"], keepdims=0
        )[0],
    }
    for name, batch in batches.items():
        prior = spec.cast(f"{name}_s", spec.input(name, p, channels), p, s)
        old = spec.node("Mul", [prior, keep], [f"{name}_kept"])[0]
        new = spec.node(
            "Add", [old, spec.node("Mul", [batch, blend], [f"{name}_blended"])[0]], [f"{name}_new"]
        )
        spec.output(name, spec.cast(f"new_{name}", new[0], s, p), p, channels)


BUILDERS = {
    LAYER_NORM: layer_norm,
    RMS_NORM: rms_norm,
    ADD_RMS_NORM: rms_norm,
    ADD_LAYER_NORM: layer_norm,
    BATCH_NORM: batch_norm,
    GROUP_NORM: group_norm,
    INSTANCE_NORM: instance_norm,
}


def _constant_within_groups(values: np.ndarray, groups: int) -> bool:
    per_group = values.reshape(groups, -1)
    return bool(np.all(per_group == per_group[:, :1]))


def plan(case: Case, inputs: Inputs, backend: OnnxRuntime) -> Plan:
    """The compute dtype, the opset, and for GroupNormalization-18 whether the affine is per group."""
    compute, opset = scale_dtype(case, inputs), backend.opset(case)
    if case.op in ADD_OPS:
        # The norm reads the sum in its own dtype: float32 with bfloat16 parameters runs in float32.
        compute = widest(compute, norm_source_dtype(case))
    if case.op != GROUP_NORM or opset >= 21:
        return Plan(compute, opset)
    fed = feeds(case, inputs, Plan(compute, opset))
    per_group = all(_constant_within_groups(fed[name], case.groups) for name in ("weight", "bias"))
    return Plan(compute, opset, "per_group" if per_group else "composed")


def build(case: Case, plan: Plan, backend: OnnxRuntime) -> Spec:
    """The graph of ``case`` as ``plan`` says."""
    spec = Spec(case, plan)
    BUILDERS[case.op](spec, plan.compute, backend)
    return spec


def feeds(case: Case, inputs: Inputs, plan: Plan) -> dict[str, np.ndarray]:
    """Graph inputs from the case's inputs, with the translations for parameters ONNX requires."""
    fed = {name: inputs[name] for name in ("x", "residual", "running_mean", "running_var") if name in inputs}
    dtype = numpy_dtype(plan.compute if case.op != BATCH_NORM else case.weight_dtype)
    ones, zeros = np.ones(case.param_shape, dtype), np.zeros(case.param_shape, dtype)
    if case.weight_offset:
        fed["weight"] = offset_scale(inputs["weight"], case.weight_offset, case.weight_dtype)
    else:
        fed["weight"] = inputs["weight"] if case.weight else ones
    if case.bias:
        fed["bias"] = inputs["bias"]
    elif case.op in CHANNEL_OPS:
        fed["bias"] = zeros
    if case.op in ADD_OPS:
        # Parameters narrower than the sum the norm reads are widened to it: exact.
        for name in ("weight", "bias"):
            if name in fed:
                fed[name] = np.ascontiguousarray(fed[name].astype(dtype))
    if case.op == BATCH_NORM and case.training:
        fed["prior_running_var"] = inputs["running_var"]
    if plan.affine == "per_group":
        # Constant within each group (plan() checked): the first channel's value is the group's.
        for name in ("weight", "bias"):
            fed[name] = np.ascontiguousarray(fed[name].reshape(case.groups, -1)[:, 0])
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
        opsets = {**OPSETS, GROUP_NORM: self.gn_opset()}
        # ONNX tensors have no memory format: a channels_last case would run the contiguous graph.
        features = frozenset(FEATURES) - {"backward", "channels_last"}
        notes = {
            "opsets": ", ".join(f"{op} {v}" for op, v in opsets.items()),
            GROUP_NORM: f"GroupNormalization-{opsets['group_norm']} ({GROUP_NORM_VARIABLE}: 21, the"
            " default, or 18, whose per-group scale and bias take PyTorch's per-channel affine per group"
            " where it is constant within each group, else composed as scale 1, bias 0, then Mul and Add)",
            INSTANCE_NORM: "InstanceNormalization; eval with running statistics as BatchNormalization;"
            " the training update of the running statistics composed of ReduceMean/ReduceSum",
            "channels_last": "not declared: ONNX tensors have no memory format",
            "add_ops": "Add then RMSNormalization-23 / LayerNormalization-17; residual_dtype float32 as a"
            " float32 residual input with x Cast to float32, exact_sum as the Add of x and residual Cast to"
            " float32 with residual_out a Cast of the sum (the norm reads the float32 sum)",
        }
        return _ort.capabilities(features, notes, ops=frozenset(OPSETS))

    def gn_opset(self) -> int:
        """GroupNormalization's opset: NORMCONF_ORT_GROUP_NORM_OPSET, else 21."""
        return group_norm_opset()

    def opset(self, case: Case) -> int:
        """The opset of ``case``'s graph (GroupNormalization's from ``gn_opset``)."""
        return self.gn_opset() if case.op == GROUP_NORM else OPSETS[case.op]

    def onnx_momentum(self, case: Case) -> float:
        """The BatchNormalization momentum attribute: ONNX keeps ``momentum`` of the old running value,
        PyTorch blends in ``m`` of the new one, so it is 1 - m (None, the cumulative average, is
        1 / num_batches_tracked = 1 on the first step, hence 0)."""
        return old_value_momentum(1.0 if case.momentum is None else case.momentum)

    def stash_type(self, compute: str) -> int:
        """GroupNormalization-21's stash_type, the precision of its statistics: PyTorch's, float32 (as
        ONNX's default), float64 for float64 parameters (float32 there would be a deviation of its own)."""
        return STASH[stats_dtype(compute)]

    def plan(self, case: Case, inputs: Inputs) -> Plan:
        """What ``case``'s graph depends on beyond the case (module-level ``plan``)."""
        return plan(case, inputs, self)

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        chosen = self.plan(case, inputs)
        # What the graph depends on; leading dimensions and parameter values are run-time inputs.
        key: tuple[object, ...] = (case.op, case.dtype, case.weight_dtype, chosen, tuple(x_shape(case)))
        key += (case.norm_ndim, case.bias, case.eps, case.training, case.momentum)
        key += (case.num_groups, case.track_running_stats, case.residual_dtype, case.norm_input)
        built, hit = self._cache.get(key, lambda: self._build(case, chosen))
        assert isinstance(built, Built), "the cache holds Built entries"
        dtypes = _ort.output_dtypes(built.session)
        bound = tuple(
            _ort.Bound(name, graph, _shape(case, name), dtypes[graph])
            for name, graph in built.outputs.items()
        )
        return _ort.ReportedOrtPrepared(
            built.session, feeds(case, inputs, chosen), bound, {**built.info, "cached": hit}
        )

    def _build(self, case: Case, chosen: Plan) -> Built:
        spec = build(case, chosen, self)
        model = spec.model()
        checked = check(spec, model)
        ops = "+".join(dict.fromkeys(node.op_type for node in spec.nodes if node.op_type in _NAMED))
        sess = _ort.session(
            model, f"{ops} (opset {chosen.opset}) with x {case.dtype}, parameters {chosen.compute}"
        )
        info: dict[str, str | int | float | bool] = {**_ort.session_info(sess), "opset": chosen.opset}
        info["graph"] = "+".join(node.op_type for node in spec.nodes if node.op_type != "Constant")
        info |= graph_info(spec, self) | checked
        return Built(sess, dict(spec.outputs), info)


def check(spec: Spec, model: onnx.ModelProto) -> dict[str, str]:
    """ONNX's checker on ``model``, which rejects GroupNormalization-18 as deprecated (onnx 1.16+) though
    runtimes still run it: that graph is checked for shapes only, and its results say so."""
    if spec.case.op == GROUP_NORM and spec.plan.opset < 21:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        return {
            "onnx_checker": "shape inference only: the checker rejects GroupNormalization-18 (deprecated)"
        }
    onnx.checker.check_model(model, full_check=True)
    return {}


def graph_info(spec: Spec, backend: OnnxRuntime) -> dict[str, str | int | float | bool]:
    """What results record of a graph's translations: momentum, stash_type, the GroupNorm affine, how ORT
    runs the normalization op (its own kernel, or the ONNX function body expanded into primitive ops)."""
    case, plan = spec.case, spec.plan
    info: dict[str, str | int | float | bool] = {}
    if case.op == BATCH_NORM or (case.op == INSTANCE_NORM and not case.uses_batch_stats):
        info["onnx_momentum"] = backend.onnx_momentum(case)
    norm = {GROUP_NORM: "GroupNormalization", "instance_norm": "InstanceNormalization"}.get(case.op)
    if case.op == INSTANCE_NORM and not case.uses_batch_stats:
        norm = "BatchNormalization"
    if norm is not None:
        info["ort_kernel"] = _ort.kernel_or_function(norm, plan.opset, plan.compute)
    if case.op == GROUP_NORM:
        info["group_affine"] = plan.affine
        node = next(n for n in spec.nodes if n.op_type == "GroupNormalization")
        stash = [helper.get_attribute_value(a) for a in node.attribute if a.name == "stash_type"]
        if stash:
            info["stash_type"] = onnx.helper.tensor_dtype_to_np_dtype(int(stash[0])).name
    if case.op in ADD_OPS:
        # Which residual convention the graph spells: the dtype of the Add, and what the norm reads.
        info["sum_dtype"] = sum_dtype(case)
        info["norm_reads"] = f"the {case.norm_input} sum ({norm_source_dtype(case)})"
    if case.op == INSTANCE_NORM and case.training:
        info["running_update"] = "ReduceMean/ReduceSum composition (no ONNX op keeps InstanceNorm's)"
        info["momentum"] = 1.0 if case.momentum is None else case.momentum
    return info


_NAMED = frozenset(
    {
        "LayerNormalization",
        "RMSNormalization",
        "BatchNormalization",
        "GroupNormalization",
        "InstanceNormalization",
        "Add",
        "Cast",
    }
)


def _shape(case: Case, output: str) -> tuple[int, ...]:
    return case.shape if output in ("y", "residual_out") else case.param_shape


class OnnxRuntimeGN18(OnnxRuntime):
    """GroupNormalization-18 (scale and bias per group, PyTorch's per-channel affine translated as in
    GROUP_AFFINES), so both opsets' graphs run side by side; only group_norm, whose graph is the one
    that differs between opsets."""

    name = "onnxruntime-gn18"

    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities(), ops=frozenset({"group_norm"}))

    def gn_opset(self) -> int:
        return 18
