"""Pure table building for the report's other sections: environment, tolerances, rounding, ledger,
coverage."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.model.case import FEATURES, OPS, Case, CaseError
from conformance.model.dtypes import DTYPES
from conformance.model.outputs import ACTIVATION_OUTPUTS
from conformance.results.header import BackendInfo, FileRef, LedgerEntry
from conformance.results.result import ComparisonRecord, RoundingRecord
from conformance.results.runs import Run
from reports.tables import COMPARED, Column, check_order, columns, ratio_text, tagged


@dataclass(frozen=True)
class Environment:
    label: str
    files: tuple[str, ...]
    facts: tuple[tuple[str, str], ...]
    packages: tuple[tuple[str, str], ...]
    backends: tuple[tuple[str, str], ...]


def environment(run: Run) -> Environment:
    h = run.header
    env = h.environment
    files = tuple(f"{f.path}" + (f" (shard {f.shard[0]}/{f.shard[1]})" if f.shard else "") for f in run.files)
    facts = [
        ("time", h.time),
        ("profile", h.profile or f"cases file {h.cases_file}"),
        ("results", str(len(run.records))),
        (
            "pytest exit status",
            ", ".join("?" if f.header.exitstatus is None else str(f.header.exitstatus) for f in run.files),
        ),
        ("machine", f"{env.machine} · {env.processor} · {env.cpu_count or '?'} CPUs"),
        ("CPU features", " ".join(env.cpu_features) if env.cpu_features is not None else "not recorded"),
        ("platform", env.platform),
        ("python", env.python),
        ("git commit", h.git_commit or "unknown"),
        ("tolerances", _file_id(h.tolerances)),
        ("ledger", _file_id(h.ledger)),
    ]
    packages = tuple((n, v) for n, v in sorted(env.packages.items()) if v)
    backends = tuple(_backend_line(name, info) for name, info in sorted(h.backends.items()))
    return Environment(run.label, files, tuple(facts), packages, backends)


def _file_id(ref: FileRef | None) -> str:
    return "unknown" if ref is None else f"{ref.path} (sha256 {ref.sha256[:12]})"


def _backend_line(name: str, info: BackendInfo) -> tuple[str, str]:
    if info.unavailable is not None:
        return name, f"{'broken' if info.broken else 'unavailable'}: {info.unavailable}"
    return name, f"{info.device} ({info.device_name or 'unnamed'})"


@dataclass(frozen=True)
class ToleranceRow:
    source: str
    keys: Mapping[str, str]
    rtol: str
    atol: str
    cond: str
    why: str
    comparisons: int
    failing: int
    median_ratio: str
    max_ratio: str
    rule: int | None = None


def tolerances(runs: Sequence[Run]) -> list[ToleranceRow]:
    """The rules the comparisons used (as recorded with them), each with its why and headroom."""
    Key = tuple[str, str, str, str, str]
    grouped: dict[Key, list[float]] = {}
    keys: dict[Key, tuple[int | None, dict[str, str]]] = {}
    for run in runs:
        for record in run.records:
            if record.outcome not in COMPARED:
                continue
            for c in record.comparisons:
                t = c.tolerance
                k: Key = (
                    t.source,
                    str(t.rtol),
                    str(t.atol),
                    str(t.cond),
                    t.why,
                )
                keys.setdefault(k, (t.rule, dict(t.keys)))
                value = c.worst_ratio
                grouped.setdefault(k, []).append(math.inf if math.isnan(value) else value)
    rows = []
    for k, values in grouped.items():
        source, rtol, atol, cond, why = k
        rule, named = keys[k]
        rows.append(
            ToleranceRow(
                source,
                named,
                rtol,
                atol,
                cond,
                why,
                len(values),
                sum(v > 1 for v in values),
                ratio_text(statistics.median(values)),
                ratio_text(max(values)),
                rule,
            )
        )
    return sorted(rows, key=lambda r: (1 << 30 if r.rule is None else r.rule, r.source))


@dataclass(frozen=True)
class RoundingRow:
    """One backend x output dtype: how its half-precision outputs round (conformance.judging.rounding)."""

    backend: str
    dtype: str
    comparisons: int
    judged: int
    failing: int
    median_bias: str
    worst_bias: str
    median_drift: str
    worst_drift: str
    median_mismatch: str


def rounding(runs: Sequence[Run]) -> list[RoundingRow]:
    """Per backend and output dtype: median and worst (largest |mean|) rounding bias and drift over
    the comparisons with enough elements to judge, and the median mismatch fraction."""
    grouped: dict[tuple[str, str], list[tuple[RoundingRecord, float]]] = {}
    for col, record in tagged(runs, columns(runs)):
        if record.outcome not in COMPARED:
            continue
        for c in record.comparisons:
            if c.rounding is None:
                continue
            activation = c.output in ACTIVATION_OUTPUTS
            dtype = record.dtype if activation else str(record.case.get("param_dtype") or record.dtype)
            grouped.setdefault((col.key, dtype), []).append((c.rounding, c.mismatch_fraction))
    rows = []
    for (backend, dtype), values in sorted(grouped.items()):
        judged = [r for r, _ in values if r.judged]
        fractions = [f for _, f in values if not math.isnan(f)]
        rows.append(
            RoundingRow(
                backend,
                dtype,
                len(values),
                len(judged),
                sum(not r.passed for r in judged),
                _signed(statistics.median(r.bias for r in judged)) if judged else "",
                _signed(max((r.bias for r in judged), key=abs)) if judged else "",
                _signed(statistics.median(r.drift for r in judged)) if judged else "",
                _signed(max((r.drift for r in judged), key=abs)) if judged else "",
                f"{statistics.median(fractions):.3g}" if fractions else "",
            )
        )
    return rows


def _signed(value: float) -> str:
    return f"{value:+.3f}"


@dataclass(frozen=True)
class DeviationRow:
    index: int
    match: tuple[tuple[str, str], ...]
    band: str
    reason: str
    link: str
    xfailed: int
    xpassed: int
    measured: str
    op: str
    explains: str = ""  # "model NAME", or the band and that no model exists yet
    explains_note: str = ""  # why no model exists yet, where the entry says
    not_observed: bool = False  # could have applied to the run, needed by none of its results
    bo: str = ""  # column/outcome tokens for the backend and outcome filters

    @property
    def reason_head(self) -> str:
        """The reason's first sentence (the whole text opens on a click)."""
        head, dot, _ = self.reason.partition(". ")
        return head + dot.strip() if len(head) <= 160 else head[:157] + "..."

    @property
    def anchor(self) -> str:
        """The row's id: xfailed cells, matrix cells and failure cards link here."""
        return f"ledger-{self.index}"


