"""Terminal summary: backend x op counts of each outcome, the fingerprint and the properties tables."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from conformance.fingerprint import QUESTIONS
from conformance.results import OUTCOMES

Record = Mapping[str, Any]


def _kind(records: Iterable[Record], kind: str) -> list[Record]:
    return [r for r in records if r.get("kind", "result") == kind]


def counts(records: Iterable[Record]) -> dict[tuple[str, str], Counter[str]]:
    table: dict[tuple[str, str], Counter[str]] = {}
    for record in _kind(records, "result"):
        key = (str(record["backend"]), str(record["case"].get("op", "?")))
        table.setdefault(key, Counter())[str(record["outcome"])] += 1
    return dict(sorted(table.items()))


def _aligned(head: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    rows = [list(head), *map(list, body)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def table(records: Iterable[Record]) -> list[str]:
    rows = counts(records)
    head = ["backend", "op", *OUTCOMES]
    return _aligned(
        head, ([backend, op, *(str(c[o]) for o in OUTCOMES)] for (backend, op), c in rows.items())
    )


def fingerprint_cell(record: Record) -> str:
    """The answer; `*` marks one that differs from normconf's reference semantics."""
    outcome = str(record["outcome"])
    if outcome != "answered":
        return {"unsupported": "-", "skipped": "-", "error": "error"}.get(outcome, outcome)
    answer = str(record["answer"])
    if answer == "unmatched" and "estimate" in record:
        return f"~{float(record['estimate']):.3g}?"
    if not record.get("matched"):
        return answer.split(":")[0] + "?"
    reference = record.get("reference")
    return answer if not reference or answer == reference else f"{answer}*"


def fingerprints(records: Iterable[Record]) -> list[str]:
    """Question x backend table of answers, or nothing when no fingerprint ran."""
    found = _kind(records, "fingerprint")
    if not found:
        return []
    backends = sorted({str(r["backend"]) for r in found})
    questions = sorted({str(r["question"]) for r in found}, key=_question_order)
    cells = {(str(r["question"]), str(r["backend"])): fingerprint_cell(r) for r in found}
    body = ([q, *(cells.get((q, b), "") for b in backends)] for q in questions)
    legend = "fingerprint (* differs from normconf's reference, ? no hypothesis matched, - not asked)"
    return [legend, *_aligned(["question", *backends], body)]


def property_cell(record: Record) -> str:
    outcome = str(record["outcome"])
    return {"unsupported": "-", "skipped": "-"}.get(outcome, outcome)


def properties(records: Iterable[Record]) -> list[str]:
    """Property x backend outcomes and the list of bitwise batch-invariant backends."""
    found = _kind(records, "property")
    if not found:
        return []
    backends = sorted({str(r["backend"]) for r in found})
    names = list(dict.fromkeys(str(r["property"]) for r in found))
    cells = {(str(r["property"]), str(r["backend"])): property_cell(r) for r in found}
    body = ([p, *(cells.get((p, b), "") for b in backends)] for p in names)
    lines = ["properties", *_aligned(["property", *backends], body)]
    invariant = batch_invariant(found)
    if invariant is not None:
        examples = {str(r["backend"]): r["examples"] for r in found if r["property"] == "row_independence"}
        named = ", ".join(f"{b} ({examples[b]} examples)" for b in invariant)
        lines.append("batch-invariant (bitwise): " + (named or "none"))
    return lines


def batch_invariant(records: Iterable[Record]) -> list[str] | None:
    """Backends whose row_independence examples all gave identical bits (None if it did not run)."""
    runs = [r for r in _kind(records, "property") if r["property"] == "row_independence"]
    if not runs:
        return None
    return sorted(str(r["backend"]) for r in runs if r.get("bitwise") is True)


def _question_order(name: str) -> tuple[int, str]:
    """The question table's order (related questions together), unknown names last."""
    order = list(QUESTIONS)
    return (order.index(name) if name in order else len(order), name)


def report(records: Sequence[Record]) -> list[str]:
    """Every table the terminal summary shows, separated by blank lines."""
    parts = [table(records), fingerprints(records), properties(records)]
    lines: list[str] = []
    for part in filter(None, parts):
        lines += ([""] if lines else []) + part
    return lines
