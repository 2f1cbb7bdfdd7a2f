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

from conformance.case import Case
from conformance.dtypes import finfo, round_to, ulp, unit_roundoff
from conformance.fingerprint import probes
from conformance.fingerprint.emulate import REFERENCE, Convention, emulate

Family = tuple[Convention, ...]
# Half the distance to a rounding boundary a masked element must keep, in ulps of the output dtype:
# far more than float32 reduction-order noise, so every float32-statistics variant rounds alike.
MARGIN = 0.05


@dataclass(frozen=True)
class Probe:
    """The case run through the backend, its inputs, which outputs are judged, and (bitwise
    questions) the elements on which the hypotheses are known to round differently."""

    case: Case
    inputs: Mapping[str, np.ndarray]
    grad: bool
    outputs: tuple[str, ...]
    mask: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Question:
    """One convention question: ``hypotheses`` name families of conventions, ``reference`` is normconf's.

    ``metric`` "rel" is max |actual - predicted| / rms(predicted); "mismatch" the fraction of masked
    elements whose bits differ from the prediction. ``default_eps`` probes run with the library's eps.
    """

    name: str
    what: str
    make: Callable[[], Probe]
    hypotheses: Mapping[str, Family]
    reference: str
    metric: str = "rel"
    default_eps: bool = False
    candidates: Mapping[str, float] = field(default_factory=dict)
    # Choices of other questions each hypothesis is also tried with, so that one deviation (say an
    # unbiased variance) does not make every other answer "unmatched".
    nuisance: tuple[Mapping[str, str], ...] = ({},)

    @property
    def op(self) -> str:
        return self.name.split(".")[0]

    def noise(self, case: Case) -> float:
        """The largest error of a matching hypothesis: reduction-order rounding, nothing more."""
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


# ----------------------------------------------------------------------------- probes
def _row_probe(case: Case, x: np.ndarray, outputs: tuple[str, ...] = ("y",), **params: np.ndarray) -> Probe:
    return Probe(case, probes.rows(case, x, **params), False, outputs)


# eps probes use eps = 1e-2, a value the ci profile's eps sweep has, so backends that compile or
# export per eps value reuse what the checks built; rows of +-1/8 and +-1/16 (variance 1/64, 1/256)
# keep var and eps comparable. 1e-2 is not a float32, so the eps precision question can use it too.
_EPS = 1e-2
_SCALES = [2.0**-3, 2.0**-4]


def _eps_row(op: str, dtype: str = "float32") -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case(op, (2, 4), dtype, _EPS)
        return _row_probe(case, probes.alternating(_SCALES, 4))

    return make


def _eps_bn(dtype: str = "float32") -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case("batch_norm", (4, 2), dtype, _EPS)
        columns = probes.alternating(_SCALES, 4).T
        variances = np.square(np.array(_SCALES))
        return Probe(case, probes.channels(case, columns, running_var=variances), False, ("y",))

    return make


def _variance_ln() -> Probe:
    case = Case("layer_norm", (2, 4), "float32", 1e-12)
    return _row_probe(case, np.array([[3.0, 1.0, -1.0, 1.0], [0.5, -0.25, 1.0, 0.75]]))


def _variance_bn() -> Probe:
    case = Case("batch_norm", (4, 2), "float32", 1e-12, training=True)
    columns = np.array([[3.0, 1.0, -1.0, 1.0], [0.5, -0.25, 1.0, 0.75]]).T
    return Probe(case, probes.channels(case, columns), False, ("y",))


def _passes_ln() -> Probe:
    case = Case("layer_norm", (2, 4), "float32", 1e-12)
    return _row_probe(case, probes.cancelling("float32", 2))


def _passes_bn() -> Probe:
    case = Case("batch_norm", (4, 2), "float32", 1e-12, training=True)
    return Probe(case, probes.channels(case, probes.cancelling("float32", 2).T), False, ("y",))


