"""Semantic fingerprints: which convention a backend implements, inferred from crafted probes.

Each question (conformance.fingerprint.questions) runs one probe case through the backend, exactly
as a check does (conformance.adapter.execute.run_backend: deadline, output validation), and measures the
outputs' distance to each hypothesis's NumPy emulation. The answer is the hypothesis that is within
rounding noise and clearly closer than every other; otherwise "unmatched" or "ambiguous".
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from conformance.adapter.backend import Backend, Capabilities, Inputs, Prepared, Unsupported
from conformance.adapter.execute import AdapterError, Execution, run_backend
from conformance.fingerprint.cases import Probe
from conformance.fingerprint.emulate import emulate
from conformance.fingerprint.questions import GATES, QUESTIONS, Question
from conformance.model.case import BATCH_NORM, GROUP_NORM, GROUP_OPS, Case
from conformance.model.dtypes import round_to
from conformance.model.geometry import geometry
from conformance.model.outputs import output_shape, produced
from conformance.results.fingerprints import NOT_ASKABLE, FingerprintRecord

__all__ = ["QUESTIONS", "SEPARATION", "ask", "classify", "judge"]

# The runner-up must be this many times the noise bound (or the best error) away to be told apart.
SEPARATION = 4.0


@dataclass(frozen=True)
class Judgement:
    answer: str
    matched: bool
    evidence: dict[str, float]
    estimate: float | None = None


def classify(evidence: Mapping[str, float], noise: float) -> tuple[str, bool]:
    """(answer, matched): the best hypothesis if within ``noise`` and clearly below the runner-up."""
    # A NaN error (the prediction itself broke down) is as far as an error gets.
    errors = {name: math.inf if math.isnan(error) else error for name, error in evidence.items()}
    ranked = sorted(errors.items(), key=lambda item: item[1])
    best_name, best = ranked[0]
    if not best <= noise:
        return "unmatched", False
    bound = SEPARATION * max(best, noise)
    close = [name for name, error in ranked[1:] if not error > bound]
    if close:
        return "ambiguous: " + " / ".join([best_name, *close]), False
    return best_name, True


def rel_error(actual: np.ndarray, predicted: np.ndarray) -> float:
    """max |actual - predicted| / rms(predicted); NaN or Inf where the prediction is finite is inf."""
    a = np.asarray(actual).astype(np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    same = (np.isnan(a) & np.isnan(p)) | (np.isinf(p) & (a == p))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same, 0.0, np.abs(a - p))
    diff = np.where(np.isnan(diff), np.inf, diff)
    finite = p[np.isfinite(p)]
    scale = float(np.sqrt(np.mean(np.square(finite)))) if finite.size else 0.0
    return float(diff.max()) / (scale or 1.0) if diff.size else 0.0


def mismatch(actual: np.ndarray, predicted: np.ndarray, mask: np.ndarray) -> float:
    """Fraction of masked elements whose value differs from the prediction (NaN equals NaN)."""
    a = np.asarray(actual).astype(np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    differ = ~((a == p) | (np.isnan(a) & np.isnan(p)))
    return float(differ[mask].mean())


def grid_error(actual: np.ndarray, predicted: np.ndarray, narrow: str = "bfloat16") -> float:
    """The larger of: how far apart the shares of finite elements that lie on ``narrow``'s grid are
    (actual against predicted: 1 where one is all on it and the other all off), and twice
    ``rel_error`` (a few of ``narrow``'s ulps stay within a 0.1 noise). An execution-precision reading
    that holds wherever a policy rounds inside the op (inputs, x * rstd, the weight product): each
    leaves outputs of ``narrow``, which outputs computed in a wider dtype almost never are."""
    a = np.asarray(actual).astype(np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    return max(abs(_on_grid(a, narrow) - _on_grid(p, narrow)), 2.0 * rel_error(a, p))


def _on_grid(values: np.ndarray, narrow: str) -> float:
    finite = values[np.isfinite(values)]
    if not finite.size:
        return 0.0
    with np.errstate(over="ignore"):
        return float(np.mean(round_to(finite, narrow).astype(np.float64) == finite))


def infer_eps(case: Case, inputs: Mapping[str, np.ndarray], y: np.ndarray) -> dict[str, tuple[float, float]]:
    """For each place eps can enter (and, for the ops that centre, each variance divisor; for
    GroupNorm, statistics per group or per channel), the eps that explains y and how well that eps
    then fits every row.

    The estimate comes from the rows of least variance, where y = d / sqrt(var + eps) gives
    eps = (d / y)^2 - var (inside the root) or eps = |d / y| - sqrt(var) (added to the standard
    deviation); the fit is the largest relative error of y predicted with it on all rows, so only
    the convention the backend uses fits the rows whose variance is comparable to eps.
    """
    x = np.asarray(inputs["x"], dtype=np.float64)
    if case.op in GROUP_OPS:
        x = x.reshape(geometry(case).shape)
    actual = np.asarray(y).astype(np.float64).reshape(x.shape)
    found = {}
    for suffix, d, narrow in _statistics(case, inputs, x):
        used = (d != 0) & (actual != 0) & np.isfinite(actual)
        var = np.broadcast_to(narrow, x.shape)
        tiny = used & (var == var[used].min()) if used.any() else used
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = np.abs(d / actual)
            for place, estimator, denominator in _PLACES:
                eps = _median(estimator(ratio, var)[tiny])
                fit = np.abs(d / denominator(var, eps) - actual) / np.abs(actual)
                found[place + suffix] = (eps, float(fit[used].max()) if used.any() else math.inf)
    return found


def _statistics(
    case: Case, inputs: Mapping[str, np.ndarray], x: np.ndarray
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name suffix, x - mean, variance) for each way the backend may compute its statistics; GN/IN
    ``x`` is the geometry view, where a group is the last two axes (a channel the last one)."""
    if case.op == BATCH_NORM:
        shape = (1, -1) + (1,) * (x.ndim - 2)
        d = x - np.asarray(inputs["running_mean"], dtype=np.float64).reshape(shape)
        return [("", d, np.asarray(inputs["running_var"], dtype=np.float64).reshape(shape))]
    if case.op in GROUP_OPS:
        reductions = {"": geometry(case).group_axes}
        if case.op == GROUP_NORM:
            reductions[", per channel"] = (3,)
    else:
        reductions = {"": tuple(range(x.ndim - case.norm_ndim, x.ndim))}
    found = []
    for name, axes in reductions.items():
        d = x - x.mean(axis=axes, keepdims=True) if case.op in _CENTRED else x
        var = np.square(d).mean(axis=axes, keepdims=True)
        found.append((name, d, var))
        if case.op in _CENTRED:
            n = d.size // var.size
            found.append((name + ", unbiased", d, var * n / (n - 1)))
    return found


# Ops that subtract a mean before normalizing (and may divide its variance by n - 1).
_CENTRED = frozenset({"layer_norm", "group_norm", "instance_norm"})
_PLACES: tuple[tuple[str, Any, Any], ...] = (
    ("inside-sqrt", lambda r, v: np.square(r) - v, lambda v, e: np.sqrt(v + e)),
    ("added-to-std", lambda r, v: r - np.sqrt(v), lambda v, e: np.sqrt(v) + e),
)


def _median(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else math.nan


def judge(question: Question, probe: Probe, outputs: Mapping[str, np.ndarray]) -> Judgement:
    """Evidence (error under each hypothesis) and the answer it supports."""
    noise = question.noise(probe.case)
    if question.default_eps:
        return _judge_default_eps(question, probe, outputs["y"], noise)
    evidence = {}
    for name, family in question.hypotheses.items():
        errors = []
        for conv in (replace(c, **changes) for c in family for changes in question.nuisance):
            predicted = emulate(probe.case, probe.inputs, conv, grad=probe.grad)
            errors.append(
                max(_error(question, probe, out, outputs[out], predicted[out]) for out in probe.outputs)
            )
        evidence[name] = min(errors)
    answer, matched = classify(evidence, noise)
    return Judgement(answer, matched, evidence)


def _judge_default_eps(question: Question, probe: Probe, y: np.ndarray, noise: float) -> Judgement:
    """The candidate closest to the eps of the placement that fits every row; unmatched if none fits."""
    found = infer_eps(probe.case, probe.inputs, y)
    estimate, fit = min(found.values(), key=lambda pair: pair[1])
    evidence = {name: abs(estimate / value - 1.0) for name, value in question.candidates.items()}
    answer, matched = classify(evidence, noise)
    if not fit <= FIT[probe.case.dtype]:
        answer, matched = "unmatched", False
    return Judgement(answer, matched, evidence, estimate)


# How closely y predicted with the inferred eps must match every row: a few roundings of y.
FIT: dict[str, float] = {"float64": 1e-9, "float32": 1e-4, "float16": 0.02, "bfloat16": 0.05}


def _error(question: Question, probe: Probe, output: str, actual: np.ndarray, predicted: np.ndarray) -> float:
    if question.metric == "mismatch":
        return mismatch(actual, predicted, probe.mask[output])
    if question.metric == "grid":
        return grid_error(actual, predicted)
    return rel_error(actual, predicted)


class _DefaultEps:
    """A view of a backend whose prepare() is its optional prepare_default_eps() hook."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = backend.name

    def capabilities(self) -> Capabilities:
        return self.backend.capabilities()

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        prepared: Prepared = self.backend.prepare_default_eps(case, inputs)  # type: ignore[attr-defined]
        return prepared


_GATE_NAMES = frozenset(GATES.values())
# Per backend object: the execution-precision answers its gated questions have asked for.
_EXECUTES_IN: weakref.WeakKeyDictionary[Any, dict[str, str | None]] = weakref.WeakKeyDictionary()


def _seen(backend: Backend) -> dict[str, str | None]:
    try:
        return _EXECUTES_IN.setdefault(backend, {})
    except TypeError:  # not weakly referenceable: asked every time
        return {}


def _executes_in(backend: Backend, caps: Capabilities, gate: str, timeout: float) -> str | None:
    """The narrower dtype ``backend`` computes the gate question's op and dtype in (its matched answer,
    where that is not the dtype itself), else None: asked once per backend object (``ask`` keeps the
    answer of a gate question it is asked directly too)."""
    seen = _seen(backend)
    return seen[gate] if gate in seen else _narrower(ask(backend, caps, QUESTIONS[gate], timeout))


def _narrower(answer: FingerprintRecord) -> str | None:
    narrower = answer.outcome == "answered" and answer.matched and answer.answer != answer.reference
    return answer.answer if narrower else None


def _kept(backend: Backend, answer: FingerprintRecord) -> FingerprintRecord:
    """A gate question's answer, kept for the questions it gates."""
    _seen(backend)[answer.question] = _narrower(answer)
    return answer


def _run(target: Backend, probe: Probe, timeout: float) -> Execution:
    shapes = {name: output_shape(probe.case, name) for name in produced(probe.case, probe.grad)}
    return run_backend(
        target, probe.case, probe.inputs, grad=probe.grad, calls=1, expected_shapes=shapes, timeout=timeout
    )


def ask(backend: Backend, caps: Capabilities, question: Question, timeout: float) -> FingerprintRecord:
    """Run ``question``'s probe through ``backend`` and judge the outputs; never raises for the adapter."""
    start = time.perf_counter()
    probe = question.probe()

    def record(outcome: str, reason: str = "", **fields: Any) -> FingerprintRecord:
        made = FingerprintRecord(
            backend.name,
            question.name,
            outcome,
            reference=question.reference,
            probe=probe.case.to_dict(),
            reason=reason,
            duration_s=time.perf_counter() - start,
            **fields,
        )
        return _kept(backend, made) if question.name in _GATE_NAMES else made

    why = caps.why_not(probe.case, grad=probe.grad)
    if why is None and question.default_eps and not hasattr(backend, "prepare_default_eps"):
        why = "no prepare_default_eps() hook: the adapter reports no library default eps"
    if why is not None:
        return record("unsupported", why)
    gate = GATES.get((question.op, probe.case.dtype))
    narrower = None if gate in (None, question.name) else _executes_in(backend, caps, gate, timeout)
    if narrower is not None:
        # The probe's arithmetic is not what runs: every hypothesis assumes the probe's dtype.
        why = f"{gate} answered {narrower}: the {probe.case.dtype} probe's conventions cannot be read there"
        return record("answered", why, answer=f"{NOT_ASKABLE}{narrower}", matched=False)
    target = _DefaultEps(backend) if question.default_eps else backend
    note = ""
    try:
        try:
            run = _run(target, probe, timeout)
        except Unsupported as exc:
            # A class without a bias (CohereLayerNorm) refuses the probe's zero bias: where the bias is
            # zero the same question can be asked without it (the same predictions). Its own refusal
            # of that probe, if any, is reported with the first.
            bare = probe.without_bias()
            if bare is None or caps.why_not(bare.case, grad=bare.grad) is not None:
                raise
            try:
                run = _run(target, bare, timeout)
            except Unsupported as again:
                raise Unsupported(f"{exc}; without its bias: {again}") from again
            probe, note = bare, f"asked without the probe's zero bias, which prepare() refused: {exc}"
    except Unsupported as exc:
        return record("unsupported", f"prepare() raised Unsupported: {exc}")
    except AdapterError as exc:
        return record("error", f"{backend.name} probe {probe.case.id}: {exc}")
    verdict = judge(question, probe, run.outputs[0])
    return record(
        "answered",
        note,
        answer=verdict.answer,
        matched=verdict.matched,
        evidence=verdict.evidence,
        metric="eps" if question.default_eps else question.metric,
        noise=question.noise(probe.case),
        estimate=verdict.estimate,
    )
