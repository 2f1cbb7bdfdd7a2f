"""Executable models of known deviations: what a backend is understood to compute, as NumPy.

A model takes the case and its inputs (rounded to their dtypes, ``dy`` included) and returns the
outputs it explains, float64 or rounded. A ledger entry names one by its key in ``MODELS`` or, for a
third party's own, as ``"package.module:function"``. The judge compares a failing output with the
model's under the very tolerance rule that failed it: a model explains, it never widens a tolerance.
Each model is the reference with one convention changed, so it is as small as that change.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from conformance import oracle
from conformance.model import residual
from conformance.model.case import ADD_OPS, BATCH_NORM, GROUP_NORM, LAYER_OPS, Case
from conformance.model.dtypes import numpy_dtype, round_to, stats_dtype, truncating_bfloat16, unit_roundoff
from conformance.model.geometry import Geometry, geometry
from conformance.model.outputs import output_dtype
from conformance.oracle import batch_norm, rms_norm

Arrays = Mapping[str, np.ndarray]
Model = Callable[[Case, Arrays], Arrays]


class ModelError(ValueError):
    """A model name that resolves to nothing callable; the message names it and the choices."""


def _grad(inputs: Arrays) -> bool:
    return "dy" in inputs


def eps_float32(case: Case, inputs: Arrays) -> Arrays:
    """eps rounded to float32 before use: an ONNX ``epsilon`` attribute is a FLOAT, and exporters hold
    a decomposed norm's eps as a float32 constant even in float64 graphs."""
    eps = float(np.float32(case.eps))
    return oracle.evaluate(dataclasses.replace(case, eps=eps), inputs, grad=_grad(inputs))


def eps_dropped(case: Case, inputs: Arrays) -> Arrays:
    """A graph without its eps (onnxscript's optimizer folds x + c to x when |c| <= 1e-8): the reference
    with eps at the smallest positive float64, so rows whose mean square is near or below the given eps
    normalize by it alone. An RMSNorm row of zeros has no mean square at all: the graph's 0 * (1/0) is
    NaN there."""
    tiny = float(np.finfo(np.float64).smallest_subnormal)
    out = dict(oracle.evaluate(dataclasses.replace(case, eps=tiny), inputs, grad=_grad(inputs)))
    if case.op in RMS_OPS:
        geo, _, x = _view(case, inputs)
        zero_rows = np.all(x == 0, axis=geo.group_axes, keepdims=True)
        out["y"] = np.where(np.broadcast_to(zero_rows, x.shape).reshape(case.shape), np.nan, out["y"])
    return out


def momentum_zero(case: Case, inputs: Arrays) -> Arrays:
    """A training step that leaves the running statistics as they were (momentum 0): what
    ``torch.nn.InstanceNorm*d(momentum=None)`` passes to ``F.instance_norm``."""
    if not case.training:
        raise ModelError(f"momentum_zero models a training step; case {case.id} is not one")
    return oracle.evaluate(dataclasses.replace(case, momentum=0.0), inputs, grad=_grad(inputs))


def momentum_float32(case: Case, inputs: Arrays) -> Arrays:
    """ONNX's momentum attribute is a FLOAT holding the weight of the old running value (1 - m):
    the batch statistic is blended in with 1 - float32(1 - m)."""
    if case.momentum is None or not case.training:
        raise ModelError(f"momentum_float32 models a training step with a momentum, not case {case.id}")
    momentum = 1.0 - float(np.float32(1.0 - case.momentum))
    return oracle.evaluate(dataclasses.replace(case, momentum=momentum), inputs, grad=_grad(inputs))


def narrowed(case: Case, inputs: Arrays, dtype: str) -> tuple[Case, Arrays]:
    """The case as a backend that executes it in ``dtype`` sees it: every dtype of the case wider than
    ``dtype`` narrowed to it and every input rounded there (float64 values of the narrower type)."""
    unit = unit_roundoff(dtype)

    def narrow(name: str | None) -> str | None:
        return dtype if name is not None and unit_roundoff(name) < unit else name

    params = case.param_dtype or case.dtype
    narrowed_case = dataclasses.replace(
        case,
        dtype=narrow(case.dtype) or case.dtype,
        param_dtype=narrow(params) if case.param_dtype is not None else None,
        residual_dtype=narrow(case.residual_dtype),
    )
    with np.errstate(over="ignore"):  # values beyond the narrower range round to inf, as the backend's do
        rounded = {
            name: round_to(np.asarray(values, dtype=np.float64), dtype).astype(np.float64)
            for name, values in inputs.items()
        }
    return narrowed_case, rounded


