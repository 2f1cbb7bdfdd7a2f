"""NumPy emulations of normalization conventions, one rounding after every operation.

A ``Convention`` is the reference semantics with some choices changed; ``emulate`` computes a case's
outputs under it, so each fingerprint hypothesis predicts what a backend following that convention
returns, to the bit where the order of its reductions does not matter. GroupNorm and InstanceNorm are
computed on the geometry view of x (N, G, C/G, spatial), where a group is the last two axes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from conformance.model import residual
from conformance.model.case import ADD_OPS, BATCH_NORM, CHANNEL_OPS, GROUP_OPS, INSTANCE_NORM, RMS_OPS, Case
from conformance.model.dtypes import finfo, round_to, truncating_bfloat16
from conformance.model.geometry import geometry

Array = np.ndarray
Round = Callable[[Array], Array]


@dataclass(frozen=True)
class Convention:
    """One value per choice; the defaults are normconf's reference semantics (PyTorch's)."""

    eps: str = "inside"  # sqrt(var + eps) | "std": sqrt(var) + eps | "dropped"
    eps_dtype: str = "exact"  # eps as given | "float32": rounded to float32 first (an ONNX float attribute)
    variance: str = "biased"  # divisor n | "unbiased": n - 1
    passes: str = "two"  # mean, then centred squares | "one": E[x^2] - E[x]^2
    stats: str = "float32"  # float32 (float64 stays float64) | "activation": the input dtype
    reduce: str = "wide"  # one rounding per reduction | "narrow": accumulate in the working dtype
    variance_of: str = "x"  # two-pass variance about the exact mean | "centred": of the rounded x - mean
    # d / s | "reciprocal": d * (1 / s) | "reciprocal_wide": 1 / s in float32 | "scaled": centred after
    # scaling, x * inv + (b - mean * inv) with inv = w / s (Keras' GroupNormalization and BatchNorm, JAX's
    # BatchNorm in eval mode): the large x * inv and mean * inv cancel in the working dtype.
    normalize: str = "divide"
    axes: str = "trailing"  # LN/RMS: the trailing norm_ndim dims | "last": the last dim only
    # GN/IN: statistics over each group of channels | "channel": per channel (GroupNorm as InstanceNorm)
    groups: str = "group"
    affine: str = "channel"  # GN weight and bias per channel | "group": the group's first channel's for all
    bias: str = "applied"  # | "ignored"
    dx: str = "full"  # | "no_mean_terms": statistics treated as constants
    weight_cast: str = "before"  # weight times the wide xhat | "after": xhat rounded to the dtype first
    offset: str = "applied"  # RMSNorm scale offset + w | "ignored": w
    momentum: str = "torch"  # (1 - m) r + m b | "onnx": m r + (1 - m) b | "frozen": never updated
    running_var: str = "unbiased"  # running update with the unbiased batch variance | "biased"
    momentum_none: str = "cumulative"  # momentum=None: factor 1 on the first batch | "zero" | "default"
    norm_input: str = "case"  # add ops: the sum the case asks for | "exact": the unrounded float32 sum
    stream: str = "case"  # add ops: residual_out in the case's stream dtype | "float32": kept in float32
    # The dtype the whole computation runs in: the case's | a narrower one ("float32" for float64 inputs,
    # "bfloat16" for float32 ones: an execution-precision policy): inputs rounded to it, computed as a
    # case of that dtype, outputs of that dtype. "<dtype>-saturating": the same, with overflows clamped
    # to the dtype's largest finite value (OpenVINO's CPU plugin returns those instead of inf);
    # "<dtype>-nan": infinities as NaN (x * inv - mean * inv, JAX's form, gives inf - inf where inv is).
    execute: str = "case"
    # How a bfloat16 y (and residual_out) is rounded from float32: to nearest (even) | "guard": from the
    # guard bit alone, the bits below it dropped, so a value above the midpoint rounds to even like a
    # tie (OpenVINO's CPU plugin, dtypes.truncating_bfloat16: a quarter of its outputs round down where
    # round-to-nearest rounds up).
    output_round: str = "nearest"


REFERENCE = Convention()
_NONE_FACTOR = {"cumulative": 1.0, "zero": 0.0, "default": 0.1}


def rounder(dtype: str) -> Round:
    """Round float64 values to ``dtype`` and hand them back as float64 (one IEEE rounding)."""

    def r(values: Array) -> Array:
        with np.errstate(over="ignore", invalid="ignore"):
            return round_to(values, dtype).astype(np.float64)

    return r


@dataclass(frozen=True)
class _Work:
    """Arithmetic in one precision: every result rounded once, reductions wide or narrow."""

    r: Round
    narrow: bool

    def mean(self, v: Array, axes: tuple[int, ...], divisor: float | None = None) -> Array:
        count = float(np.prod([v.shape[a] for a in axes]))
        if not self.narrow:
            return self.r(v.sum(axis=axes, keepdims=True) / (divisor or count))
        # Sequential accumulation, each partial sum rounded, as a naive kernel in the dtype does.
        moved = np.moveaxis(v, axes, tuple(range(-len(axes), 0)))
        flat = moved.reshape(*moved.shape[: moved.ndim - len(axes)], -1)
        acc = np.zeros(flat.shape[:-1])
        for i in range(flat.shape[-1]):
            acc = self.r(acc + flat[..., i])
        total = np.expand_dims(acc, tuple(range(acc.ndim, acc.ndim + len(axes))))
        total = np.moveaxis(total, tuple(range(-len(axes), 0)), axes)
        return self.r(total / (divisor or count))


def _stats_dtype(case: Case, conv: Convention) -> str:
    if conv.stats == "activation" or case.dtype == "float64":
        return case.dtype
    return "float32"


def _axes(case: Case, conv: Convention, ndim: int) -> tuple[int, ...]:
    if case.op == BATCH_NORM:
        return (0, *range(2, ndim))
    if case.op in GROUP_OPS:
        return (3,) if conv.groups == "channel" else (2, 3)
    count = 1 if conv.axes == "last" else case.norm_ndim
    return tuple(range(ndim - count, ndim))


def _param(
    case: Case, inputs: Mapping[str, Array], name: str, ndim: int, conv: Convention = REFERENCE
) -> Array | None:
    if name not in inputs:
        return None
    values = np.asarray(inputs[name], dtype=np.float64)
    if case.op == BATCH_NORM:
        return values.reshape((1, -1) + (1,) * (ndim - 2))
    if case.op in GROUP_OPS:
        grouped = values.reshape(geometry(case).param_shape)
        if conv.affine == "group" and name in ("weight", "bias"):
            # Every channel of a group takes its first channel's parameter.
            grouped = np.broadcast_to(grouped[:, :1], grouped.shape)
        return grouped
    return values


def _variance(x: Array, mean: Array, axes: tuple[int, ...], w: _Work, conv: Convention) -> Array:
    count = float(np.prod([x.shape[a] for a in axes]))
    divisor = max(count - 1.0, 1.0) if conv.variance == "unbiased" else count
    if conv.passes == "one":
        # In a narrow dtype the squares may overflow (inf - inf): NaN, as such a kernel returns.
        with np.errstate(invalid="ignore", over="ignore"):
            squares = w.mean(w.r(x * x), axes, divisor)
            return w.r(squares - w.r(mean * mean * (count / divisor)))
    if conv.variance_of == "x":
        # One rounding of the variance of x about its exact mean (torch's var() in any dtype).
        exact = x.mean(axis=axes, keepdims=True)
        return w.r(np.square(x - exact).sum(axis=axes, keepdims=True) / divisor)
    centred = w.r(x - mean)
    return w.mean(w.r(centred * centred), axes, divisor)


def _inverse(var: Array, eps: float, w: _Work, conv: Convention) -> Array:
    """The normalizing denominator s, with eps where the convention puts it."""
    e = w.r(
        round_to(np.asarray(eps), "float32").astype(np.float64)
        if conv.eps_dtype == "float32"
        else np.asarray(eps)
    )
    if conv.eps == "std":
        return w.r(w.r(np.sqrt(np.maximum(var, 0.0))) + e)
    if conv.eps == "dropped":
        return w.r(np.sqrt(np.maximum(var, 0.0)))
    with np.errstate(invalid="ignore"):  # a one-pass variance in a narrow dtype may go negative: NaN
        return w.r(np.sqrt(w.r(var + e)))


def _normalized(d: Array, s: Array, w: _Work, conv: Convention) -> tuple[Array, Array, Round]:
    """(xhat, rstd, rounding of the elementwise tail) for the convention's normalization."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if conv.normalize == "divide":
            return w.r(d / s), 1.0 / s, w.r
        if conv.normalize in ("reciprocal", "scaled"):  # scaled: y is _scaled's, xhat for dx
            rstd = w.r(1.0 / s)
            return w.r(d * rstd), rstd, w.r
        wide = rounder("float32")
        rstd = wide(1.0 / s)
        return wide(d * rstd), rstd, wide


