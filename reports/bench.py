"""Pure table and chart building for benchmarks: GB/s, roofline fraction and speedup per case.

Benchmarks join the conformance results by (backend, case id), so a fast but wrong backend is
marked. Charts are geometry only (bars in a viewBox); the HTML template draws them as inline SVG.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from conformance.model.case import OPS
from conformance.model.dtypes import DTYPES
from conformance.results.benchjson import CHECKS, BenchFile, Benchmark
from conformance.results.runs import Run, worst

PALETTE_SIZE = 6


@dataclass(frozen=True)
class BenchColumn:
    key: str
    backend: str
    file: str
    color: int


@dataclass(frozen=True)
class BenchCell:
    median_us: float
    gbps: float | None
    roofline_fraction: float | None
    speedup: float | None
    noise: float
    conformance: str
    device_us: float | None = None  # the kernels alone (GPU records); None on the CPU
    host_us: float | None = None  # wall minus device
    launches: float | None = None
    h2d_copies: float | None = None


@dataclass(frozen=True)
class BenchRow:
    case_id: str
    check: str
    op: str
    dtype: str
    bytes: int | None
    cells: Mapping[str, BenchCell]


@dataclass(frozen=True)
class Bar:
    y: float
    width: float
    color: int
    label: str
    value: str


@dataclass(frozen=True)
class Chart:
    title: str
    op: str
    width: int
    height: int
    left: int
    plot: int
    rows: tuple[tuple[float, str], ...]
    bars: tuple[Bar, ...]
    ticks: tuple[tuple[float, str], ...]
    roofline: float | None


@dataclass(frozen=True)
class BenchTable:
    columns: tuple[BenchColumn, ...]
    baseline: str | None
    rows: tuple[BenchRow, ...]
    charts: tuple[Chart, ...]
    auxiliary: tuple[tuple[str, str], ...]


def bench_columns(files: Sequence[BenchFile]) -> list[BenchColumn]:
    pairs = sorted(
        {(f.path.stem, b.backend) for f in files for b in f.benchmarks}, key=lambda p: (p[1], p[0])
    )
    names = Counter(backend for _, backend in pairs)
    return [
        BenchColumn(
            backend if names[backend] == 1 else f"{backend} · {stem}", backend, stem, i % PALETTE_SIZE
        )
        for i, (stem, backend) in enumerate(pairs)
    ]


def choose_baseline(
    cols: Sequence[BenchColumn], files: Sequence[BenchFile], wanted: str | None
) -> str | None:
    """The column key speedups are relative to: the wanted backend, else the most benchmarked one."""
    if not cols:
        return None
    if wanted is not None:
        return next((c.key for c in cols if c.backend == wanted), None)
    counts = Counter(b.backend for f in files for b in f.benchmarks)
    best = min(cols, key=lambda c: (-counts[c.backend], c.key))
    return best.key


def _outcomes(runs: Sequence[Run]) -> dict[tuple[str, str], str]:
    """Worst conformance outcome per (backend, case id) over every run."""
    seen: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        for r in run.records:
            seen.setdefault((r.backend, r.case_id), []).append(r.outcome)
    return {k: worst(v) for k, v in seen.items()}


def _case_fields(runs: Sequence[Run]) -> dict[str, tuple[str, str]]:
    fields: dict[str, tuple[str, str]] = {}
    for run in runs:
        for r in run.records:
            fields.setdefault(r.case_id, (r.op, r.dtype))
    return fields


def _guess(case_id: str) -> tuple[str, str]:
    """op and dtype from a case id (``op-dtype-...``) when no results file describes the case."""
    op = next((o for o in sorted(OPS, key=len, reverse=True) if case_id.startswith(o + "-")), "?")
    rest = case_id[len(op) + 1 :] if op != "?" else case_id
    return op, next((d for d in DTYPES if rest.startswith(d)), "?")


def bench_table(files: Sequence[BenchFile], runs: Sequence[Run], wanted: str | None) -> BenchTable:
    cols = bench_columns(files)
    baseline = choose_baseline(cols, files, wanted)
    key_of = {(c.file, c.backend): c.key for c in cols}
    outcomes, fields = _outcomes(runs), _case_fields(runs)
    timed: dict[tuple[str, str], dict[str, Benchmark]] = {}
    for f in files:
        for b in f.benchmarks:
            timed.setdefault((b.case_id, b.check), {})[key_of[(f.path.stem, b.backend)]] = b
    rows = []
    for (case_id, check), by_col in timed.items():
        base = by_col.get(baseline) if baseline else None
        cells = {k: _cell(b, base, outcomes.get((b.backend, case_id), "")) for k, b in by_col.items()}
        op, dtype = fields.get(case_id) or _guess(case_id)
        size = next((b.bytes for b in by_col.values() if b.bytes is not None), None)
        rows.append(BenchRow(case_id, check, op, dtype, size, cells))
    rows.sort(
        key=lambda r: (
            _rank(r.op, OPS),
            _rank(r.dtype, DTYPES),
            _rank(r.check, CHECKS),
            r.bytes or 0,
            r.case_id,
        )
    )
    aux = tuple(
        (
            f"{f.path.stem}: {a.name}",
            f"{a.median_s * 1e6:.4g} us" + (f", {a.gbps:.4g} GB/s" if a.gbps else ""),
        )
        for f in files
        for a in f.auxiliary
    )
    return BenchTable(tuple(cols), baseline, tuple(rows), tuple(charts(rows, cols)), aux)


def _rank(value: str, order: tuple[str, ...]) -> int:
    return order.index(value) if value in order else len(order)


def _cell(b: Benchmark, base: Benchmark | None, outcome: str) -> BenchCell:
    speedup = base.median_s / b.median_s if base is not None and b.median_s > 0 else None
    device_us = None if b.device_ms is None else b.device_ms * 1e3
    host_us = None if b.host_ms is None else b.host_ms * 1e3
    return BenchCell(
        b.median_s * 1e6, b.gbps, b.roofline_fraction, speedup, b.noise, outcome,
        device_us, host_us, b.launches, b.h2d_copies,
    )  # fmt: skip


def nice_step(top: float) -> float:
    """A 1/2/5 x 10^k tick step giving four to eight ticks up to ``top``."""
    raw = top / 5 if top > 0 else 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def charts(rows: Sequence[BenchRow], cols: Sequence[BenchColumn]) -> list[Chart]:
    """One horizontal bar chart of GB/s per (op, check): a group of bars (one per backend) per case."""
    groups: dict[tuple[str, str], list[BenchRow]] = {}
    for row in rows:
        groups.setdefault((row.op, row.check), []).append(row)
    color = {c.key: c.color for c in cols}
    return [_chart(op, check, group, color) for (op, check), group in groups.items()]


def _roofline(rows: Sequence[BenchRow]) -> float | None:
    """The copy bandwidth behind the roofline fractions, drawn only when every file agrees on it."""
    roofs = [
        c.gbps / c.roofline_fraction for r in rows for c in r.cells.values() if c.gbps and c.roofline_fraction
    ]
    if not roofs or max(roofs) > 1.2 * min(roofs):
        return None
    return statistics.median(roofs)


def _chart(op: str, check: str, rows: Sequence[BenchRow], color: Mapping[str, int]) -> Chart:
    bar_h, gap, plot = 9, 8, 420
    # About 6 px per character at the chart's 10 px font.
    left = min(12 + 6 * max((len(r.case_id) for r in rows), default=10), 380)
    values = [c.gbps for r in rows for c in r.cells.values() if c.gbps is not None]
    roofline = _roofline(rows)
    top = max([*values, roofline or 0.0, 1e-9])
    step = nice_step(top)
    top = step * math.ceil(top / step)
    y, labels, bars = 20.0, [], []
    for row in rows:
        shown = [(k, c) for k, c in sorted(row.cells.items()) if c.gbps is not None]
        labels.append((y + bar_h * max(len(shown), 1) / 2 + 4, row.case_id))
        for k, c in shown:
            assert c.gbps is not None
            bars.append(Bar(y, plot * c.gbps / top, color.get(k, 0), k, f"{c.gbps:.3g}"))
            y += bar_h
        y += gap if shown else bar_h + gap
    ticks = tuple((plot * i * step / top, f"{i * step:g}") for i in range(round(top / step) + 1))
    roof_x = plot * roofline / top if roofline else None
    title = f"{op} {check}: GB/s"
    return Chart(
        title, op, left + plot + 40, int(y + 24), left, plot, tuple(labels), tuple(bars), ticks, roof_x
    )