@dataclass(frozen=True)
class Deviations:
    """The ledger entries that applied to these runs (or could have and were not observed); the
    others are only counted, so a report's size follows what ran rather than the ledger's."""

    rows: tuple[DeviationRow, ...]
    notes: tuple[str, ...]
    counts: str = ""  # how many entries explain by a model, by a band, and were not observed here
    others: int = 0  # entries for other backends, platforms or cases: counted, not listed


def deviations(runs: Sequence[Run]) -> Deviations:
    """Ledger entries with how many results each covered in these runs and the measured band."""
    seen: dict[int, _Seen] = {}
    notes: list[str] = []
    entries: dict[int, LedgerEntry] = {}
    unobserved: set[int] = set()
    cols = columns(runs)
    for run in runs:
        header = run.header
        if header.ledger_note:
            notes.append(f"{run.label}: {header.ledger_note}")
        entries.update({e.index: e for e in header.ledger_entries or ()})
        unobserved.update(header.ledger_unobserved or ())
    for col, record in tagged(runs, cols):
        # Every result that cites an entry: xfailed and xpassed ones count as what it explained;
        # a failed one cites an entry that applied but did not explain it.
        for index in record.ledger_entries:
            stats = seen.setdefault(index, _Seen())
            stats.outcomes[record.outcome] += 1
            stats.ops.add(record.op)
            stats.tokens.add(f"{col.id}/{record.outcome}")
        if record.outcome not in ("xfailed", "xpassed"):
            continue
        for c in record.comparisons:
            if c.ledger is not None:
                seen.setdefault(c.ledger, _Seen()).ratios += _measured(c)
    by_backend = {(c.run, c.backend): c for c in cols}
    for run in runs:
        for prop in run.properties:
            owner = by_backend.get((run.label, prop.backend))
            for index in (i for i in prop.extra.get("ledger", ()) if isinstance(i, int)):
                stats = seen.setdefault(index, _Seen())
                stats.outcomes[prop.outcome] += 1
                if owner is not None:
                    stats.tokens.add(f"{owner.id}/{prop.outcome}")
    unobserved -= set(seen)
    for index in unobserved:
        named = entries[index].match.get("backend", ()) if index in entries else ()
        tokens = {f"{c.id}/xfailed" for c in cols if not named or c.backend in named}
        seen.setdefault(index, _Seen()).tokens.update(tokens)
    rows = [
        dataclasses.replace(
            _deviation_row(i, entries.get(i), seen[i]),
            not_observed=i in unobserved,
            bo=" ".join(sorted(seen[i].tokens)),
        )
        for i in sorted(seen)
    ]
    band_only = sum(1 for e in entries.values() if not e.model)
    counts = (
        f"{len(entries) - band_only} of {len(entries)} entries explain by an executable model, "
        f"{band_only} by a band (no model yet); {len(unobserved)} could have applied to this run and were "
        "not observed here."
    )
    others = len(set(entries) - set(seen))
    return Deviations(tuple(rows), tuple(dict.fromkeys(notes)), counts if entries else "", others)


