"""``--save-failures``: shrink a failing comparison check to a few numbers and save it as a bundle.

Shrinking keeps what still fails: the fewest rows of the original input (LN/RMS rows, BN channels
and GN/IN samples are independent), and the smallest feature size whose regenerated inputs (same
dist and seed) fail; the smaller of the two is saved, with the original case and figures beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from conformance import oracle
from conformance.adapter.backend import Backend, Unsupported
from conformance.adapter.execute import AdapterError, run_backend
from conformance.failures import bundle
from conformance.judging.tolerances import ToleranceTable
from conformance.judging.verdict import compare_outputs
from conformance.model.case import BATCH_NORM, GROUP_OPS, Case, CaseError
from conformance.model.inputs import PER_ROW, for_call, make_inputs
from conformance.model.outputs import output_shape, produced
from conformance.results.result import ComparisonRecord

Arrays = dict[str, np.ndarray]
# Backend runs one failure may spend on shrinking (each on a smaller input than the last).
MAX_RUNS = 24
_PER_ROW = PER_ROW


@dataclass(frozen=True)
class Attempt:
    """One run of a case on explicit inputs, with the oracle's outputs and the comparisons."""

    case: Case
    inputs: Arrays
    actual: Mapping[str, np.ndarray]
    expected: Mapping[str, np.ndarray]
    comparisons: tuple[ComparisonRecord, ...]

    @property
    def failing(self) -> set[str]:
        return {c.output for c in self.comparisons if not c.passed}

    @property
    def numel(self) -> int:
        return int(self.inputs["x"].size)


Runner = Callable[[Case, Arrays], "Attempt | None"]


def runner(
    backend: Backend, names: tuple[str, ...], grad: bool, tolerances: ToleranceTable, timeout: float
) -> Runner:
    """Run ``backend`` on explicit inputs and compare ``names``; None if it refuses or fails to run."""

    def attempt(case: Case, inputs: Arrays) -> Attempt | None:
        given = for_call(inputs, grad=grad)
        shapes = {name: output_shape(case, name) for name in produced(case, grad)}
        try:
            execution = run_backend(
                backend, case, given, grad=grad, calls=1, expected_shapes=shapes, timeout=timeout
            )
        except (Unsupported, AdapterError):
            return None
        expected = oracle.evaluate(case, given, grad=grad)
        comparisons = compare_outputs(case, given, expected, execution.outputs[0], names, tolerances)
        return Attempt(case, dict(given), execution.outputs[0], expected, comparisons)

    return attempt


# ----------------------------------------------------------------------------- shrinking
def units(case: Case) -> int:
    """Independent groups that can be dropped: LN/RMS rows, BN channels, GN/IN samples."""
    if case.op in GROUP_OPS:
        return case.shape[0]
    return case.shape[1] if case.op == BATCH_NORM else case.rows


def take(case: Case, inputs: Arrays, keep: list[int]) -> tuple[Case, Arrays] | None:
    """The case and inputs restricted to groups ``keep`` (leading LN/RMS dims collapse to one)."""
    if case.op in GROUP_OPS:
        # Samples are independent (the running statistics' batch average has fewer terms, which
        # the oracle follows); groups within a sample share parameters and stay.
        shape = (len(keep), *case.shape[1:])
        taken = {k: (v[keep] if k in _PER_ROW else v) for k, v in inputs.items()}
    elif case.op == BATCH_NORM:
        shape = (case.shape[0], len(keep), *case.shape[2:])
        taken = {k: (np.take(v, keep, axis=1) if k in _PER_ROW else v[keep]) for k, v in inputs.items()}
    else:
        trailing = case.param_shape
        if len(trailing) == len(case.shape):
            return None  # one group only: nothing to drop
        shape = (len(keep), *trailing)
        taken = {k: (v.reshape(-1, *trailing)[keep] if k in _PER_ROW else v) for k, v in inputs.items()}
    contiguous = {k: np.ascontiguousarray(v) for k, v in taken.items()}
    return dataclasses.replace(case, shape=shape), contiguous


