"""Pure table building for the report: columns, the conformance matrix, case rows and failures.

A column is one backend of one run; with a single run (or backend names unique across runs) its
key is just the backend name. Filter tokens (``data-bo``) pair a column id with an outcome.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from conformance.model.case import OPS
from conformance.model.dtypes import DTYPES
from conformance.results.result import ComparisonRecord, Result, RoundingRecord
from conformance.results.runs import Run, worst
from conformance.results.schema import figure

COMPARED: frozenset[str] = frozenset({"passed", "failed", "xfailed", "xpassed"})
PROBLEMS: tuple[str, ...] = ("failed", "error", "xpassed")


@dataclass(frozen=True)
class Column:
    """One backend of one run. ``id`` is a short token for filter attributes (c1, c2, ...)."""

    id: str
    key: str
    backend: str
    run: str


def columns(runs: Sequence[Run]) -> list[Column]:
    pairs = [(run.label, backend) for run in runs for backend in run.backends]
    names = Counter(backend for _, backend in pairs)
    return [
        Column(f"c{i + 1}", backend if names[backend] == 1 else f"{backend} · {label}", backend, label)
        for i, (label, backend) in enumerate(pairs)
    ]


def tagged(runs: Sequence[Run], cols: Sequence[Column]) -> Iterator[tuple[Column, Result]]:
    """Every record with its column."""
    by_pair = {(c.run, c.backend): c for c in cols}
    for run in runs:
        for record in run.records:
            yield by_pair[(run.label, record.backend)], record


def eps_text(value: object) -> str:
    number = figure(value)
    return str(value) if math.isnan(number) else repr(number)


def worst_ratio(records: Sequence[Result]) -> float | None:
    """The largest worst_ratio over the compared outputs of these records (None if none compared)."""
    values = [c.worst_ratio for r in records if r.outcome in COMPARED for c in r.comparisons]
    values = [v if not math.isnan(v) else math.inf for v in values]
    return max(values) if values else None


def ratio_text(value: float | None) -> str:
    if value is None:
        return ""
    if math.isinf(value):
        return "inf"
    return f"{value:.2g}" if value < 100 else f"{value:.3g}"


@dataclass(frozen=True)
class Cell:
    outcome: str
    counts: Mapping[str, int]
    worst_ratio: float | None
    # The known deviations among the records: the ledger entries they cite, the worst_ratio of the
    # others (what the backend conforms to), and each xfailed output's figures against the oracle.
    entries: tuple[int, ...] = ()
    conforming_ratio: float | None = None
    known_figures: tuple[str, ...] = ()

    @property
    def ratio_text(self) -> str:
        return ratio_text(self.worst_ratio)

    @property
    def known(self) -> int:
        return self.counts.get("xfailed", 0)

    @property
    def conforming_text(self) -> str:
        """A cell whose worst is a known deviation: ``0.25 · 1 known`` beside its conforming checks'
        worst_ratio, or ``3 known`` when every check of it is a known deviation."""
        if self.conforming_ratio is None:
            return f"{self.known} known"
        return f"{ratio_text(self.conforming_ratio)} · {self.known} known"

    @property
    def summary(self) -> str:
        counts = ", ".join(f"{n} {o}" for o, n in sorted(self.counts.items(), key=lambda kv: -kv[1]))
        return counts + (f"; worst_ratio {self.ratio_text}" if self.worst_ratio is not None else "")

    @property
    def problems(self) -> int:
        return sum(self.counts.get(o, 0) for o in PROBLEMS)


def cell(records: Sequence[Result]) -> Cell:
    counts = Counter(r.outcome for r in records)
    known = [r for r in records if r.outcome in ("xfailed", "xpassed")]
    entries = tuple(sorted({i for r in known for i in r.ledger_entries}))
    figures = tuple(
        f"{c.output}: worst_ratio {ratio_text(c.worst_ratio)} at [{', '.join(map(str, c.worst_index))}], "
        f"max_abs {c.max_abs:.3g}"
        for r in known
        for c in r.comparisons
        if not c.passed
    )
    others = [r for r in records if r.outcome not in ("xfailed", "xpassed")]
    return Cell(worst(counts), dict(counts), worst_ratio(records), entries, worst_ratio(others), figures)


def tokens(col_outcomes: Mapping[str, set[str]]) -> str:
    return " ".join(f"{col}/{o}" for col, outcomes in sorted(col_outcomes.items()) for o in sorted(outcomes))


@dataclass(frozen=True)
class MatrixRow:
    op: str
    dtype: str
    eps: str
    cells: Mapping[str, Cell]
    bo: str


@dataclass(frozen=True)
class Matrix:
    columns: tuple[Column, ...]
    rows: tuple[MatrixRow, ...]


def row_order(op: str, dtype: str, eps: str) -> tuple[int, int, float, str]:
    o = OPS.index(op) if op in OPS else len(OPS)
    d = DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES)
    return o, d, figure(eps), op + dtype


def matrix(runs: Sequence[Run]) -> Matrix:
    """Backend columns x (op, dtype, eps) rows; each cell the worst outcome and largest worst_ratio."""
    cols = columns(runs)
    groups: dict[tuple[str, str, str], dict[str, list[Result]]] = {}
    for col, record in tagged(runs, cols):
        row = (record.op, record.dtype, eps_text(record.case.get("eps")))
        groups.setdefault(row, {}).setdefault(col.id, []).append(record)
    rows = []
    for (op, dtype, eps), by_col in sorted(groups.items(), key=lambda kv: row_order(*kv[0])):
        cells = {col: cell(records) for col, records in by_col.items()}
        bo = tokens({col: set(c.counts) for col, c in cells.items()})
        rows.append(MatrixRow(op, dtype, eps, cells, bo))
    return Matrix(tuple(cols), tuple(rows))


@dataclass(frozen=True)
class CaseRow:
    """One backend x case: each check's outcome and worst_ratio."""

    column: Column
    case_id: str
    op: str
    dtype: str
    eps: str
    checks: Mapping[str, Cell] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        return worst(c.outcome for c in self.checks.values())

    @property
    def bo(self) -> str:
        return tokens({self.column.id: {c.outcome for c in self.checks.values()}})


