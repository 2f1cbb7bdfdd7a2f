"""The fingerprint's questions: for each, a probe case and the conventions it tells apart.

A question's hypotheses are families of ``Convention``s (variants that differ only in rounding order
count as one answer); the probe is built so that families disagree by far more than rounding.
docs/fingerprints.md explains every question, probe and hypothesis.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from conformance.fingerprint import cases
from conformance.fingerprint.cases import Probe
from conformance.fingerprint.emulate import REFERENCE, Convention, emulate
from conformance.model.case import ADD_LAYER_NORM, ADD_OPS, ADD_RMS_NORM, GROUP_NORM, INSTANCE_NORM, Case
from conformance.model.dtypes import ulp, unit_roundoff

Family = tuple[Convention, ...]
# Half the distance to a rounding boundary a masked element must keep, in ulps of the output dtype:
# far more than float32 reduction-order noise, so every float32-statistics variant rounds alike.
MARGIN = 0.05


@dataclass(frozen=True)
class Question:
    """One convention question: ``hypotheses`` name families of conventions, ``reference`` is normconf's.

    ``metric`` "rel" is max |actual - predicted| / rms(predicted); "mismatch" the fraction of masked
    elements whose bits differ from the prediction; "grid" (RMSNorm's execution precision) how far the
    shares of outputs on the bfloat16 grid differ, or twice "rel" where that is larger. ``default_eps``
    probes run with the library's eps.
    """

    name: str
    what: str
    make: Callable[[], Probe]
    hypotheses: Mapping[str, Family]
    reference: str
    metric: str = "rel"
    default_eps: bool = False
    candidates: Mapping[str, float] = field(default_factory=dict)
    # The noise bound where it is the question's own, not the probe dtype's (execution precision).
    fixed_noise: float | None = None
    # Choices of other questions each hypothesis is also tried with, so that one deviation (say an
    # unbiased variance) does not make every other answer "unmatched".
    nuisance: tuple[Mapping[str, str], ...] = ({},)

    @property
    def op(self) -> str:
        return self.name.split(".")[0]

    def noise(self, case: Case) -> float:
        """The largest error of a matching hypothesis: reduction-order rounding, nothing more."""
        if self.fixed_noise is not None:
            return self.fixed_noise
        if self.default_eps:
            return 0.01  # relative distance of the inferred eps to a candidate
        if self.metric == "mismatch":
            return 0.1
        if case.dtype == "float64":
            return 1e-12
        return 16 * unit_roundoff(case.dtype) if case.dtype in ("float16", "bfloat16") else 1e-5

    def probe(self) -> Probe:
        return _probe(self)


@functools.cache
def _built(name: str) -> Probe:
    question = QUESTIONS[name]
    probe = question.make()
    if question.metric != "mismatch":
        return probe
    return replace(probe, mask={out: _separating(question, probe, out) for out in probe.outputs})


def _probe(question: Question) -> Probe:
    return _built(question.name)


def _separating(question: Question, probe: Probe, output: str) -> np.ndarray:
    """Elements where the first family's variants agree, sit clear of a rounding boundary, and every
    variant of every other family rounds to a different value."""
    families = list(question.hypotheses.values())
    first = [emulate(probe.case, probe.inputs, c, grad=probe.grad) for c in families[0]]
    value = first[0][output]
    mask = np.ones(value.shape, dtype=bool)
    for out in first:
        mask &= out[output] == value
        mask &= _clear_of_boundary(out[f"{output}@wide"], probe.case.dtype)
    for family in families[1:]:
        for conv in family:
            mask &= emulate(probe.case, probe.inputs, conv, grad=probe.grad)[output] != value
    assert mask.sum() >= 16, f"{question.name}: only {mask.sum()} separating elements"
    return mask


def _clear_of_boundary(wide: np.ndarray, dtype: str) -> np.ndarray:
    step = ulp(wide, dtype)
    offset = np.abs(wide / step - np.round(wide / step))  # 0 on the grid, 0.5 on a midpoint
    clear: np.ndarray = 0.5 - offset >= MARGIN
    return clear


# ----------------------------------------------------------------------------- hypotheses
def _one(**changes: str) -> Family:
    return (replace(REFERENCE, **changes),)


def _both_orders(base: Convention) -> Family:
    """A convention computed as d / s or as d * (1 / s): the same answer, rounded differently."""
    return (base, replace(base, normalize="reciprocal"))


# Statistics in the activation dtype, in every rounding order we know of: reductions rounded once
# (torch) or accumulated in the dtype (NumPy bfloat16), variance of x or of the rounded x - mean.
_ACTIVATION: Family = tuple(
    Convention(stats="activation", reduce=reduce, variance_of=of, normalize=normalize)
    for reduce, of, normalize in itertools.product(
        ("wide", "narrow"), ("x", "centred"), ("divide", "reciprocal", "reciprocal_wide")
    )
)
EPS = {"inside-sqrt": _one(), "added-to-std": _one(eps="std"), "dropped": _one(eps="dropped")}
EXECUTION_FLOAT64 = {
    "float64": _one(),
    "float32": tuple(replace(REFERENCE, execute=f"float32{how}") for how in ("", "-saturating", "-nan")),
}
# float32 or float16 inputs computed in their dtype, or in bfloat16 throughout.
EXECUTION_NARROWED = {
    dtype: {dtype: _one(), "bfloat16": _one(execute="bfloat16")} for dtype in ("float32", "float16")
}
# Outputs of +-1 against 0 or +-inf: a narrower dtype's rounding of them is far inside this.
EXECUTION_NOISE = 0.05
# The grid metric (fingerprint.grid_error): shares on the bfloat16 grid of ~0 or ~1/8 (float32, float16
# outputs) against 1, values within a few bfloat16 ulps.
GRID_NOISE = 0.1
EPS_DTYPE = {"as-given": _one(), "float32": _one(eps_dtype="float32")}
VARIANCE = {"biased": _one(), "unbiased": _one(variance="unbiased")}
PASSES = {"two-pass": _one(), "one-pass": _one(passes="one")}
STATS = {"float32": _both_orders(REFERENCE), "activation-dtype": _ACTIVATION}
CAST = {
    "before-cast": _both_orders(REFERENCE),
    "after-cast": _both_orders(Convention(weight_cast="after")),
}
OFFSET = {"applied": _one(), "ignored": _one(offset="ignored")}
MOMENTUM = {"torch": _one(), "onnx": _one(momentum="onnx")}
RUNNING_VAR = {"unbiased": _one(), "biased": _one(running_var="biased")}
MOMENTUM_NONE = {
    "cumulative": _one(),
    "as-0": _one(momentum_none="zero"),
    "as-0.1": _one(momentum_none="default"),
}
DX = {"full": _one(), "no-mean-terms": _one(dx="no_mean_terms")}
BIAS = {"applied": _one(), "ignored": _one(bias="ignored")}
AXES = {"trailing": _one(), "last-dim": _one(axes="last")}
GROUPS = {"per-group": _one(), "per-channel": _one(groups="channel")}
AFFINE = {"per-channel": _one(), "per-group": _one(affine="group")}
# InstanceNorm's running statistics: torch.nn.InstanceNorm passes momentum 0 for momentum=None, so a
# backend whose statistics are never updated is a convention seen in the wild, not only a bug.
MOMENTUM_IN = {**MOMENTUM, "not-updated": _one(momentum="frozen")}
# The add ops' residual stream: the norm reads the sum as stored (rounded to the stream's dtype) or the
# unrounded float32 sum; residual_out is stored in the stream's dtype or kept in float32 regardless.
SUM = {"rounded": _one(), "exact": _one(norm_input="exact")}
STREAM = {"activation": _one(), "float32": _one(stream="float32")}


# ----------------------------------------------------------------------------- the table
# (op, probe dtype) -> the question whose answer says whether that op computes in that dtype: a probe of
# that op and dtype is only askable where it does. The ops that centre (and the add ops, in their sum)
# are probed by cancellation: y = +-1 against 0. RMSNorm has nothing to cancel in; a bfloat16 policy
# moves its outputs by a few bfloat16 ulps only, so its questions read whether the outputs lie on the
# bfloat16 grid (metric "grid").
_CANCELLING = ("layer_norm", "batch_norm", "group_norm", "instance_norm", "add_layer_norm", "add_rms_norm")
EXECUTION = (
    ("layer_norm", "float64"),
    ("rms_norm", "float64"),
    ("batch_norm", "float64"),
    *((op, "float32") for op in (*_CANCELLING, "rms_norm") if op not in ADD_OPS),
    *((op, "float16") for op in (*_CANCELLING, "rms_norm")),
)
GATES = {(op, dtype): f"{op}.execution.{dtype}" for op, dtype in EXECUTION}


def _execution_probe(op: str, dtype: str) -> Callable[[], Probe]:
    if op == "batch_norm":
        return cases.execution_bn(dtype)
    if op in (GROUP_NORM, INSTANCE_NORM):
        return cases.execution_groups(op, dtype)
    if op in ADD_OPS:
        return cases.execution_add(op, dtype)
    if op == "rms_norm" and dtype != "float64":
        return cases.execution_rms(dtype)
    return cases.execution_row(op, dtype)


def _execution_metric(op: str, dtype: str) -> str:
    return "grid" if op == "rms_norm" and dtype != "float64" else "rel"


def _questions() -> list[Question]:
    q = Question
    half = ("bfloat16", "float16")
    table = [
        *(
            q(
                f"{op}.execution.{dtype}",
                f"{dtype} inputs: computed in {dtype}, or in a narrower dtype throughout",
                _execution_probe(op, dtype),
                EXECUTION_FLOAT64 if dtype == "float64" else EXECUTION_NARROWED[dtype],
                dtype,
                metric=_execution_metric(op, dtype),
                fixed_noise=GRID_NOISE if _execution_metric(op, dtype) == "grid" else EXECUTION_NOISE,
            )
            for op, dtype in EXECUTION
        ),
        q(
            "layer_norm.eps",
            "where eps enters: sqrt(var + eps), sqrt(var) + eps, or not at all",
            cases.eps_row("layer_norm"),
            EPS,
            "inside-sqrt",
        ),
        q(
            "rms_norm.eps",
            "where eps enters: sqrt(mean(x^2) + eps), sqrt(mean(x^2)) + eps, or not at all",
            cases.eps_row("rms_norm"),
            EPS,
            "inside-sqrt",
        ),
        q("batch_norm.eps", "where eps enters (eval, running variance)", cases.eps_bn(), EPS, "inside-sqrt"),
        q(
            "layer_norm.eps_precision",
            "float64 rows: eps used as given, or rounded to float32 first",
            cases.eps_row("layer_norm", "float64"),
            EPS_DTYPE,
            "as-given",
        ),
        q(
            "rms_norm.eps_precision",
            "float64 rows: eps used as given, or rounded to float32 first",
            cases.eps_row("rms_norm", "float64"),
            EPS_DTYPE,
            "as-given",
        ),
        q(
            "batch_norm.eps_precision",
            "float64 (eval): eps used as given, or rounded to float32 first",
            cases.eps_bn("float64"),
            EPS_DTYPE,
            "as-given",
        ),
        q(
            "layer_norm.variance",
            "normalization variance divides by n (biased) or n - 1",
            cases.variance_ln,
            VARIANCE,
            "biased",
        ),
        q(
            "batch_norm.variance",
            "training normalization variance divides by n or n - 1",
            cases.variance_bn,
            VARIANCE,
            "biased",
        ),
        q(
            "layer_norm.passes",
            "variance from centred values (two-pass, Welford) or E[x^2] - E[x]^2",
            cases.passes_ln,
            PASSES,
            "two-pass",
        ),
        q(
            "batch_norm.passes",
            "training variance two-pass (or Welford) or E[x^2] - E[x]^2",
            cases.passes_bn,
            PASSES,
            "two-pass",
        ),
    ]
    for dtype in half:
        table += [
            q(
                f"layer_norm.stats_precision.{dtype}",
                f"mean and variance of {dtype} rows in float32 or in {dtype}",
                cases.stats_ln(dtype),
                STATS,
                "float32",
            ),
            q(
                f"rms_norm.stats_precision.{dtype}",
                f"mean(x^2) of {dtype} rows in float32 or in {dtype}",
                cases.stats_rms(dtype),
                STATS,
                "float32",
                metric="mismatch",
            ),
            q(
                f"batch_norm.stats_precision.{dtype}",
                f"batch statistics of {dtype} channels in float32 or {dtype}",
                cases.stats_bn(dtype),
                STATS,
                "float32",
            ),
        ]
    table += [
        q(
            "rms_norm.weight_cast",
            "weight times the float32 xhat, or xhat rounded to bfloat16 first",
            cases.cast_rms,
            CAST,
            "before-cast",
            metric="mismatch",
        ),
        q(
            "rms_norm.offset",
            "weight_offset=1: scale 1 + w (Gemma) or w",
            cases.offset_rms,
            OFFSET,
            "applied",
        ),
        q(
            "batch_norm.momentum",
            "running = (1 - m) r + m b (torch) or m r + (1 - m) b (ONNX)",
            cases.bn_update(0.25, "running_mean"),
            MOMENTUM,
            "torch",
        ),
        q(
            "batch_norm.running_var",
            "running variance updated with the unbiased or biased batch variance",
            cases.bn_update(0.5, "y", "running_var"),
            RUNNING_VAR,
            "unbiased",
        ),
        q(
            "batch_norm.momentum_none",
            "momentum=None: cumulative average (first batch: running = batch), 0 or 0.1",
            cases.bn_update(None, "running_mean"),
            MOMENTUM_NONE,
            "cumulative",
        ),
        q("layer_norm.dx", "dx with its mean terms, or rstd * dy * w", cases.dx_ln, DX, "full"),
        q("batch_norm.dx", "training dx with its mean terms, or rstd * dy * w", cases.dx_bn, DX, "full"),
        q("layer_norm.bias", "bias added or ignored", cases.bias_ln, BIAS, "applied"),
        q("batch_norm.bias", "bias added or ignored (eval)", cases.bias_bn, BIAS, "applied"),
        q(
            "layer_norm.axes",
            "norm_ndim=2 normalizes the trailing two dims or the last only",
            cases.axes_row("layer_norm"),
            AXES,
            "trailing",
        ),
        q(
            "rms_norm.axes",
            "norm_ndim=2 normalizes the trailing two dims or the last only",
            cases.axes_row("rms_norm"),
            AXES,
            "trailing",
        ),
    ]
    table += _group_questions()
    table += _residual_questions()
    defaults = [
        ("layer_norm.default_eps", cases.default_eps_row("layer_norm", "float32"), "float32"),
        ("rms_norm.default_eps", cases.default_eps_row("rms_norm", "float32"), "float32"),
        ("rms_norm.default_eps.bfloat16", cases.default_eps_row("rms_norm", "bfloat16"), "bfloat16"),
        ("batch_norm.default_eps", cases.default_eps_bn, "float32"),
        ("group_norm.default_eps", cases.default_eps_groups("group_norm"), "float32"),
        ("instance_norm.default_eps", cases.default_eps_groups("instance_norm"), "float32"),
    ]
    for name, make, dtype in defaults:
        table.append(
            q(
                name,
                "the eps the library uses when none is given (inferred from the outputs)",
                make,
                {},
                "",
                default_eps=True,
                candidates=cases.eps_candidates(dtype),
            )
        )
    return [_with_nuisance(question) for question in table]


def _residual_questions() -> list[Question]:
    """Which sum the fused add ops normalize, and which dtype their residual_out is stored in."""
    q = Question
    # bfloat16 first (XLA drops that rounding), float16 too: ONNX Runtime's CPU LayerNormalization has
    # no bfloat16 kernel, so only a float16 probe asks its graphs and their fusions.
    return [
        *(
            q(
                f"add_layer_norm.sum{suffix}",
                f"the norm reads x + residual as stored in {dtype}, or the unrounded float32 sum",
                cases.sum_ln(dtype),
                SUM,
                "rounded",
            )
            for dtype, suffix in (("bfloat16", ""), ("float16", ".float16"))
        ),
        *(
            q(
                f"add_rms_norm.sum{suffix}",
                f"the norm reads x + residual as stored in {dtype}, or the unrounded float32 sum",
                cases.sum_rms(dtype),
                SUM,
                "rounded",
                metric="mismatch",
            )
            for dtype, suffix in (("bfloat16", ""), ("float16", ".float16"))
        ),
        *(
            q(
                f"{op}.stream",
                "residual_out of bfloat16 activations stored in bfloat16, or kept in float32",
                cases.stream(op),
                STREAM,
                "activation",
                metric="mismatch",
            )
            for op in (ADD_LAYER_NORM, ADD_RMS_NORM)
        ),
    ]


def _group_questions() -> list[Question]:
    """GroupNorm and InstanceNorm (with instance statistics unless a running-statistics question): the
    row probes' rows become their groups (cases.channel_case), so the same values tell the same
    conventions apart."""
    q = Question
    table = []
    for op in (GROUP_NORM, INSTANCE_NORM):
        table += [
            q(
                f"{op}.eps",
                "where eps enters: sqrt(var + eps), sqrt(var) + eps, or not at all",
                cases.eps_groups(op),
                EPS,
                "inside-sqrt",
            ),
            q(
                f"{op}.variance",
                "normalization variance divides by n (biased) or n - 1",
                cases.variance_groups(op),
                VARIANCE,
                "biased",
            ),
            q(
                f"{op}.passes",
                "variance from centred values (two-pass, Welford) or E[x^2] - E[x]^2",
                cases.passes_groups(op),
                PASSES,
                "two-pass",
            ),
        ]
    table += [
        q(
            f"group_norm.stats_precision.{dtype}",
            f"mean and variance of {dtype} groups in float32 or in {dtype}",
            cases.stats_groups("group_norm", dtype),
            STATS,
            "float32",
        )
        for dtype in ("bfloat16", "float16")
    ]
    table += [
        q(
            "group_norm.groups",
            "statistics over each group of C/G channels, or per channel (as InstanceNorm)",
            cases.groups_gn,
            GROUPS,
            "per-group",
        ),
        q(
            "group_norm.affine",
            "weight and bias per channel, or the group's first channel's for all its channels",
            cases.affine_gn,
            AFFINE,
            "per-channel",
        ),
        q(
            "instance_norm.momentum",
            "running = (1 - m) r + m b (torch), m r + (1 - m) b (ONNX), or never updated",
            cases.in_update(0.25, "running_mean"),
            MOMENTUM_IN,
            "torch",
        ),
        q(
            "instance_norm.running_var",
            "running variance updated with the unbiased or biased instance variances",
            cases.in_update(0.5, "y", "running_var"),
            RUNNING_VAR,
            "unbiased",
        ),
        q(
            "instance_norm.momentum_none",
            "momentum=None: cumulative average (first step: running = batch), 0 (never updated) or 0.1",
            cases.in_update(None, "running_mean"),
            MOMENTUM_NONE,
            "cumulative",
        ),
    ]
    return table


_CENTRING = ("layer_norm", "batch_norm", "group_norm", "instance_norm", "add_layer_norm")


def _with_nuisance(question: Question) -> Question:
    """Answers of ops that centre hold whichever normalization variance the backend uses; GroupNorm's
    hold whether its statistics are per group or per channel; the eps precision answer holds wherever
    the backend adds eps."""
    nuisance: list[Mapping[str, str]] = [{}]
    if question.op in _CENTRING and question.hypotheses is not VARIANCE:
        nuisance.append({"variance": "unbiased"})
    if question.op == GROUP_NORM and question.hypotheses is not GROUPS:
        nuisance += [{**changes, "groups": "channel"} for changes in nuisance]
    if question.hypotheses is EPS_DTYPE:
        nuisance += [{**changes, "eps": "std"} for changes in nuisance]
    if question.metric == "mismatch" and question.make().case.dtype == "bfloat16":
        # Read bit for bit: each hypothesis with OpenVINO's bfloat16 rounding too (emulate.py).
        nuisance += [{**changes, "output_round": "guard"} for changes in nuisance]
    if question.hypotheses is PASSES:
        # A one-pass variance in the form that centres after scaling (Keras' GroupNormalization): the
        # probe's cancelling rows give var = 0 either way, but x * inv rounds where d / s does not.
        nuisance += [{**changes, "normalize": "scaled"} for changes in nuisance]
    if question.hypotheses is STATS and question.op in _CENTRING:
        # float32 statistics with a one-pass variance (Flax, Keras, ONNX Runtime's GroupNorm) are float32
        # statistics: without this variant they read as neither.
        nuisance += [{**changes, "passes": "one"} for changes in nuisance]
    return replace(question, nuisance=tuple(nuisance))


QUESTIONS: dict[str, Question] = {question.name: question for question in _questions()}