def _worst_unit(attempt: Attempt) -> int | None:
    """The group holding the worst element of the worst failing output, where that is defined."""
    failing = [c for c in attempt.comparisons if not c.passed and c.worst_index]
    if not failing:
        return None
    worst = max(failing, key=lambda c: c.worst_ratio)
    index, case = worst.worst_index, attempt.case
    if case.op in GROUP_OPS:
        return index[0] if len(index) == len(case.shape) else None
    if case.op == BATCH_NORM:
        return index[1] if len(index) == len(case.shape) else index[0]
    if len(index) != len(case.shape):
        return None  # a parameter gradient: every row contributes
    leading = case.shape[: len(case.shape) - case.norm_ndim]
    return int(np.ravel_multi_index(index[: len(leading)], leading))


@dataclass
class _Search:
    run: Runner
    target: set[str]
    runs: int = 0

    def fails(self, case: Case, inputs: Arrays) -> Attempt | None:
        if self.runs >= MAX_RUNS:
            return None
        self.runs += 1
        found = self.run(case, inputs)
        return found if found is not None and found.failing & self.target else None

    def subset(self, current: Attempt, keep: list[int]) -> Attempt | None:
        taken = take(current.case, current.inputs, keep)
        return None if taken is None else self.fails(*taken)

    def fewest_units(self, current: Attempt) -> tuple[Attempt, list[int]]:
        """Drop groups while the rest still fails: the worst group alone, else halves."""
        origin = list(range(units(current.case)))
        worst = _worst_unit(current)
        if worst is not None and len(origin) > 1:
            alone = self.subset(current, [worst])
            if alone is not None:
                return alone, [worst]
        while len(origin) > 1:
            half = len(origin) // 2
            for part in (list(range(half)), list(range(half, len(origin)))):
                smaller = self.subset(current, part)
                if smaller is not None:
                    current, origin = smaller, [origin[i] for i in part]
                    break
            else:
                break
        return current, origin

    def smaller_features(self, case: Case) -> Attempt | None:
        """The smallest power-of-two last dim (below the case's) whose regenerated inputs fail."""
        last = case.shape[-1]
        if case.op == BATCH_NORM or last == 1:
            return None
        size = 1
        while size < last:
            try:
                smaller = dataclasses.replace(case, shape=(*case.shape[:-1], size))
            except CaseError:
                smaller = None
            found = None if smaller is None else self.fails(smaller, make_inputs(smaller, grad=True))
            if found is not None:
                return found
            size *= 2
        return None


def fewest_units(first: Attempt, run: Runner) -> tuple[Attempt, list[int]]:
    """The fewest groups of ``first``'s own inputs that still fail, and which of its groups they are."""
    return _Search(run, first.failing).fewest_units(first)


def shrink(first: Attempt, run: Runner) -> tuple[Attempt, dict[str, Any]]:
    """The smallest failing variant of ``first`` and how it was found."""
    search = _Search(run, first.failing)
    best, kept = search.fewest_units(first)
    info: dict[str, Any] = {"kept_units": kept, "regenerated": False}
    regenerated = search.smaller_features(first.case)
    if regenerated is not None:
        reduced, kept_new = search.fewest_units(regenerated)
        if reduced.numel < best.numel:
            best = reduced
            info = {
                "kept_units": kept_new,
                "regenerated": True,
                "regenerated_case": regenerated.case.to_dict(),
            }
    info["runs"] = search.runs
    return best, info


# ----------------------------------------------------------------------------- saving
def save(
    root: Path,
    backend: str,
    check: str,
    outcome: str,
    reason: str,
    first: Attempt,
    run: Runner,
    *,
    grad: bool,
    tolerances: ToleranceTable,
) -> Path:
    """Shrink ``first`` and write its bundle under ``root``; returns the bundle folder."""
    shrunk, info = shrink(first, run)
    names = tuple(c.output for c in first.comparisons)
    meta = {
        "backend": backend,
        "check": check,
        "outcome": outcome,
        "reason": reason,
        "grad": grad,
        "outputs": list(names),
        "case": shrunk.case.to_dict(),
        "original_case": first.case.to_dict(),
        "figures": [c.to_dict() for c in shrunk.comparisons],
        "original_figures": [c.to_dict() for c in first.comparisons],
        "shrink": info,
        "tolerances": {"path": tolerances.path, "sha256": tolerances.sha256},
        "note": "inputs.npz is authoritative: a shrunk case's id no longer generates these inputs",
    }
    arrays = {
        "inputs": shrunk.inputs,
        "expected": {n: np.asarray(shrunk.expected[n]) for n in names},
        "actual": {n: np.asarray(shrunk.actual[n]) for n in names},
    }
    return bundle.write(root, bundle.slug(backend, check, first.case.id), meta, arrays)