@dataclass(frozen=True)
class Narrowed:
    """A backend that executes a wider case in ``dtype`` (Keras and Hugging Face classes compute float64
    in float32; OpenVINO's bf16 precision hint runs float32 graphs in bfloat16): the reference of the
    narrowed case. Its answer is judged under the tolerance rule of the dtype it executes in, as a
    backend given that dtype would be: the deviation is the narrowing, nothing more."""

    dtype: str

    def __call__(self, case: Case, inputs: Arrays) -> Arrays:
        narrow_case, narrow_inputs = narrowed(case, inputs, self.dtype)
        return oracle.evaluate(narrow_case, narrow_inputs, grad=_grad(inputs))


def execution(model: Model, case: Case, inputs: Arrays) -> tuple[Case, Arrays]:
    """The case and inputs whose tolerance rule judges ``model``'s answer: narrowed for a ``Narrowed``
    model, the case's own otherwise."""
    if isinstance(model, Narrowed):
        return narrowed(case, inputs, model.dtype)
    return case, inputs


def _centred(case: Case) -> None:
    if case.op not in _CENTRED_OPS or (case.op == BATCH_NORM and not case.training):
        raise ModelError(
            f"the model needs batch statistics of a centred norm ({', '.join(sorted(_CENTRED_OPS))}; "
            f"batch_norm in training), not case {case.id}"
        )


_CENTRED_OPS = frozenset({"layer_norm", "add_layer_norm", "batch_norm", "group_norm", "instance_norm"})
RMS_OPS = frozenset({"rms_norm", "add_rms_norm"})


def _scale(case: Case, f64: Arrays, shape: tuple[int, ...]) -> np.ndarray | float:
    """The effective weight (weight_offset + weight, as the oracle takes it) broadcast to the geometry's
    view; 1.0 without a weight."""
    scale = rms_norm.scale_of(case, f64)
    return 1.0 if scale is None else scale.reshape(shape)


def _with_grads(case: Case, out: dict[str, np.ndarray], dh: np.ndarray, f64: Arrays) -> None:
    """dx (and, for the add ops, dresidual: both dL/dh) from the norm's gradient ``dh``."""
    if case.op in ADD_OPS:
        dh = dh + f64["dresidual_out"]
        out["dresidual"] = dh.copy()
    out["dx"] = dh


def _view(case: Case, inputs: Arrays) -> tuple[Geometry, dict[str, np.ndarray], np.ndarray]:
    """The geometry, the inputs in float64, and the values the norm reads (x, or the add ops' sum)
    reshaped so that the statistics reduce the geometry's group axes."""
    geo = geometry(case)
    f64 = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    x = residual.normalized(case, f64) if case.op in ADD_OPS else f64["x"]
    return geo, f64, x.reshape(geo.shape)


def _normalized_with(case: Case, inputs: Arrays, mean: np.ndarray, rstd: np.ndarray) -> Arrays:
    """The reference's outputs of a centred norm with y, dx (dresidual) and dweight computed from the
    given per-group mean and rstd instead of the exact ones: the shared tail of the statistics models."""
    geo, f64, x = _view(case, inputs)
    xhat = (x - mean) * rstd
    w = _scale(case, f64, geo.param_shape)
    b = f64["bias"].reshape(geo.param_shape) if case.bias else 0.0
    out = {**oracle.evaluate(case, inputs, grad=_grad(inputs)), "y": (xhat * w + b).reshape(case.shape)}
    if _grad(inputs):
        dy = f64["dy"].reshape(geo.shape)
        g = dy * w
        mg = g.mean(axis=geo.group_axes, keepdims=True)
        mgx = (g * xhat).mean(axis=geo.group_axes, keepdims=True)
        _with_grads(case, out, (rstd * (g - mg - xhat * mgx)).reshape(case.shape), f64)
        if case.weight:
            out["dweight"] = (dy * xhat).sum(axis=geo.reduce_axes).reshape(-1)
    return out


