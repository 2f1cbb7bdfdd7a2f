"""Pure table building for the report's Conventions and Properties sections.

Conventions: fingerprint question x backend column, each answer with its evidence (the error under
every hypothesis), answers that differ from normconf's reference marked, and the answers that changed
between runs. Properties: metamorphic property x backend column, each outcome with its shrunk
counterexample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from conformance.results.fingerprints import NOT_ASKABLE, FingerprintRecord
from conformance.results.properties import PropertyRecord
from conformance.results.runs import Run
from reports.tables import Column, columns, ratio_text


@dataclass(frozen=True)
class Answer:
    """One backend's answer: the table text, its state, and the evidence behind it."""

    text: str
    state: str  # reference | differs | unmatched | not-asked | error
    evidence: tuple[tuple[str, str], ...]
    reference: str
    reason: str
    noise: str = ""  # the error a hypothesis had to stay within to match

    @property
    def nearest(self) -> str:
        """An unmatched answer's finding: the nearest hypothesis and its error against the noise."""
        if not self.evidence:
            return "no hypothesis was evaluated"
        hypothesis, error = self.evidence[0]
        needs = f" (a match needs at most {self.noise})" if self.noise else ""
        return f"nearest {hypothesis} at {error}{needs}"


@dataclass(frozen=True)
class ConventionRow:
    question: str
    op: str
    cells: Mapping[str, Answer]


@dataclass(frozen=True)
class Conventions:
    columns: tuple[Column, ...]
    rows: tuple[ConventionRow, ...]
    changed: tuple[str, ...]

    def unmatched(self) -> list[tuple[str, str, Answer]]:
        """(question, column key, answer) of every answer no hypothesis matched: findings, listed."""
        return [
            (row.question, column.key, row.cells[column.id])
            for row in self.rows
            for column in self.columns
            if column.id in row.cells and row.cells[column.id].state == "unmatched"
        ]


def _state(record: FingerprintRecord) -> str:
    if record.outcome == "error":
        return "error"
    if record.outcome != "answered":
        return "not-asked"
    if record.answer.startswith(NOT_ASKABLE):
        return "not-askable"
    if not record.matched:
        return "unmatched"
    return "differs" if record.differs else "reference"


def _answer(record: FingerprintRecord) -> Answer:
    evidence = tuple(
        (hypothesis, f"{error:.3g}")
        for hypothesis, error in sorted(record.evidence.items(), key=lambda kv: kv[1])
    )
    noise = f"{record.noise:.3g}" if record.noise else ""
    return Answer(record.cell, _state(record), evidence, record.reference, record.reason, noise)


Cell = TypeVar("Cell")
Rec = TypeVar("Rec", FingerprintRecord, PropertyRecord)


def _grid(
    runs: Sequence[Run],
    records: Callable[[Run], Sequence[Rec]],
    row: Callable[[Rec], str],
    make: Callable[[Rec], Cell],
) -> tuple[list[Column], dict[str, dict[str, Cell]]]:
    """(the columns that have such records, row name -> column id -> cell)."""
    present = {(run.label, r.backend) for run in runs for r in records(run)}
    cols = [c for c in columns(runs) if (c.run, c.backend) in present]
    by_pair = {(c.run, c.backend): c.id for c in cols}
    cells: dict[str, dict[str, Cell]] = {}
    for run in runs:
        for record in records(run):
            cells.setdefault(row(record), {})[by_pair[(run.label, record.backend)]] = make(record)
    return cols, cells


def _fingerprints(run: Run) -> Sequence[FingerprintRecord]:
    return run.fingerprints


def _properties(run: Run) -> Sequence[PropertyRecord]:
    return run.properties


def conventions(runs: Sequence[Run]) -> Conventions | None:
    """The fingerprint of every backend, or None when no run asked any question."""
    cols, cells = _grid(runs, _fingerprints, lambda r: r.question, _answer)
    if not cols:
        return None
    rows = tuple(ConventionRow(q, q.split(".", 1)[0], cells[q]) for q in sorted(cells))
    return Conventions(tuple(cols), rows, tuple(_changed(runs)))


def _changed(runs: Sequence[Run]) -> list[str]:
    """Answers of one backend to one question that differ between runs (in run order)."""
    seen: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for run in runs:
        for record in run.fingerprints:
            if record.outcome == "answered":
                seen.setdefault((record.backend, record.question), []).append((run.label, record.answer))
    lines = []
    for (backend, question), answers in sorted(seen.items()):
        if len({answer for _, answer in answers}) > 1:
            lines.append(f"{backend} {question}: " + " → ".join(f"{a} ({label})" for label, a in answers))
    return lines


@dataclass(frozen=True)
class PropertyCell:
    outcome: str
    text: str
    examples: int
    worst_ratio: str
    bitwise: str
    counterexample: tuple[tuple[str, str], ...]
    reason: str


@dataclass(frozen=True)
class PropertyRow:
    name: str
    cells: Mapping[str, PropertyCell]


@dataclass(frozen=True)
class Properties:
    columns: tuple[Column, ...]
    rows: tuple[PropertyRow, ...]


def _property_cell(record: PropertyRecord) -> PropertyCell:
    example = tuple((str(k), str(v)) for k, v in (record.counterexample or {}).items())
    bitwise = {True: "yes", False: "no", None: ""}[record.bitwise]
    ratio = ratio_text(record.worst_ratio) if record.examples else ""
    return PropertyCell(record.outcome, record.cell, record.examples, ratio, bitwise, example, record.reason)


def properties(runs: Sequence[Run]) -> Properties | None:
    """Every backend's metamorphic properties, or None when none ran."""
    cols, cells = _grid(runs, _properties, lambda r: r.property, _property_cell)
    if not cols:
        return None
    return Properties(tuple(cols), tuple(PropertyRow(name, cells[name]) for name in cells))
