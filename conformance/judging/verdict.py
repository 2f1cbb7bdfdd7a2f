"""From comparisons to a verdict: each output against the oracle, then the ledger of known deviations.

``compare_outputs`` is shared by the checks, the failure shrinker, replay and re-judging; ``judge``
applies the ledger: a failure its entry's model reproduces (or, without a model, its band holds) is
xfailed and explained; a listed output that passes is xpassed only in strict mode.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from conformance.judging import messages, models
from conformance.judging.allowance import factors
from conformance.judging.compare import compare
from conformance.judging.ledger import Deviation, Ledger
from conformance.judging.platform import Platform
from conformance.judging.tolerances import ToleranceTable
from conformance.model.case import Case
from conformance.model.outputs import output_dtype
from conformance.results.result import ComparisonRecord, Explanation


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check with its comparisons and, per output, the ledger entry that applied.

    ``warnings``, ``info``, ``bundle`` and ``hung`` are filled in by the running layer (what the adapter
    emitted and reported, where a failure bundle was saved, and what did not finish within the call
    timeout).
    """

    outcome: str
    reason: str = ""
    comparisons: tuple[ComparisonRecord, ...] = ()
    ledger: Mapping[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    info: Mapping[str, object] = field(default_factory=dict)
    bundle: str = ""
    hung: str = ""
    outputs: str = ""  # a failed or xfailed check's compared outputs, encoded for re-judging


def compare_outputs(
    case: Case,
    inputs: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    actual: Mapping[str, np.ndarray],
    names: tuple[str, ...],
    tolerances: ToleranceTable,
) -> tuple[ComparisonRecord, ...]:
    """Each named output against the oracle under its tolerance rule."""
    return tuple(
        compare(
            name,
            actual[name],
            expected[name],
            tolerances.lookup(case.op, name, output_dtype(case, name), case.dist),
            output_dtype(case, name),
            factors(case, name, inputs, expected),
        )
        for name in names
    )


@dataclass(frozen=True)
class Evidence:
    """What a model needs to explain an output: the case's inputs, the oracle's outputs, the backend's,
    and the tolerance table that judged them. ``recorded`` holds, for outputs whose values were not
    stored (a re-judged large case), the explanation the live run computed from the whole output."""

    inputs: Mapping[str, np.ndarray]
    expected: Mapping[str, np.ndarray]
    actual: Mapping[str, np.ndarray]
    tolerances: ToleranceTable
    recorded: Mapping[str, Explanation] = field(default_factory=dict)


def judge(
    backend: str,
    case: Case,
    check: str,
    comparisons: tuple[ComparisonRecord, ...],
    ledger: Ledger,
    reproduce: str,
    info: Mapping[str, object] | None = None,
    where: Platform | None = None,
    evidence: Evidence | None = None,
) -> Verdict:
    """Apply the ledger: a failing output that its entry explains (the entry's model reproduces it
    within the same tolerance, or a band entry's band holds it) is xfailed; any other failure fails.
    ``info`` is what the backend recorded for the case and ``where`` the platform it ran on (entries
    may require either). In strict mode an output that passes although its entry lists the case is
    xpassed."""
    passed = all(c.passed for c in comparisons)
    if passed and not ledger.strict:
        # Only a strict run asks the ledger of outputs that pass: most results never scan it.
        return Verdict("passed", "", comparisons)
    found = {c.output: ledger.applicable(backend, case, check, c.output, info, where) for c in comparisons}
    listed = [c for c in comparisons if c.passed and any(e.lists_cases for e in found[c.output])]
    if ledger.strict and listed:
        # The entry the message names: the first output that passed although an entry expects it to fail.
        first = listed[0]
        entry = next(e for e in found[first.output] if e.lists_cases)
        text = messages.stale(backend, case, check, first, entry, reproduce)
        return Verdict("xpassed", text, comparisons, {first.output: entry.index})
    if passed:
        return Verdict("passed", "", comparisons)
    models = _Models(case, evidence)
    judged: list[ComparisonRecord] = []
    entries: dict[str, Deviation] = {}
    for c in comparisons:
        if c.passed or not found[c.output]:
            judged.append(c)
            continue
        # The first entry whose model explains the output, else the first band that holds it, else the
        # first that applies (named in the failure): a model's explanation is worth more than a band's.
        tries = [(e, models.explain(c, e)) for e in found[c.output]]
        explaining = [(e, t) for e, t in tries if _explained(t, e)]
        entry, tried = next((p for p in explaining if p[0].model), explaining[0] if explaining else tries[0])
        judged.append(tried)
        entries[c.output] = entry
    failing = [c for c in judged if not c.passed]
    cited = {c.output: entries[c.output].index for c in failing if c.output in entries}
    if all(_explained(c, entries.get(c.output)) for c in failing):
        reasons = "; ".join(_because(c, entries[c.output]) for c in failing)
        return Verdict("xfailed", reasons, tuple(judged), cited)
    text = "\n\n".join(
        messages.failure(backend, case, check, c, entries.get(c.output), reproduce) for c in failing
    )
    return Verdict("failed", text, tuple(judged), cited)


def _explained(c: ComparisonRecord, entry: Deviation | None) -> bool:
    if entry is None:
        return False
    if entry.model:
        return c.explained is not None and c.explained.passed
    return entry.covers(c)


def _because(c: ComparisonRecord, entry: Deviation) -> str:
    how = (
        f"model {entry.model} reproduces it (worst_ratio {c.explained.worst_ratio:.3g} against the model)"
        if c.explained is not None
        else f"within band {entry.band[1]:g}, no model yet"
    )
    return f"{c.output}: {entry.reason} ({how}; ledger deviation[{entry.index}])"


def _bias_only(c: ComparisonRecord) -> bool:
    """Whether the comparison failed only on its rounding bias (every element within its allowance)."""
    return not c.rounding_passed and c.worst_ratio <= 1.0


def _at_worst(
    model: str, c: ComparisonRecord, answer: np.ndarray, within: tuple[float, float] | None = None
) -> Explanation:
    """The model judged at the comparison's recorded worst element alone, under its recorded allowance
    (a re-judged result whose outputs were not stored): the one element the record holds. ``within``
    is (atol_effective, rtol) of the dtype a narrowed model executes in, when it is not the case's."""
    if not c.worst_index or _bias_only(c):
        # A rounding-bias failure is a property of the whole output: one element cannot show it.
        return Explanation(model, math.inf, math.nan, False, point=True)
    m = float(np.asarray(answer)[c.worst_index])
    recorded = (c.tolerance.atol_effective, c.tolerance.rtol)

    def ratio(a: float, e: float, rule: tuple[float, float]) -> float:
        if a == e or (math.isnan(a) and math.isnan(e)):
            return 0.0  # the same value, or NaN where the model has NaN (as compare treats them)
        allowed = rule[0] + rule[1] * abs(e)
        return abs(a - e) / allowed if allowed > 0 else math.inf

    against = ratio(c.actual_at_worst, m, within or recorded)
    return Explanation(model, against, ratio(m, c.expected_at_worst, recorded), against <= 1.0, point=True)


# A model's answer, and the case and inputs whose tolerance rule judges it (models.execution).
_Answer = tuple[Mapping[str, np.ndarray], Case, Mapping[str, np.ndarray]]


class _Models:
    """Each model a judgement needs, evaluated once, and its answer compared like the oracle's."""

    def __init__(self, case: Case, evidence: Evidence | None) -> None:
        self.case = case
        self.evidence = evidence
        self.answers: dict[str, _Answer] = {}

    def explain(self, c: ComparisonRecord, entry: Deviation) -> ComparisonRecord:
        """``c`` with the entry's model judged against it (unchanged for a band entry)."""
        if not entry.model or self.evidence is None or c.problem:
            return c
        with np.errstate(all="ignore"):  # models emulate overflow and NaN on purpose
            return self._explain(c, entry, self.evidence)

    def _answer(self, name: str, ev: Evidence) -> _Answer:
        """The model's answer (empty where it does not speak of the case's op) and the case and inputs
        whose tolerance rule judges it, computed once per model."""
        if name not in self.answers:
            found = models.resolve(name)
            runs, runs_inputs = models.execution(found, self.case, ev.inputs)
            try:
                answer = found(self.case, ev.inputs)
            except models.ModelError:
                answer = {}  # an entry may name several ops; its model speaks of some of them only
            self.answers[name] = (answer, runs, runs_inputs)
        return self.answers[name]

    def _explain(self, c: ComparisonRecord, entry: Deviation, ev: Evidence) -> ComparisonRecord:
        answer, runs, runs_inputs = self._answer(entry.model, ev)
        if c.output not in answer:
            return dataclasses.replace(c, explained=Explanation(entry.model, math.inf, math.nan, False))
        name, case = c.output, self.case
        narrowed = runs is not case
        if narrowed:
            # A model of a narrower execution (models.Narrowed) is judged as that dtype's backend would be.
            runs_dtype = output_dtype(runs, name)
            runs_tol = ev.tolerances.lookup(runs.op, name, runs_dtype, runs.dist)
            runs_factors = factors(runs, name, runs_inputs, answer)
        if name not in ev.actual:
            before = ev.recorded.get(name)
            if _bias_only(c) and before is not None and before.model == entry.model and before.passed:
                # A rounding bias is a property of the whole output, which the live run had and the
                # record has not: the same model's verdict on it stands.
                return dataclasses.replace(c, explained=before)
            within = (runs_factors.atol(runs_tol), runs_tol.rtol) if narrowed else None
            return dataclasses.replace(c, explained=_at_worst(entry.model, c, answer[name], within))
        dtype = output_dtype(case, name)
        tol = ev.tolerances.lookup(case.op, name, dtype, case.dist)
        scale = factors(case, name, ev.inputs, ev.expected)
        if not narrowed:  # the same rule as the oracle's comparison, factors computed from the oracle
            runs_dtype, runs_tol, runs_factors = dtype, tol, scale
        against = compare(name, ev.actual[name], answer[name], runs_tol, runs_dtype, runs_factors)
        model = compare(name, answer[name], ev.expected[name], tol, dtype, scale)
        return dataclasses.replace(
            c, explained=Explanation(entry.model, against.worst_ratio, model.worst_ratio, against.passed)
        )