def _stats_ln(dtype: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case("layer_norm", (6, 4), dtype, 1e-6)
        return _row_probe(case, probes.off_grid_means(dtype, 6))

    return make


def _stats_bn(dtype: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case("batch_norm", (4, 6), dtype, 1e-6, training=True)
        columns = probes.off_grid_means(dtype, 6).T
        return Probe(case, probes.channels(case, columns, running_mean=columns.mean(axis=0)), False, ("y",))

    return make


def _stats_rms(dtype: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case("rms_norm", (64, 16), dtype, 1e-6)
        return _row_probe(case, probes.seeded(7, case.shape))

    return make


def _cast_rms() -> Probe:
    case = Case("rms_norm", (32, 16), "bfloat16", 1e-6)
    return _row_probe(
        case, probes.seeded(11, case.shape), weight=probes.seeded(12, (16,), loc=1.0, scale=0.5)
    )


def _offset_rms() -> Probe:
    case = Case("rms_norm", (2, 8), "float32", 1e-12, weight_offset=1.0)
    return _row_probe(case, probes.dyadic(3, case.shape), weight=probes.dyadic(4, (8,), step=2.0**-6) / 4)


def _bn_update(momentum: float | None, *outputs: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case("batch_norm", (4, 2), "float32", 1e-12, training=True, momentum=momentum)
        columns = np.array([[1.0, 0.0, 1.0, 0.0], [-1.0, -2.0, -1.0, 0.0]]).T
        inputs = probes.channels(case, columns, np.array([4.0, -6.0]), np.array([2.0, 3.0]))
        return Probe(case, inputs, False, outputs)

    return make


def _dx_ln() -> Probe:
    case = Case("layer_norm", (3, 8), "float32", 1e-12)
    inputs = probes.rows(case, probes.dyadic(5, case.shape), weight=probes.dyadic(6, (8,), loc=1.0))
    inputs["dy"] = round_to(probes.dyadic(7, case.shape), "float32")
    return Probe(case, inputs, True, ("dx",))


def _dx_bn() -> Probe:
    case = Case("batch_norm", (8, 3), "float32", 1e-12, training=True)
    inputs = probes.channels(case, probes.dyadic(8, case.shape), weight=probes.dyadic(9, (3,), loc=1.0))
    inputs["dy"] = round_to(probes.dyadic(10, case.shape), "float32")
    return Probe(case, inputs, True, ("dx",))


def _bias_ln() -> Probe:
    case = Case("layer_norm", (2, 8), "float32", 1e-12)
    return _row_probe(case, probes.dyadic(13, case.shape), bias=probes.dyadic(14, (8,)) + 1.0)


def _bias_bn() -> Probe:
    case = Case("batch_norm", (4, 3), "float32", 1e-12)
    return Probe(
        case,
        probes.channels(case, probes.dyadic(15, case.shape), bias=np.array([1.0, -2.0, 3.0])),
        False,
        ("y",),
    )


def _axes_row(op: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case(op, (2, 3, 4), "float32", 1e-12, norm_ndim=2)
        return _row_probe(case, probes.dyadic(16, case.shape, loc=0.5))

    return make


def _default_eps_row(op: str, dtype: str) -> Callable[[], Probe]:
    def make() -> Probe:
        case = Case(op, (8, 8), dtype, 1e-5)  # eps unused: the probe runs through prepare_default_eps
        return _row_probe(case, probes.ladder(8))

    return make


def _default_eps_bn() -> Probe:
    case = Case("batch_norm", (8, 8), "float32", 1e-5)
    columns = probes.ladder(8).T
    return Probe(
        case, probes.channels(case, columns, running_var=np.square(columns).mean(axis=0)), False, ("y",)
    )


def _eps_candidates(dtype: str) -> dict[str, float]:
    """Defaults seen in libraries: fixed constants, or the machine epsilon of the input dtype or of
    the float32 it is upcast to (torch.nn.RMSNorm's eps=None)."""
    named = {"1e-05": 1e-5, "1e-06": 1e-6, "1e-08": 1e-8, "1e-12": 1e-12}
    for name in dict.fromkeys(("float32", dtype)):
        named[f"finfo({name}).eps"] = float(finfo(name).eps)
    return named


# ----------------------------------------------------------------------------- the table
def _questions() -> list[Question]:
    q = Question
    half = ("bfloat16", "float16")
    table = [
        q(
            "layer_norm.eps",
            "where eps enters: sqrt(var + eps), sqrt(var) + eps, or not at all",
            _eps_row("layer_norm"),
            EPS,
            "inside-sqrt",
        ),
        q(
            "rms_norm.eps",
            "where eps enters: sqrt(mean(x^2) + eps), sqrt(mean(x^2)) + eps, or not at all",
            _eps_row("rms_norm"),
            EPS,
            "inside-sqrt",
        ),
        q("batch_norm.eps", "where eps enters (eval, running variance)", _eps_bn(), EPS, "inside-sqrt"),
        q(
            "layer_norm.eps_precision",
            "float64 rows: eps used as given, or rounded to float32 first",
            _eps_row("layer_norm", "float64"),
            EPS_DTYPE,
            "as-given",
        ),
        q(
            "rms_norm.eps_precision",
            "float64 rows: eps used as given, or rounded to float32 first",
            _eps_row("rms_norm", "float64"),
            EPS_DTYPE,
            "as-given",
        ),
        q(
            "batch_norm.eps_precision",
            "float64 (eval): eps used as given, or rounded to float32 first",
            _eps_bn("float64"),
            EPS_DTYPE,
            "as-given",
        ),
        q(
            "layer_norm.variance",
            "normalization variance divides by n (biased) or n - 1",
            _variance_ln,
            VARIANCE,
            "biased",
        ),
        q(
            "batch_norm.variance",
            "training normalization variance divides by n or n - 1",
            _variance_bn,
            VARIANCE,
            "biased",
        ),
        q(
            "layer_norm.passes",
            "variance from centred values (two-pass, Welford) or E[x^2] - E[x]^2",
            _passes_ln,
            PASSES,
            "two-pass",
        ),
        q(
            "batch_norm.passes",
            "training variance two-pass (or Welford) or E[x^2] - E[x]^2",
            _passes_bn,
            PASSES,
            "two-pass",
        ),
    ]
    for dtype in half:
        table += [
            q(
                f"layer_norm.stats_precision.{dtype}",
                f"mean and variance of {dtype} rows in float32 or in {dtype}",
                _stats_ln(dtype),
                STATS,
                "float32",
            ),
            q(
                f"rms_norm.stats_precision.{dtype}",
                f"mean(x^2) of {dtype} rows in float32 or in {dtype}",
                _stats_rms(dtype),
                STATS,
                "float32",
                metric="mismatch",
            ),
            q(
                f"batch_norm.stats_precision.{dtype}",
                f"batch statistics of {dtype} channels in float32 or {dtype}",
                _stats_bn(dtype),
                STATS,
                "float32",
            ),
        ]
    table += [
        q(
            "rms_norm.weight_cast",
            "weight times the float32 xhat, or xhat rounded to bfloat16 first",
            _cast_rms,
            CAST,
            "before-cast",
            metric="mismatch",
        ),
        q("rms_norm.offset", "weight_offset=1: scale 1 + w (Gemma) or w", _offset_rms, OFFSET, "applied"),
        q(
            "batch_norm.momentum",
            "running = (1 - m) r + m b (torch) or m r + (1 - m) b (ONNX)",
            _bn_update(0.25, "running_mean"),
            MOMENTUM,
            "torch",
        ),
        q(
            "batch_norm.running_var",
            "running variance updated with the unbiased or biased batch variance",
            _bn_update(0.5, "y", "running_var"),
            RUNNING_VAR,
            "unbiased",
        ),
        q(
            "batch_norm.momentum_none",
            "momentum=None: cumulative average (first batch: running = batch), 0 or 0.1",
            _bn_update(None, "running_mean"),
            MOMENTUM_NONE,
            "cumulative",
        ),
        q("layer_norm.dx", "dx with its mean terms, or rstd * dy * w", _dx_ln, DX, "full"),
        q("batch_norm.dx", "training dx with its mean terms, or rstd * dy * w", _dx_bn, DX, "full"),
        q("layer_norm.bias", "bias added or ignored", _bias_ln, BIAS, "applied"),
        q("batch_norm.bias", "bias added or ignored (eval)", _bias_bn, BIAS, "applied"),
        q(
            "layer_norm.axes",
            "norm_ndim=2 normalizes the trailing two dims or the last only",
            _axes_row("layer_norm"),
            AXES,
            "trailing",
        ),
        q(
            "rms_norm.axes",
            "norm_ndim=2 normalizes the trailing two dims or the last only",
            _axes_row("rms_norm"),
            AXES,
            "trailing",
        ),
    ]
    defaults = [
        ("layer_norm.default_eps", _default_eps_row("layer_norm", "float32"), "float32"),
        ("rms_norm.default_eps", _default_eps_row("rms_norm", "float32"), "float32"),
        ("rms_norm.default_eps.bfloat16", _default_eps_row("rms_norm", "bfloat16"), "bfloat16"),
        ("batch_norm.default_eps", _default_eps_bn, "float32"),
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
                candidates=_eps_candidates(dtype),
            )
        )
    return [_with_nuisance(question) for question in table]


def _with_nuisance(question: Question) -> Question:
    """LN and BN answers hold whichever normalization variance the backend uses; the eps precision
    answer holds wherever the backend adds eps."""
    nuisance: list[Mapping[str, str]] = [{}]
    if question.op in ("layer_norm", "batch_norm") and question.hypotheses is not VARIANCE:
        nuisance.append({"variance": "unbiased"})
    if question.hypotheses is EPS_DTYPE:
        nuisance += [{**changes, "eps": "std"} for changes in nuisance]
    return replace(question, nuisance=tuple(nuisance))


QUESTIONS: dict[str, Question] = {question.name: question for question in _questions()}