def _to_dtype(case: Case, conv: Convention) -> Round:
    """The conversion of a float32 result to the case's dtype (y, and xhat cast before the weight)."""
    if conv.output_round == "guard" and case.dtype == "bfloat16":
        return truncating_bfloat16
    return rounder(case.dtype)


def _scaled(
    case: Case, inputs: Mapping[str, Array], x: Array, mean: Array, s: Array, w: _Work, conv: Convention
) -> Array:
    """y as ``x * inv + (b - mean * inv)``, inv = w / s, each step rounded in the working dtype (the
    gradients, where asked, are the divide form's: the same function)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = w.r(1.0 / s)
        weight = _param(case, inputs, "weight", x.ndim, conv)
        if weight is not None:
            inv = w.r(inv * weight)
        shift = w.r(-mean * inv)
        bias = _param(case, inputs, "bias", x.ndim, conv)
        if bias is not None and conv.bias == "applied":
            shift = w.r(shift + bias)
        return w.r(w.r(x * inv) + shift)


def _statistics(
    case: Case, inputs: Mapping[str, Array], x: Array, axes: tuple[int, ...], w: _Work, conv: Convention
) -> tuple[Array, Array]:
    """(mean, var) the op normalizes with: batch statistics, running ones, or (RMS) 0 and mean(x^2)."""
    ndim = x.ndim
    if case.op in CHANNEL_OPS and not case.uses_batch_stats:
        mean, var = _param(case, inputs, "running_mean", ndim), _param(case, inputs, "running_var", ndim)
        assert mean is not None and var is not None, "BN inputs carry running statistics"
        return w.r(mean), w.r(var)
    if case.op in RMS_OPS:
        return np.zeros(1), w.mean(w.r(x * x), axes)
    mean = w.mean(x, axes)
    return mean, _variance(x, mean, axes, w, conv)


def _affine(
    case: Case, inputs: Mapping[str, Array], xhat: Array, tail: Round, conv: Convention
) -> tuple[Array, Array | None]:
    """(y before the final rounding, effective scale) with the convention's weight and bias handling."""
    weight = _param(case, inputs, "weight", xhat.ndim, conv)
    scale = None
    if weight is not None:
        offset = case.weight_offset if conv.offset == "applied" else 0.0
        # Gemma forms 1 + w in float32 (float64 parameters stay float64).
        wide = "float64" if case.weight_dtype == "float64" else "float32"
        scale = rounder(wide)(weight + offset) if offset else weight
    y = xhat
    if scale is not None:
        if conv.weight_cast == "after":
            y = rounder(case.dtype)(_to_dtype(case, conv)(xhat) * scale)
        else:
            y = tail(xhat * scale)
    bias = _param(case, inputs, "bias", xhat.ndim, conv)
    if bias is not None and conv.bias == "applied":
        y = tail(y + bias)
    return y, scale


