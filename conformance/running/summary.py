"""Terminal summary: backend x op counts of each outcome, the fingerprint and the properties tables."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from conformance.fingerprint import QUESTIONS
from conformance.results.fingerprints import FingerprintRecord
from conformance.results.properties import PropertyRecord
from conformance.results.records import Record
from conformance.results.result import Result
from conformance.results.schema import OUTCOMES
from conformance.running.outcomes import SKIPPING


def _results(records: Iterable[Record]) -> list[Result]:
    return [r for r in records if isinstance(r, Result)]


def _fingerprints(records: Iterable[Record]) -> list[FingerprintRecord]:
    return [r for r in records if isinstance(r, FingerprintRecord)]


def _properties(records: Iterable[Record]) -> list[PropertyRecord]:
    return [r for r in records if isinstance(r, PropertyRecord)]


def counts(records: Iterable[Record]) -> dict[tuple[str, str], Counter[str]]:
    table: dict[tuple[str, str], Counter[str]] = {}
    for record in _results(records):
        table.setdefault((record.backend, record.op), Counter())[record.outcome] += 1
    return dict(sorted(table.items()))


# Outcomes of a check that ran: all but the skipping ones (unsupported, skipped).
EXECUTED: frozenset[str] = frozenset(OUTCOMES) - SKIPPING


def idle(records: Iterable[Record]) -> dict[str, tuple[int, str]]:
    """Backends that were available yet executed no check (every result unsupported): a run that tested
    nothing of them, e.g. capabilities that declare none of the selected ops. Backend -> (unsupported
    results, the first one's reason). An unavailable backend (its results skipped) is not idle."""
    seen: dict[str, Counter[str]] = {}
    reasons: dict[str, str] = {}
    for record in _results(records):
        seen.setdefault(record.backend, Counter())[record.outcome] += 1
        if record.outcome == "unsupported":
            reasons.setdefault(record.backend, record.reason)
    return {
        backend: (c["unsupported"], reasons[backend])
        for backend, c in sorted(seen.items())
        if c["unsupported"] and not any(c[o] for o in EXECUTED)
    }


def idle_lines(records: Iterable[Record]) -> list[str]:
    """One loud line per idle backend (see ``idle``)."""
    return [
        f"normconf: FAILED: backend {backend} executed no check ({count} unsupported, e.g. {reason}): "
        "this run tested nothing of it"
        for backend, (count, reason) in idle(records).items()
    ]


def aligned(head: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    """Rows under a head, each column padded to its widest cell (the terminal's tables)."""
    rows = [list(head), *map(list, body)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def table(records: Iterable[Record]) -> list[str]:
    rows = counts(records)
    head = ["backend", "op", *OUTCOMES]
    return aligned(head, ([backend, op, *(str(c[o]) for o in OUTCOMES)] for (backend, op), c in rows.items()))


def fingerprints(records: Iterable[Record]) -> list[str]:
    """Question x backend table of answers, or nothing when no fingerprint ran."""
    found = _fingerprints(records)
    if not found:
        return []
    backends = sorted({r.backend for r in found})
    questions = sorted({r.question for r in found}, key=_question_order)
    cells = {(r.question, r.backend): r.cell for r in found}
    body = ([q, *(cells.get((q, b), "") for b in backends)] for q in questions)
    legend = "fingerprint (* differs from normconf's reference, ? no hypothesis matched, - not asked)"
    return [legend, *aligned(["question", *backends], body)]


def properties(records: Iterable[Record]) -> list[str]:
    """Property x backend outcomes and the list of bitwise batch-invariant backends."""
    found = _properties(records)
    if not found:
        return []
    backends = sorted({r.backend for r in found})
    names = list(dict.fromkeys(r.property for r in found))
    cells = {(r.property, r.backend): r.cell for r in found}
    body = ([p, *(cells.get((p, b), "") for b in backends)] for p in names)
    lines = ["properties", *aligned(["property", *backends], body)]
    invariant = batch_invariant(found)
    if invariant is not None:
        examples = {r.backend: r.examples for r in found if r.property == "row_independence"}
        named = ", ".join(f"{b} ({examples[b]} examples)" for b in invariant)
        lines.append("batch-invariant (bitwise): " + (named or "none"))
    return lines


def batch_invariant(records: Iterable[Record]) -> list[str] | None:
    """Backends whose row_independence examples all gave identical bits (None if it did not run)."""
    runs = [r for r in _properties(records) if r.property == "row_independence"]
    if not runs:
        return None
    return sorted(r.backend for r in runs if r.bitwise is True)


def _question_order(name: str) -> tuple[int, str]:
    """The question table's order (related questions together), unknown names last."""
    order = list(QUESTIONS)
    return (order.index(name) if name in order else len(order), name)


# How many of the worst failures the terminal shows (the report has them all).
WORST_SHOWN = 5


def worst_failures(records: Iterable[Record], limit: int = WORST_SHOWN) -> list[str]:
    """The failed outputs with the largest worst_ratio (where, and by how much), then the count of
    failures that have no figure (errors, crashes, refused calls)."""
    failed = [r for r in _results(records) if r.outcome in ("failed", "error")]
    worst = sorted(
        ((c.worst_ratio, r, c) for r in failed for c in r.comparisons if not c.passed),
        key=lambda item: -item[0] if math.isfinite(item[0]) else -math.inf,
    )
    seen: set[tuple[str, str, str]] = set()
    rows = []
    for ratio, result, c in worst:
        if result.key in seen:  # one row per failed check: its worst output
            continue
        seen.add(result.key)
        where = ",".join(map(str, c.worst_index))
        figure = c.problem or f"{ratio:.3g}"
        rows.append([result.backend, result.case_id, result.check, c.output, figure, f"[{where}]"])
    if not rows and not failed:
        return []
    shown = rows[:limit]
    lines = (
        [f"worst failures ({len(shown)} of {len(rows)}; every one in the report's #failures)"] if rows else []
    )
    if shown:
        lines += aligned(["backend", "case", "check", "output", "worst_ratio", "index"], shown)
    without = len({r.key for r in failed} - seen)
    if without:
        lines.append(f"{without} failed or errored check(s) without figures (see the report's #failures)")
    return lines


def fingerprint_differences(records: Iterable[Record]) -> list[str]:
    """Every answered fingerprint question whose answer differs from normconf's reference."""
    differing = [r for r in _fingerprints(records) if r.outcome == "answered" and r.differs]
    if not differing:
        return []
    rows = ([r.backend, r.question, r.answer, r.reference] for r in differing)
    return [
        f"conventions that differ from the reference ({len(differing)}; the report's #conventions)",
        *aligned(["backend", "question", "answer", "reference"], rows),
    ]


def report(records: Sequence[Record]) -> list[str]:
    """Every table the terminal summary shows, separated by blank lines."""
    parts = [
        table(records),
        fingerprints(records),
        properties(records),
        worst_failures(records),
        fingerprint_differences(records),
    ]
    lines: list[str] = []
    for part in filter(None, parts):
        lines += ([""] if lines else []) + part
    return lines