def _measured(c: ComparisonRecord) -> list[float]:
    """What a covered comparison measured: worst_ratio beyond 1, else its rounding bias (ulps)."""
    if not c.worst_ratio <= 1:
        return [c.worst_ratio]
    if c.rounding is not None and not c.rounding.passed:
        return [c.rounding.size]
    return []


@dataclass
class _Seen:
    """What the results say of one ledger entry: outcomes it gave, ops, worst ratios beyond 1."""

    outcomes: Counter[str] = field(default_factory=Counter)
    ops: set[str] = field(default_factory=set)
    ratios: list[float] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)  # column/outcome of the results it covered


def _deviation_row(index: int, entry: LedgerEntry | None, stats: _Seen | None) -> DeviationRow:
    stats = stats or _Seen()
    values = [v if not math.isnan(v) else math.inf for v in stats.ratios]
    measured = f"{ratio_text(min(values))} .. {ratio_text(max(values))}" if values else ""
    ops = sorted(stats.ops)
    xfailed, xpassed = stats.outcomes["xfailed"], stats.outcomes["xpassed"]
    if entry is None:
        op = ops[0] if len(ops) == 1 else ""
        return DeviationRow(index, (), "", "(entry not available)", "", xfailed, xpassed, measured, op)
    match = (
        tuple(
            (k, ", ".join(v) if k != "case" else f"{len(v)} case pattern(s)") for k, v in entry.match.items()
        )
        + tuple((f"info.{k}", ", ".join(v)) for k, v in entry.info.items())
        + tuple((f"platform.{k}", _condition_text(v)) for k, v in entry.platform.items())
    )
    entry_ops = entry.match.get("op", ())
    return DeviationRow(
        index,
        match,
        f"{entry.band[0]:g} .. {entry.band[1]:g}"
        + (" ulp rounding bias" if entry.measure == "rounding" else ""),
        entry.reason,
        entry.link if entry.link.startswith(("https://", "http://")) else "",
        xfailed,
        xpassed,
        measured,
        entry_ops[0] if len(entry_ops) == 1 else "",
        f"model {entry.model}" if entry.model else f"band {entry.band[1]:g} (no model yet)",
        "" if entry.model else entry.note,
    )