def _per_channel(case: Case, stats: Array) -> Array:
    """Batch statistics per channel: BN's as they are; InstanceNorm's instance statistics averaged
    over the samples (torch's F.instance_norm)."""
    if case.op == INSTANCE_NORM:
        per_sample: Array = stats.reshape(case.shape[0], -1).mean(axis=0)
        return per_sample
    return stats.reshape(-1)


def _running(
    case: Case, inputs: Mapping[str, Array], mean: Array, var: Array, count: int, conv: Convention
) -> dict[str, Array]:
    m = _NONE_FACTOR[conv.momentum_none] if case.momentum is None else case.momentum
    keep, take = {"onnx": (m, 1.0 - m), "frozen": (1.0, 0.0)}.get(conv.momentum, (1.0 - m, m))
    batch_var = var
    if conv.running_var == "unbiased":
        batch_var = batch_var * (count / (count - 1))
    r32, rp = rounder("float32"), rounder(case.weight_dtype)
    rm = np.asarray(inputs["running_mean"], dtype=np.float64)
    rv = np.asarray(inputs["running_var"], dtype=np.float64)
    return {
        "running_mean": rp(r32(keep * rm + take * _per_channel(case, mean))),
        "running_var": rp(r32(keep * rv + take * _per_channel(case, batch_var))),
    }