def half_statistics(case: Case, inputs: Arrays) -> Arrays:
    """A centred norm whose per-row (group, channel) mean and rstd are held in the activation dtype
    and read back by the forward's normalization and by the backward: torch's native_layer_norm,
    native_group_norm and native_batch_norm return them as float16/bfloat16 for half inputs (its CPU
    backward reads them so, as does inductor's decomposition; CUDA GroupNorm before torch 2.12 also
    normalizes with them)."""
    _centred(case)
    geo, _, x = _view(case, inputs)
    mean = x.mean(axis=geo.group_axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=geo.group_axes, keepdims=True)
    held_mean = round_to(mean, case.dtype).astype(np.float64)
    held_rstd = round_to(1.0 / np.sqrt(var + case.eps), case.dtype).astype(np.float64)
    return _normalized_with(case, inputs, held_mean, held_rstd)


def variance_path_underflow(case: Case, inputs: Arrays) -> Arrays:
    """A backward that reaches x through the variance along d rsqrt(v) / dv = -rsqrt(v)**3 / 2 (torch's
    rsqrt and RMSNorm backward; JAX's -rsqrt(v) / (2 v)) formed in the statistics' dtype (float32, or
    float64 for float64 inputs): for rows with |x| ~ 5e17 in float32 (1e150 in float64) it underflows to
    0 and dx loses its variance term rstd * xhat * mean(g * xhat), keeping rstd * (g - mean g) (LayerNorm
    family) or rstd * g (RMSNorm). Elsewhere the term is the reference's."""
    if not _grad(inputs):
        raise ModelError(f"variance_path_underflow models a backward; case {case.id} has no dy")
    if case.op == BATCH_NORM and not case.training:
        raise ModelError(f"variance_path_underflow needs batch statistics, not case {case.id}")
    geo, f64, x = _view(case, inputs)
    centred = case.op not in RMS_OPS
    mean = x.mean(axis=geo.group_axes, keepdims=True) if centred else 0.0
    var = ((x - mean) ** 2).mean(axis=geo.group_axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + case.eps)
    stats = numpy_dtype(stats_dtype(case.dtype))
    with np.errstate(under="ignore", over="ignore"):
        lost = rstd.astype(stats) ** 3 == 0
    xhat = (x - mean) * rstd
    g = f64["dy"].reshape(geo.shape) * _scale(case, f64, geo.param_shape)
    term = rstd * xhat * (g * xhat).mean(axis=geo.group_axes, keepdims=True)
    out = oracle.evaluate(case, inputs, grad=True)
    dropped = np.where(lost, term, 0.0).reshape(case.shape)
    out["dx"] = out["dx"] + dropped
    if case.op in ADD_OPS:
        out["dresidual"] = out["dresidual"] + dropped
    return out


def one_pass_variance(case: Case, inputs: Arrays) -> Arrays:
    """A centred norm whose variance is E[x^2] - E[x]^2, both means taken in the statistics' dtype
    (float32; float64 for float64 inputs) and the difference clamped at 0: Flax's use_fast_variance,
    Keras' moments on its torch backend, the ONNX GroupNormalization function body. On offset rows
    the subtraction cancels most digits; on constant rows it leaves a residue beside eps."""
    _centred(case)
    geo, _, x = _view(case, inputs)
    stats = numpy_dtype(stats_dtype(case.dtype))
    xs = x.astype(stats)
    mean = xs.mean(axis=geo.group_axes, keepdims=True, dtype=stats)
    with np.errstate(over="ignore", invalid="ignore"):
        square = (xs * xs).mean(axis=geo.group_axes, keepdims=True, dtype=stats)
        var = np.maximum(square - mean * mean, stats.type(0)).astype(np.float64)
    return _normalized_with(case, inputs, mean.astype(np.float64), 1.0 / np.sqrt(var + case.eps))


def _lane_sums(rows: np.ndarray) -> np.ndarray:
    """Row sums as a 256-bit vector loop computes them: one accumulator of 32 bytes of lanes (eight
    float32, four float64) added to in order, its lanes then folded in halves (4+4, 2+2, 1+1), the
    elements past the last full vector added one by one."""
    width = 32 // rows.dtype.itemsize
    whole = rows.shape[1] // width * width
    lanes = np.zeros((rows.shape[0], width), rows.dtype)
    for start in range(0, whole, width):
        lanes += rows[:, start : start + width]
    while lanes.shape[1] > 1:
        half = lanes.shape[1] // 2
        lanes = lanes[:, :half] + lanes[:, half:]
    total = lanes[:, 0]
    for column in rows[:, whole:].T:
        total = total + column
    return total


