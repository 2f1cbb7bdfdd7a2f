"""Where a run spent its time, from its results file: per backend and per phase (``normconf profile``).

Every check's record carries ``extra.phases`` (conformance.running.checks.Phases): prepare (less what
the adapter reports as compiling or exporting), compile, call, oracle, judging. Fingerprint probes
and properties are phases of their own, by their records' durations. The header's ``timing`` gives
the wall time and the worker count, so the seconds no record holds are shown too: pytest and
xdist (collection, scheduling, fixtures, reports crossing to the controller) and idle workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.running import summary

# The phases of a check, in the order they run; "other" holds records without phase timings
# (unsupported, not run, or written before records carried them).
CHECK_PHASES = ("prepare", "compile", "call", "oracle", "judge")
PHASES = (*CHECK_PHASES, "fingerprint", "properties", "other")
_RECORD_PHASES = {"fingerprint": "fingerprint", "property": "properties"}


@dataclass
class Row:
    """One backend's records: how many, and their seconds per phase."""

    name: str
    records: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def add(self, record: Mapping[str, Any]) -> None:
        self.records += 1
        duration = _number(record.get("duration_s"))
        kind = record.get("kind", "result")
        if kind in _RECORD_PHASES:
            self.seconds[_RECORD_PHASES[kind]] += duration
            return
        extra = record.get("extra")
        phases = extra.get("phases") if isinstance(extra, Mapping) else None
        if not isinstance(phases, Mapping):
            self.seconds["other"] += duration
            return
        for phase in CHECK_PHASES:
            self.seconds[phase] += _number(phases.get(f"{phase}_s"))


@dataclass(frozen=True)
class Profile:
    """A run's rows (slowest backend first), their sum, and the run's wall time and workers."""

    rows: tuple[Row, ...]
    total: Row
    wall_s: float | None
    workers: int
    write_s: float | None

    @property
    def capacity_s(self) -> float | None:
        """Worker-seconds the run had: wall time x workers (x 1 without xdist)."""
        return None if self.wall_s is None else self.wall_s * max(self.workers, 1)


def profile(header: Mapping[str, Any], records: Iterable[Mapping[str, Any]]) -> Profile:
    rows: dict[str, Row] = {}
    total = Row("all")
    for record in records:
        backend = str(record.get("backend", "?"))
        rows.setdefault(backend, Row(backend)).add(record)
        total.add(record)
    timing = header.get("timing")
    timing = timing if isinstance(timing, Mapping) else {}
    wall = timing.get("wall_s")
    write = timing.get("write_s")
    workers = timing.get("workers")
    return Profile(
        tuple(sorted(rows.values(), key=lambda row: -row.total)),
        total,
        float(wall) if isinstance(wall, int | float) else None,
        workers if isinstance(workers, int) else 0,
        float(write) if isinstance(write, int | float) else None,
    )


def lines(found: Profile) -> list[str]:
    """The profile as an aligned table with the seconds outside the records below it."""
    head = ["backend", "records", "seconds", "share", *(_LABELS[p] for p in PHASES)]
    everything = found.total.total or 1.0
    body = [_cells(row, everything) for row in (*found.rows, found.total)]
    out = summary.aligned(head, body)
    capacity = found.capacity_s
    if capacity is None:
        out.append("run: no wall time in the header (a file written before headers carried timing)")
        return out
    outside = capacity - found.total.total
    workers = f"{found.workers} workers" if found.workers else "one process"
    out.append(
        f"run: {found.wall_s:,.1f} s wall on {workers} = {capacity:,.1f} worker-seconds; in records"
        f" {found.total.total:,.1f} s ({found.total.total / capacity:.0%})"
    )
    out.append(
        f"outside the records: {outside:,.1f} s ({outside / capacity:.0%}): pytest and xdist (collection,"
        " scheduling, fixtures, reports), workers idle at the end"
    )
    if found.write_s is not None:
        out.append(f"writing the results file: {found.write_s:,.2f} s serializing in the controller")
    return out


_LABELS = {
    "prepare": "prepare",
    "compile": "compile/export",
    "call": "call",
    "oracle": "oracle",
    "judge": "judging",
    "fingerprint": "fingerprint",
    "properties": "properties",
    "other": "other",
}


def _cells(row: Row, everything: float) -> list[str]:
    phases = [f"{row.seconds[p]:,.1f}" for p in PHASES]
    return [row.name, f"{row.records:,}", f"{row.total:,.1f}", f"{row.total / everything:.0%}", *phases]


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
