"""Terminal summary: backend x op counts of each outcome, from result records."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from conformance.results import OUTCOMES


def counts(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Counter[str]]:
    table: dict[tuple[str, str], Counter[str]] = {}
    for record in records:
        key = (str(record["backend"]), str(record["case"].get("op", "?")))
        table.setdefault(key, Counter())[str(record["outcome"])] += 1
    return dict(sorted(table.items()))


def table(records: Iterable[Mapping[str, Any]]) -> list[str]:
    rows = counts(records)
    head = ["backend", "op", *OUTCOMES]
    body = [[backend, op, *(str(c[o]) for o in OUTCOMES)] for (backend, op), c in rows.items()]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in [head, *body]]
