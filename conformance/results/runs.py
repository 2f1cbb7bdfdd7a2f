"""Results files grouped into runs: the shards of one run merge, other files stay separate runs.

Files whose headers carry ``shard`` with the same count, profile or cases file, tolerance and
ledger hashes and git commit are shards of one run (machines may differ); every other file is a
run of its own. Each run gets a short label for the report and the comparison.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from conformance.results import records
from conformance.results.fingerprints import FingerprintRecord
from conformance.results.header import Header
from conformance.results.properties import PropertyRecord
from conformance.results.records import ResultsFile
from conformance.results.result import Result

BAD_OUTCOMES: frozenset[str] = frozenset({"failed", "error", "xpassed"})
GOOD_OUTCOMES: frozenset[str] = frozenset({"passed", "xfailed"})
# Worst first: a group of results shows the first outcome of this list that occurs in it.
SEVERITY: tuple[str, ...] = ("error", "failed", "xpassed", "xfailed", "passed", "unsupported", "skipped")


def _run_key(f: ResultsFile) -> tuple[object, ...]:
    h = f.header
    return (
        f.shard[1] if f.shard else None,
        h.profile,
        h.cases_file,
        h.tolerances.sha256 if h.tolerances else None,
        h.ledger.sha256 if h.ledger else None,
        h.git_commit,
    )


@dataclass(frozen=True)
class Run:
    """One logical run: a single results file, or the shards of one run."""

    label: str
    files: tuple[ResultsFile, ...]

    @property
    def header(self) -> Header:
        return self.files[0].header

    @property
    def records(self) -> list[Result]:
        return [r for f in self.files for r in f.results]

    @property
    def fingerprints(self) -> list[FingerprintRecord]:
        return [r for f in self.files for r in f.fingerprints]

    @property
    def properties(self) -> list[PropertyRecord]:
        return [r for f in self.files for r in f.properties]

    @property
    def backends(self) -> list[str]:
        names = {r.backend for r in self.records}
        for f in self.files:
            names |= set(f.header.backends)
        return sorted(names)

    def by_key(self) -> dict[tuple[str, str, str], Result]:
        """Records by (backend, case id, check)."""
        return {r.key: r for r in self.records}


def worst(outcomes: Iterable[str]) -> str:
    present = set(outcomes)
    return next((o for o in SEVERITY if o in present), "skipped")


def read_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Read and group results files; raises ``SchemaError`` naming the file and record at fault."""
    return group([records.read_results(path) for path in paths])


def group(files: Sequence[ResultsFile]) -> list[Run]:
    groups: list[list[ResultsFile]] = []
    for f in files:
        home = next((g for g in groups if _joins(g, f)), None)
        if home is None:
            groups.append([f])
        else:
            home.append(f)
    labels = _labels([g[0].path for g in groups])
    return [
        Run(label, tuple(sorted(g, key=lambda f: f.shard or (0, 0))))
        for label, g in zip(labels, groups, strict=True)
    ]


def _joins(group: list[ResultsFile], f: ResultsFile) -> bool:
    if f.shard is None or group[0].shard is None or _run_key(group[0]) != _run_key(f):
        return False
    return all(g.shard is not None and g.shard[0] != f.shard[0] for g in group)


def _labels(paths: list[Path]) -> list[str]:
    """Short unique labels: file stems, with parent folders or a position only where needed."""
    for make in (
        lambda i, p: p.stem,
        lambda i, p: f"{p.parent.name}/{p.stem}",
        lambda i, p: f"{i + 1}:{p.stem}",
    ):
        labels = [make(i, p) for i, p in enumerate(paths)]
        if len(set(labels)) == len(labels):
            return labels
    raise AssertionError("positional labels are unique")
