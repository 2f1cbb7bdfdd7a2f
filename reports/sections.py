"""Pure table building for the report's other sections: environment, tolerances, ledger, coverage."""

from __future__ import annotations

import hashlib
import math
import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance import ledger
from conformance.backend import FEATURES
from conformance.case import OPS, Case, CaseError
from conformance.checks import CHECK_NAMES
from conformance.diff import ratio
from conformance.dtypes import DTYPES
from conformance.runs import Run
from reports.tables import COMPARED, Column, columns, ratio_text, tagged

_LEDGER_REF = re.compile(r"ledger deviation\[(\d+)\]")
_RULE_KEYS = re.compile(r"\b(op|output|dtype|dist)=(\S+)")


@dataclass(frozen=True)
class Environment:
    label: str
    files: tuple[str, ...]
    facts: tuple[tuple[str, str], ...]
    packages: tuple[tuple[str, str], ...]
    backends: tuple[tuple[str, str], ...]


def environment(run: Run) -> Environment:
    h = run.header
    env = h.get("environment") or {}
    files = tuple(f"{f.path}" + (f" (shard {f.shard[0]}/{f.shard[1]})" if f.shard else "") for f in run.files)
    facts = [
        ("time", str(h.get("time", ""))),
        ("profile", str(h.get("profile") or f"cases file {h.get('cases_file')}")),
        ("results", str(len(run.records))),
        ("pytest exit status", ", ".join(str(f.header.get("exitstatus", "?")) for f in run.files)),
        (
            "machine",
            f"{env.get('machine', '')} · {env.get('processor', '')} · {env.get('cpu_count', '?')} CPUs",
        ),
        ("platform", str(env.get("platform", ""))),
        ("python", str(env.get("python", ""))),
        ("git commit", str(env.get("git_commit") or "unknown")),
        ("tolerances", _file_id(h.get("tolerances"))),
        ("ledger", _file_id(h.get("ledger"))),
    ]
    packages = tuple((n, str(v)) for n, v in sorted((env.get("packages") or {}).items()) if v)
    backends = tuple(_backend_line(name, caps) for name, caps in sorted((h.get("backends") or {}).items()))
    return Environment(run.label, files, tuple(facts), packages, backends)


def _file_id(info: Any) -> str:
    if not isinstance(info, Mapping):
        return "unknown"
    return f"{info.get('path', '?')} (sha256 {str(info.get('sha256', ''))[:12]})"


def _backend_line(name: str, caps: Any) -> tuple[str, str]:
    if not isinstance(caps, Mapping):
        return name, "?"
    if "unavailable" in caps:
        return name, f"unavailable: {caps['unavailable']}"
    return name, f"{caps.get('device', '?')} ({caps.get('device_name') or 'unnamed'})"


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


def tolerances(runs: Sequence[Run]) -> list[ToleranceRow]:
    """The rules the comparisons used (as recorded with them), each with its why and headroom."""
    grouped: dict[tuple[str, ...], list[float]] = {}
    for run in runs:
        for record in run.records:
            if record["outcome"] not in COMPARED:
                continue
            for c in record.get("comparisons", []):
                t = c.get("tolerance") or {}
                k = tuple(str(t.get(f, "")) for f in ("source", "rtol", "atol", "cond", "why"))
                value = ratio(c.get("worst_ratio"))
                grouped.setdefault(k, []).append(math.inf if math.isnan(value) else value)
    rows = []
    for (source, rtol, atol, cond, why), values in grouped.items():
        rows.append(
            ToleranceRow(
                source,
                dict(_RULE_KEYS.findall(source)),
                rtol,
                atol,
                cond,
                why,
                len(values),
                sum(v > 1 for v in values),
                ratio_text(statistics.median(values)),
                ratio_text(max(values)),
            )
        )
    return sorted(rows, key=lambda r: (_rule_index(r.source), r.source))


def _rule_index(source: str) -> int:
    found = re.search(r"rule\[(\d+)\]", source)
    return int(found[1]) if found else 1 << 30


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


@dataclass(frozen=True)
class Deviations:
    rows: tuple[DeviationRow, ...]
    notes: tuple[str, ...]


def deviations(runs: Sequence[Run]) -> Deviations:
    """Ledger entries with how many results each covered in these runs and the measured band."""
    seen: dict[int, dict[str, Any]] = {}
    notes: list[str] = []
    entries: dict[int, ledger.Deviation] = {}
    for run in runs:
        loaded, note = _ledger_of(run)
        if note:
            notes.append(note)
        entries.update({e.index: e for e in loaded})
        for record in run.records:
            if record["outcome"] not in ("xfailed", "xpassed"):
                continue
            for index in {int(i) for i in _LEDGER_REF.findall(str(record.get("reason", "")))}:
                stats = seen.setdefault(index, {"xfailed": 0, "xpassed": 0, "ratios": [], "op": set()})
                stats[str(record["outcome"])] += 1
                stats["op"].add(str(record["case"].get("op", "")))
                stats["ratios"] += [
                    ratio(c.get("worst_ratio"))
                    for c in record.get("comparisons", [])
                    if not ratio(c.get("worst_ratio")) <= 1
                ]
    rows = [_deviation_row(i, entries.get(i), seen.get(i)) for i in sorted(set(entries) | set(seen))]
    return Deviations(tuple(rows), tuple(dict.fromkeys(notes)))