def _condition_text(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


@dataclass(frozen=True)
class CoverageCell:
    ran: int
    unsupported: int
    skipped: int

    @property
    def state(self) -> str:
        if self.ran and not self.unsupported:
            return "ran"
        if self.ran:
            return "partial"
        return "unsupported" if self.unsupported else "skipped"

    @property
    def text(self) -> str:
        parts = [
            str(self.ran) if self.ran else "",
            f"{self.unsupported} unsupported" if self.unsupported else "",
        ]
        return " + ".join(p for p in parts if p) or f"{self.skipped} skipped"


@dataclass(frozen=True)
class CoverageRow:
    column: Column
    op: str
    dtype: str
    cells: Mapping[str, CoverageCell]


@dataclass(frozen=True)
class Coverage:
    items: tuple[str, ...]
    rows: tuple[CoverageRow, ...]
    declared: tuple[tuple[Column, str], ...]


def coverage(runs: Sequence[Run]) -> Coverage:
    """Per backend and op x dtype: how many cases each check and each feature ran, or were unsupported."""
    counts: dict[tuple[str, str, str], dict[str, Counter[str]]] = {}
    cols = columns(runs)
    for col, record in tagged(runs, cols):
        row = counts.setdefault((col.id, record.op, record.dtype), {})
        state = {"unsupported": "unsupported", "skipped": "skipped"}.get(record.outcome, "ran")
        # Features are counted once per backend x case, on its forward check.
        features = _features(record.case) if record.check == "forward" else ()
        for item in (record.check, *features):
            row.setdefault(item, Counter())[state] += 1
    present = {item for row in counts.values() for item in row}
    order = check_order(runs)
    checks = [c for c in order if c in present] + sorted(present - set(order) - set(FEATURES))
    items = (*checks, *(f for f in FEATURES if f in present and f not in checks))
    by_id = {c.id: c for c in cols}
    rows = tuple(
        CoverageRow(
            by_id[col_id],
            op,
            dtype,
            {i: CoverageCell(c["ran"], c["unsupported"], c["skipped"]) for i, c in row.items()},
        )
        for (col_id, op, dtype), row in sorted(counts.items(), key=lambda kv: _row_order(*kv[0]))
    )
    headers = {run.label: run.header.backends for run in runs}
    declared = tuple((c, _declared(headers[c.run].get(c.backend))) for c in cols)
    return Coverage(items, rows, declared)


def _row_order(col_id: str, op: str, dtype: str) -> tuple[int, int, int]:
    return (
        int(col_id.lstrip("c") or 0),
        OPS.index(op) if op in OPS else len(OPS),
        DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES),
    )


_FEATURE_CACHE: dict[str, tuple[str, ...]] = {}


def _features(case: Mapping[str, object]) -> tuple[str, ...]:
    """The capability features a recorded case needs (none if it is not a valid Case here)."""
    key = str(case.get("id", ""))
    if key not in _FEATURE_CACHE:
        try:
            _FEATURE_CACHE[key] = tuple(sorted(Case.from_dict(dict(case)).features))
        except (CaseError, TypeError):
            _FEATURE_CACHE[key] = ()
    return _FEATURE_CACHE[key]


def _declared(info: BackendInfo | None) -> str:
    if info is None:
        return "not in the results header"
    if info.unavailable is not None:
        return f"unavailable: {info.unavailable}"
    named = {"ops": info.ops, "dtypes": info.dtypes, "features": info.features}
    parts = [f"{k}: {', '.join(v) or '(none)'}" for k, v in named.items()]
    if info.limits:
        parts.append("limits: " + ", ".join(f"{k}={v}" for k, v in info.limits.items()))
    return "; ".join(parts)
