"""The HTML renderer: one self-contained file (inline CSS, JS and SVG; no network), Jinja2 autoescaped.

Everything that came from a results or benchmark file is escaped by the template engine; the
script embeds no data (it reads the DOM), so nothing from an adapter can reach a script context.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from conformance.results.render import ReportInput
from conformance.results.runs import Run
from conformance.results.schema import OUTCOMES
from reports import bench, changes, conventions, sections, tables

TEMPLATES = Path(__file__).resolve().parent / "templates"
# Beyond this many, failures are listed in the case table only; the results file has every message.
MAX_FAILURES = 500
SYMBOLS = {
    "passed": "✓",
    "failed": "✗",
    "error": "!",
    "xpassed": "✗",
    "xfailed": "≈",
    "unsupported": "–",
    "skipped": "·",
}


@cache
def _asset(name: str) -> Markup:
    # Our own static CSS/JS, inlined verbatim; never data.
    return Markup((TEMPLATES / name).read_text())


@cache
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(asset=_asset, symbols=SYMBOLS)
    env.filters.update(num=_num, pct=_pct)
    return env


def _num(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value * 100:.0f}%"


def _filters(runs: Sequence[Run], matrix: tables.Matrix) -> dict[str, list[tuple[str, str]]]:
    ops = sorted({r.op for r in matrix.rows}, key=lambda o: tables.row_order(o, "", "0"))
    dtypes = sorted({r.dtype for r in matrix.rows}, key=lambda d: tables.row_order("", d, "0"))
    present = {o for r in matrix.rows for c in r.cells.values() for o in c.counts}
    return {
        "backend": [(c.key, c.id) for c in matrix.columns],
        "op": [(o, "") for o in ops],
        "dtype": [(d, "") for d in dtypes],
        "outcome": [(o, "") for o in OUTCOMES if o in present],
    }


def context(data: ReportInput) -> dict[str, Any]:
    runs = list(data.runs)
    matrix = tables.matrix(runs)
    case_rows = tables.case_rows(runs)
    failures = tables.failures(runs)
    return {
        "title": data.title,
        "generated": _now(),
        "environments": [sections.environment(r) for r in runs],
        "bench_files": data.benches,
        "totals": tables.totals(runs),
        "matrix": matrix,
        "failures": failures[:MAX_FAILURES],
        "failures_total": len(failures),
        "deviations": sections.deviations(runs),
        "tolerances": sections.tolerances(runs),
        "rounding": sections.rounding(runs),
        "coverage": sections.coverage(runs),
        "conventions": conventions.conventions(runs),
        "properties": conventions.properties(runs),
        "bench": bench.bench_table(data.benches, runs, data.baseline) if data.benches else None,
        "changes": changes.changes(runs, data.benches, data.thresholds),
        "thresholds": data.thresholds,
        "cases": case_rows,
        "checks": tables.check_names(runs, case_rows),
        "filters": _filters(runs, matrix),
        "outcomes": OUTCOMES,
    }


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def render(data: ReportInput) -> str:
    return environment().get_template("report.html.j2").render(context(data))


def render_conventions(data: ReportInput) -> str:
    """The Conventions section alone, as a self-contained page (``normconf conventions --format html``)."""
    runs = list(data.runs)
    page = {
        "title": data.title,
        "generated": _now(),
        "environments": [sections.environment(r) for r in runs],
        "conventions": conventions.conventions(runs),
    }
    return environment().get_template("conventions.html.j2").render(page)