def case_rows(runs: Sequence[Run]) -> list[CaseRow]:
    grouped: dict[tuple[str, str], tuple[Column, Result, dict[str, list[Result]]]] = {}
    for col, record in tagged(runs, columns(runs)):
        entry = grouped.setdefault((col.id, record.case_id), (col, record, {}))
        entry[2].setdefault(record.check, []).append(record)
    rows = [
        CaseRow(
            col,
            first.case_id,
            first.op,
            first.dtype,
            eps_text(first.case.get("eps")),
            {check: cell(records) for check, records in checks.items()},
        )
        for col, first, checks in grouped.values()
    ]
    return sorted(rows, key=lambda r: (row_order(r.op, r.dtype, r.eps), r.case_id, r.column.id))


def check_order(runs: Sequence[Run]) -> list[str]:
    """The checks in the suite's order, as the runs' headers declare it."""
    return list(dict.fromkeys(check for run in runs for check in run.header.checks))


def check_names(runs: Sequence[Run], rows: Sequence[CaseRow]) -> list[str]:
    """The checks present in ``rows``, in the suite's order, unknown ones last."""
    present = {check for row in rows for check in row.checks}
    order = check_order(runs)
    return [c for c in order if c in present] + sorted(present - set(order))


@dataclass(frozen=True)
class Figure:
    output: str
    worst_ratio: str
    mismatched: str
    source: str
    mismatch_fraction: str = ""
    rounding: str = ""
    index: str = ""  # where the worst element is, e.g. "[3, 7]"
    failing: bool = False


@dataclass(frozen=True)
class Failure:
    column: Column
    case_id: str
    op: str
    dtype: str
    check: str
    outcome: str
    headline: str
    reason: str
    reproduce: str
    figures: tuple[Figure, ...]
    entries: tuple[int, ...] = ()  # the ledger entries the record cites (an xpassed one: stale)
    # The largest worst_ratio of the failing outputs (inf for one without a finite figure): the order.
    severity: float = math.inf

    @property
    def bo(self) -> str:
        return f"{self.column.id}/{self.outcome}"


def failures(runs: Sequence[Run]) -> list[Failure]:
    """Every failed, errored and xpassed record with its full message and reproduce command."""
    found = []
    for col, record in tagged(runs, columns(runs)):
        if record.outcome not in PROBLEMS:
            continue
        figures = tuple(
            Figure(
                c.output,
                ratio_text(c.worst_ratio),
                f"{c.mismatched} of {c.numel}",
                c.tolerance.source,
                "" if math.isnan(c.mismatch_fraction) else f"{c.mismatch_fraction:.3g}",
                _rounding_text(c.rounding),
                f"[{', '.join(map(str, c.worst_index))}]" if c.worst_index else "",
                not c.passed,
            )
            for c in record.comparisons
        )
        found.append(
            Failure(
                col,
                record.case_id,
                record.op,
                record.dtype,
                record.check,
                record.outcome,
                record.summary,
                record.reason,
                record.reproduce,
                figures,
                record.ledger_entries,
                _severity(record.comparisons),
            )
        )
    # Worst first within each outcome: the failure furthest outside its tolerance leads.
    return sorted(
        found, key=lambda f: (PROBLEMS.index(f.outcome), -f.severity, f.column.id, f.case_id, f.check)
    )


def _severity(comparisons: Sequence[ComparisonRecord]) -> float:
    ratios = [c.worst_ratio for c in comparisons if not c.passed]
    if not ratios or any(c.problem or not math.isfinite(c.worst_ratio) for c in comparisons if not c.passed):
        return math.inf
    return float(max(ratios))


def totals(runs: Sequence[Run]) -> list[tuple[Column, Counter[str]]]:
    """Outcome counts per column, for the summary line and the Markdown table."""
    cols = columns(runs)
    counts: dict[str, Counter[str]] = {c.id: Counter() for c in cols}
    for col, record in tagged(runs, cols):
        counts[col.id][record.outcome] += 1
    return [(c, counts[c.id]) for c in cols]


def _rounding_text(r: RoundingRecord | None) -> str:
    """bias / drift with the limit, or why it was not judged; empty for outputs not judged for bias."""
    if r is None:
        return ""
    limit = f"limit +-{r.limit:.3g}" if r.judged else f"{r.n} elements: not judged"
    flag = "" if r.passed else " FAILS"
    return f"{r.bias:+.3f} / {r.drift:+.3f} ({limit}){flag}"