def one_pass_unclamped(case: Case, inputs: Arrays) -> Arrays:
    """GroupNorm as ONNX Runtime's CPU provider runs the ONNX GroupNormalization function body: each
    group's mean and mean of squares by ReduceMean in the statistics' dtype (float32; float64 for
    float64 inputs) with 256-bit lanes, Var = E[x^2] - E[x]^2 *not* clamped, sqrt(Var + eps) in that
    dtype. On offset groups the subtraction cancels most digits; on constant groups it leaves a residue
    that is negative for about half of them, and with a tiny eps the square root is NaN."""
    if case.op != GROUP_NORM:
        raise ModelError(f"one_pass_unclamped models GroupNormalization's function body, not case {case.id}")
    geo = geometry(case)
    stats = numpy_dtype(stats_dtype(case.dtype))
    rows = np.asarray(inputs["x"]).astype(stats).reshape(geo.shape[0] * geo.shape[1], -1)
    count = stats.type(rows.shape[1])
    mean = _lane_sums(rows) / count
    var = _lane_sums(rows * rows) / count - mean * mean
    std = np.sqrt(var + stats.type(case.eps))
    shape = geo.stats_shape
    return _normalized_with(
        case, inputs, mean.astype(np.float64).reshape(shape), 1.0 / std.astype(np.float64).reshape(shape)
    )


def truncating_bfloat16_convert(case: Case, inputs: Arrays) -> Arrays:
    """bfloat16 outputs computed in float32 and converted by OpenVINO's CPU plugin's own rounding
    (``dtypes.truncating_bfloat16``): each output is the reference rounded to float32, then converted so."""
    if case.dtype != "bfloat16":
        raise ModelError(f"truncating_bfloat16_convert models bfloat16 outputs, not dtype={case.dtype}")
    out = oracle.evaluate(case, inputs, grad=_grad(inputs))
    return {
        name: truncating_bfloat16(values) if output_dtype(case, name) == "bfloat16" else values
        for name, values in out.items()
    }


def exact_sum(case: Case, inputs: Arrays) -> Arrays:
    """An add op whose norm reads x + residual before its rounding (the sum kept in float32 registers,
    or a runtime that computes the half add in float32 and hands that on) while residual_out is the
    rounded copy."""
    if case.op not in ADD_OPS:
        raise ModelError(f"exact_sum models {', '.join(sorted(ADD_OPS))}, not op={case.op}")
    return oracle.evaluate(dataclasses.replace(case, norm_input="exact"), inputs, grad=_grad(inputs))


def biased_running_var(case: Case, inputs: Arrays) -> Arrays:
    """A BatchNorm training step that blends the biased batch variance (the one it normalizes with)
    into running_var, where PyTorch takes the unbiased one (Keras, Flax)."""
    if case.op != BATCH_NORM or not case.training:
        raise ModelError(f"biased_running_var models a batch_norm training step, not case {case.id}")
    out = dict(oracle.evaluate(case, inputs, grad=_grad(inputs)))
    geo, f64, x = _view(case, inputs)
    var = x.var(axis=geo.group_axes).reshape(-1)
    count = case.rows
    # running_update unbiases the variance it is given (n / (n - 1)): hand it n - 1 / n of the biased one.
    out["running_var"] = batch_norm.running_update(
        case, f64, x.mean(axis=geo.group_axes).reshape(-1), var * ((count - 1) / count)
    )["running_var"]
    return out