def _dx(
    case: Case,
    dy: Array,
    scale: Array | None,
    xhat: Array,
    rstd: Array,
    axes: tuple[int, ...],
    conv: Convention,
) -> Array:
    g: Array = dy if scale is None else dy * scale
    if (case.op in CHANNEL_OPS and not case.uses_batch_stats) or conv.dx == "no_mean_terms":
        # Running statistics are constants; the broken convention treats batch ones so too.
        dx: Array = g * rstd
        return dx
    mean_gx = (g * xhat).mean(axis=axes, keepdims=True)
    if case.op in RMS_OPS:
        dx = rstd * (g - xhat * mean_gx)
    else:
        dx = rstd * (g - g.mean(axis=axes, keepdims=True) - xhat * mean_gx)
    return dx


def _stream(case: Case, inputs: Mapping[str, Array], conv: Convention) -> dict[str, Array]:
    """The add ops' residual_out (and its unrounded value) and the sum the norm reads under ``conv``."""
    total = residual.exact_sum(inputs)
    stream = "float32" if conv.stream == "float32" else case.stream_dtype
    # A bfloat16 stream is a float32 sum converted like y (output_round): OpenVINO's CPU plugin without
    # AVX512-BF16 converts both from the guard bit alone.
    guard = conv.output_round == "guard" and stream == "bfloat16"
    stored = truncating_bfloat16(total) if guard else rounder(stream)(total)
    wide = rounder("float64" if case.dtype == "float64" else "float32")
    exact = conv.norm_input == "exact" or (conv.norm_input == "case" and case.norm_input == "exact")
    return {
        "residual_out": stored,
        "residual_out@wide": total,
        "normalized": wide(total) if exact else stored,
    }


def emulate(
    case: Case, inputs: Mapping[str, Array], conv: Convention = REFERENCE, *, grad: bool = False
) -> dict[str, Array]:
    """Outputs of ``case`` under ``conv`` (float64 arrays holding values of each output's dtype).

    ``y@wide`` is y before its final rounding, for probes that keep away from rounding boundaries.
    """
    if conv.execute.partition("-")[0] not in ("case", case.dtype):
        return _executed(case, inputs, conv, grad=grad)
    stats = _stats_dtype(case, conv)
    w = _Work(rounder(stats), narrow=conv.reduce == "narrow" and stats == case.dtype)
    # Channel groups become plain axes of the geometry view; every other op keeps x's shape.
    view = geometry(case).shape if case.op in GROUP_OPS else case.shape
    streamed = _stream(case, inputs, conv) if case.op in ADD_OPS else {}
    source = streamed.pop("normalized", inputs["x"])
    x = w.r(np.asarray(source, dtype=np.float64).reshape(view))
    axes = _axes(case, conv, x.ndim)
    mean, var = _statistics(case, inputs, x, axes, w, conv)
    s = _inverse(var, case.eps, w, conv)
    d = x if case.op in RMS_OPS else w.r(x - mean)
    xhat, rstd, tail = _normalized(d, s, w, conv)
    y, scale = _affine(case, inputs, xhat, tail, conv)
    if conv.normalize == "scaled" and case.op not in RMS_OPS:
        y = _scaled(case, inputs, x, mean, s, w, conv)
    out = {"y": _to_dtype(case, conv)(y).reshape(case.shape), "y@wide": y.reshape(case.shape), **streamed}
    if case.training:
        count = int(np.prod([x.shape[a] for a in axes]))
        out.update(_running(case, inputs, mean, var, count, conv))
    if grad:
        dy = np.asarray(inputs["dy"], dtype=np.float64).reshape(view)
        out["dx"] = rounder(case.dtype)(_dx(case, dy, scale, xhat, rstd, axes, conv)).reshape(case.shape)
    return out


def _executed(case: Case, inputs: Mapping[str, Array], conv: Convention, *, grad: bool) -> dict[str, Array]:
    """``case`` computed entirely in ``conv.execute``: every input rounded to it, the case run as one of
    that dtype (its parameters and stream too), the outputs in it (exact in the wider case dtype)."""
    narrow, _, overflow = conv.execute.partition("-")
    inner = replace(case, dtype=narrow, param_dtype=None, residual_dtype=None)
    rounded = {name: rounder(narrow)(np.asarray(v, dtype=np.float64)) for name, v in inputs.items()}
    out = emulate(inner, rounded, replace(conv, execute="case"), grad=grad)
    if overflow == "saturating":
        largest = float(finfo(narrow).max)
        out = {name: np.clip(value, -largest, largest) for name, value in out.items()}
    elif overflow == "nan":
        out = {name: np.where(np.isinf(value), np.nan, value) for name, value in out.items()}
    return out