def _ledger_of(run: Run) -> tuple[tuple[ledger.Deviation, ...], str]:
    info = run.header.get("ledger") or {}
    path = Path(str(info.get("path", "")))
    try:
        raw = path.read_bytes()
    except OSError:
        return (
            (),
            f"{run.label}: ledger {path} is not readable here; entries are shown as the results cite them",
        )
    if hashlib.sha256(raw).hexdigest() != info.get("sha256"):
        return (
            (),
            f"{run.label}: ledger {path} changed since the run; entries are shown as the results cite them",
        )
    try:
        return ledger.load(path).entries, ""
    except ledger.LedgerError as exc:
        return (), f"{run.label}: {exc}"


def _deviation_row(
    index: int, entry: ledger.Deviation | None, stats: Mapping[str, Any] | None
) -> DeviationRow:
    values = [v if not math.isnan(v) else math.inf for v in (stats or {}).get("ratios", [])]
    measured = f"{ratio_text(min(values))} .. {ratio_text(max(values))}" if values else ""
    ops = sorted((stats or {}).get("op", set()))
    if entry is None:
        return DeviationRow(
            index,
            (),
            "",
            "(entry not available)",
            "",
            _n(stats, "xfailed"),
            _n(stats, "xpassed"),
            measured,
            ops[0] if len(ops) == 1 else "",
        )
    match = tuple(
        (k, ", ".join(v) if k != "case" else f"{len(v)} case pattern(s)") for k, v in entry.match.items()
    )
    op = entry.match.get("op", ())
    return DeviationRow(
        index,
        match,
        f"{entry.band[0]:g} .. {entry.band[1]:g}",
        entry.reason,
        entry.link if entry.link.startswith(("https://", "http://")) else "",
        _n(stats, "xfailed"),
        _n(stats, "xpassed"),
        measured,
        op[0] if len(op) == 1 else "",
    )


def _n(stats: Mapping[str, Any] | None, key: str) -> int:
    return int((stats or {}).get(key, 0))


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
        case = record["case"]
        row = counts.setdefault((col.id, str(case.get("op", "?")), str(case.get("dtype", "?"))), {})
        state = {"unsupported": "unsupported", "skipped": "skipped"}.get(str(record["outcome"]), "ran")
        # Features are counted once per backend x case, on its forward check.
        features = _features(case) if record["check"] == "forward" else ()
        for item in (str(record["check"]), *features):
            row.setdefault(item, Counter())[state] += 1
    present = {item for row in counts.values() for item in row}
    checks = [c for c in CHECK_NAMES if c in present] + sorted(present - set(CHECK_NAMES) - set(FEATURES))
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
    headers = {run.label: run.header.get("backends") or {} for run in runs}
    declared = tuple((c, _declared(headers[c.run].get(c.backend))) for c in cols)
    return Coverage(items, rows, declared)


def _row_order(col_id: str, op: str, dtype: str) -> tuple[int, int, int]:
    return (
        int(col_id.lstrip("c") or 0),
        OPS.index(op) if op in OPS else len(OPS),
        DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES),
    )


_FEATURE_CACHE: dict[str, tuple[str, ...]] = {}


def _features(case: Mapping[str, Any]) -> tuple[str, ...]:
    """The capability features a recorded case needs (none if it is not a valid Case here)."""
    key = str(case.get("id", ""))
    if key not in _FEATURE_CACHE:
        try:
            _FEATURE_CACHE[key] = tuple(sorted(Case.from_dict(dict(case)).features))
        except (CaseError, TypeError):
            _FEATURE_CACHE[key] = ()
    return _FEATURE_CACHE[key]


def _declared(caps: Any) -> str:
    if not isinstance(caps, Mapping):
        return "not in the results header"
    if "unavailable" in caps:
        return f"unavailable: {caps['unavailable']}"
    parts = [
        f"{k}: {', '.join(map(str, caps.get(k) or [])) or '(none)'}" for k in ("ops", "dtypes", "features")
    ]
    limits = caps.get("limits") or {}
    if limits:
        parts.append("limits: " + ", ".join(f"{k}={v}" for k, v in limits.items()))
    return "; ".join(parts)