def rounded_xhat(case: Case, inputs: Arrays) -> Arrays:
    """An RMSNorm that rounds xhat to the activation dtype before the weight multiplies it
    (``weight * xhat.to(input_dtype)``, LlamaRMSNorm and its kin): y = w * round(xhat) and
    dweight = sum(dy * round(xhat))."""
    if case.op not in RMS_OPS:
        raise ModelError(f"rounded_xhat models {', '.join(sorted(RMS_OPS))}, not op={case.op}")
    geo, f64, x = _view(case, inputs)
    rstd = 1.0 / np.sqrt((x * x).mean(axis=geo.group_axes, keepdims=True) + case.eps)
    xhat = round_to(x * rstd, case.dtype).astype(np.float64)
    out = dict(oracle.evaluate(case, inputs, grad=_grad(inputs)))
    out["y"] = (xhat * _scale(case, f64, geo.param_shape)).reshape(case.shape)
    if _grad(inputs) and case.weight:
        out["dweight"] = (f64["dy"].reshape(geo.shape) * xhat).sum(axis=geo.reduce_axes).reshape(-1)
    return out


def weight_grad_in_dtype(case: Case, inputs: Arrays) -> Arrays:
    """Float32 parameters read through a cast to the activation dtype (Keras' autocast under a mixed
    policy): their gradients flow back through that cast and come out rounded to it."""
    out = dict(oracle.evaluate(case, inputs, grad=_grad(inputs)))
    for name in ("dweight", "dbias"):
        if name in out:
            out[name] = round_to(out[name], case.dtype).astype(np.float64)
    return out


def one_pass_sequential_float32(case: Case, inputs: Arrays) -> Arrays:
    """LayerNorm (and the add op's) whose row mean and mean square are accumulated element by element in
    float32 and whose variance is E[x^2] - E[x]^2 (clipped at 0): on offset rows the subtraction cancels
    most digits. ONNX Runtime's SkipLayerNormalization CPU kernel before 1.30 does this, on the sum
    x + skip it forms in float32 (exact for half inputs, so the norm reads the unrounded sum there); the
    sequential order reproduces it to the bit where a pairwise sum would not."""
    if case.op not in LAYER_OPS or case.norm_ndim != 1:
        raise ModelError(f"one_pass_sequential_float32 models one-axis LayerNorm rows, not case {case.id}")
    read = round_to(residual.exact_sum(inputs), "float32") if case.op in ADD_OPS else inputs["x"]
    x = np.asarray(read, dtype=np.float32)
    rows = x.reshape(-1, x.shape[-1])
    total = np.zeros(rows.shape[0], np.float32)
    squares = np.zeros(rows.shape[0], np.float32)
    for column in rows.T:  # one float32 rounding per element added, in order
        total += column
        squares += column * column
    n = np.float32(rows.shape[1])
    mean = total / n
    var = np.maximum(squares / n - mean * mean, np.float32(0)).astype(np.float64)
    xhat = (rows.astype(np.float64) - mean[:, None].astype(np.float64)) / np.sqrt(var[:, None] + case.eps)
    w = np.asarray(inputs["weight"], np.float64) if case.weight else 1.0
    b = np.asarray(inputs["bias"], np.float64) if case.bias else 0.0
    y = (xhat * w + b).reshape(case.shape)
    return {**oracle.evaluate(case, inputs, grad=_grad(inputs)), "y": y}


MODELS: dict[str, Model] = {
    "one_pass_sequential_float32": one_pass_sequential_float32,
    "eps_float32": eps_float32,
    "eps_dropped": eps_dropped,
    "momentum_zero": momentum_zero,
    "momentum_float32": momentum_float32,
    "half_statistics": half_statistics,
    "variance_path_underflow": variance_path_underflow,
    "exact_sum": exact_sum,
    "one_pass_variance": one_pass_variance,
    "one_pass_unclamped": one_pass_unclamped,
    "truncating_bfloat16_convert": truncating_bfloat16_convert,
    "biased_running_var": biased_running_var,
    "rounded_xhat": rounded_xhat,
    "weight_grad_in_dtype": weight_grad_in_dtype,
    "float32_execution": Narrowed("float32"),
    "bfloat16_execution": Narrowed("bfloat16"),
}


def resolve(name: str) -> Model:
    """A built-in model by key, or a third party's as ``package.module:function``."""
    if name in MODELS:
        return MODELS[name]
    module, _, attribute = name.partition(":")
    if not module or not attribute:
        raise ModelError(
            f"model={name!r} is not allowed; allowed: {', '.join(MODELS)} or 'package.module:function'"
        )
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ModelError(f"model={name!r} cannot be loaded: {exc}") from exc
    if not callable(found):
        raise ModelError(f"model={name!r} is not callable")
    model: Model = found
    return model
