"""Run-to-run comparison for the report: every run against the first, through conformance.results.diff."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conformance.results.benchjson import BenchFile
from conformance.results.diff import Diff, Thresholds, diff
from conformance.results.runs import Run


@dataclass(frozen=True)
class RunChange:
    base: str
    new: str
    diff: Diff


def changes(runs: Sequence[Run], benches: Sequence[BenchFile], thresholds: Thresholds) -> list[RunChange]:
    """Each later run against the first. With one benchmark file per run (same order), speeds too."""
    paired = len(benches) == len(runs)
    found = []
    for i, run in enumerate(runs[1:], start=1):
        d = diff(
            runs[0].records,
            run.records,
            thresholds,
            benches[0].by_key() if paired else None,
            benches[i].by_key() if paired else None,
        )
        found.append(RunChange(runs[0].label, run.label, d))
    return found
