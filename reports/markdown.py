"""The Markdown renderer: a short summary for CI job summaries (counts, failures, run comparison).

Text from results files is escaped for Markdown tables and HTML (job summaries render HTML);
reproduce commands go in fenced blocks longer than any backtick run they contain.
"""

from __future__ import annotations

import itertools

from conformance.results.diff import text as diff_text
from conformance.results.render import ReportInput
from conformance.results.runs import Run
from conformance.results.schema import OUTCOMES
from reports import bench, changes, conventions, sections, tables

MAX_FAILURES = 20
# Benchmark rows in the summary (the HTML report has every one).
MAX_BENCH_ROWS = 40


# Markdown's active characters, each escaped with a backslash; HTML's are entities (job summaries
# render HTML).
_ESCAPES = str.maketrans({**{c: "\\" + c for c in "\\`*_[]|#"}, "&": "&amp;", "<": "&lt;", ">": "&gt;"})


def escape(value: object) -> str:
    """Plain text safe in a Markdown table cell: no HTML, no pipes, no line breaks, no emphasis."""
    return " ".join(str(value).translate(_ESCAPES).split())


def fence(text: str) -> list[str]:
    longest = max((len(list(run)) for tick, run in itertools.groupby(text) if tick == "`"), default=0)
    ticks = "`" * max(3, longest + 1)
    return [f"{ticks}text", text, ticks]


def render(data: ReportInput) -> str:
    runs = list(data.runs)
    lines = [f"## {escape(data.title)}", ""]
    for run in runs:
        env = sections.environment(run)
        facts = dict(env.facts)
        lines.append(
            f"- **{escape(run.label)}**: {escape(facts['profile'])}, {facts['results']} results, "
            f"{escape(facts['machine'])}, commit {escape(facts['git commit'][:12])}"
        )
    lines += ["", "| backend | " + " | ".join(OUTCOMES) + " |", "|---|" + "---:|" * len(OUTCOMES)]
    for col, counts in tables.totals(runs):
        lines.append(f"| {escape(col.key)} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")
    lines += _failures(runs)
    lines += _rounding(runs) + _conventions(runs) + _properties(runs) + _benchmarks(data, runs)
    for change in changes.changes(runs, data.benches, data.thresholds):
        verdict = "**regression**" if change.diff.regression else "no regression"
        lines += ["", f"### {escape(change.base)} → {escape(change.new)}: {verdict}", ""]
        for line in diff_text(change.diff, data.thresholds, MAX_FAILURES):
            lines += (
                [f"- {escape(line.strip())}"] if line.startswith("  ") else ["", f"**{escape(line)}**", ""]
            )
    lines += ["", "Full report: `normconf report RESULTS -o report.html` (self-contained HTML)."]
    return "\n".join(lines) + "\n"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _conventions(runs: list[Run]) -> list[str]:
    found = conventions.conventions(runs)
    if found is None:
        return []
    lines = [
        "",
        "### Conventions",
        "",
        "`*` differs from normconf's reference, `?` no hypothesis matched, `-` not asked.",
        "",
    ]
    if found.changed:
        lines += ["Changed between runs:", "", *(f"- {escape(line)}" for line in found.changed), ""]
    head = ["question", *(escape(c.key) for c in found.columns)]
    rows = [
        [
            escape(row.question),
            *(escape(row.cells[c.id].text) if c.id in row.cells else "" for c in found.columns),
        ]
        for row in found.rows
    ]
    unmatched = found.unmatched()
    if unmatched:
        evidence = [
            f"- {escape(question)}, {escape(column)}: {escape(answer.nearest)}"
            for question, column, answer in unmatched
        ]
        title = f"Unmatched answers ({len(unmatched)}): the nearest hypothesis and its error"
        return lines + _table(head, rows) + ["", title, "", *evidence]
    return lines + _table(head, rows)


def _properties(runs: list[Run]) -> list[str]:
    found = conventions.properties(runs)
    if found is None:
        return []
    head = ["property", *(escape(c.key) for c in found.columns)]
    rows = [
        [
            escape(row.name),
            *(escape(row.cells[c.id].text) if c.id in row.cells else "" for c in found.columns),
        ]
        for row in found.rows
    ]
    lines = ["", "### Properties", "", *_table(head, rows)]
    failed = [
        (row.name, c.key, row.cells[c.id])
        for row in found.rows
        for c in found.columns
        if c.id in row.cells and row.cells[c.id].counterexample
    ]
    for name, key, cell in failed:
        example = ", ".join(f"{k}={v}" for k, v in cell.counterexample)
        lines.append(f"- {escape(key)} {escape(name)}: counterexample {escape(example)}")
    return lines


def _rounding(runs: list[Run]) -> list[str]:
    rows = sections.rounding(runs)
    if not rows:
        return []
    head = [
        "backend",
        "dtype",
        "judged",
        "beyond limit",
        "bias median / worst",
        "drift median / worst",
        "mismatch",
    ]
    body = [
        [
            escape(r.backend),
            r.dtype,
            f"{r.judged} of {r.comparisons}",
            str(r.failing),
            f"{r.median_bias} / {r.worst_bias}",
            f"{r.median_drift} / {r.worst_drift}",
            r.median_mismatch,
        ]
        for r in rows
    ]
    note = (
        "Mean signed error of half-precision outputs in ulps: bias < 0 leans toward zero (truncation -0.5), "
        "drift < 0 toward -inf (rounding up +0.5); round-to-nearest gives about 0."
    )
    return ["", "### Rounding", "", note, "", *_table(head, body)]


def _failures(runs: list[Run]) -> list[str]:
    found = tables.failures(runs)
    if not found:
        return ["", "No failed, errored or stale (xpassed) check."]
    lines = ["", f"### Failures ({len(found)})", ""]
    for f in found[:MAX_FAILURES]:
        where = f"{escape(f.column.key)} {escape(f.case_id)} \\[{escape(f.check)}\\]"
        lines.append(f"- **{f.outcome}** {where}: {escape(f.headline)}")
        worst = [g for g in f.figures if g.failing]
        if worst:
            lines.append(
                "  "
                + "; ".join(
                    f"`{escape(g.output)}` worst_ratio {g.worst_ratio}"
                    + (f" at {g.index}" if g.index else "")
                    for g in worst
                )
            )
        if f.reproduce:
            lines += ["", *("  " + line for line in fence(f.reproduce)), ""]
    if len(found) > MAX_FAILURES:
        lines.append(f"- ... and {len(found) - MAX_FAILURES} more in the HTML report")
    return lines


def render_conventions(data: ReportInput) -> str:
    """The conventions table alone (``normconf conventions``): a title, the runs, the table."""
    runs = list(data.runs)
    lines = [f"## {escape(data.title)}", ""]
    lines += [f"- **{escape(run.label)}**: {len(run.records)} results" for run in runs]
    table = _conventions(runs)
    return "\n".join(lines + (table or ["", "These results hold no fingerprint record."])) + "\n"


def _benchmarks(data: ReportInput, runs: list[Run]) -> list[str]:
    """Per case and check: each backend's median, GB/s and fraction of the same-run copy (speedup
    over the baseline where there is one)."""
    if not data.benches:
        return []
    found = bench.bench_table(data.benches, runs, data.baseline)
    cols = [c.key for c in found.columns]
    rows = []
    for row in found.rows[:MAX_BENCH_ROWS]:
        cells = []
        for key in cols:
            c = row.cells.get(key)
            if c is None:
                cells.append("")
                continue
            text = f"{c.median_us:.3g} us"
            text += f", {c.gbps:.3g} GB/s" if c.gbps is not None else ""
            text += f" ({c.roofline_fraction:.0%} of copy)" if c.roofline_fraction is not None else ""
            text += f", {c.speedup:.2f}x" if c.speedup is not None and key != found.baseline else ""
            if c.device_us is not None and c.host_us is not None:
                text += f"; device {c.device_us:.3g} us + host {c.host_us:.3g} us"
                text += f", {c.launches:g} launches" if c.launches is not None else ""
                text += f", {c.h2d_copies:g} h2d copies" if c.h2d_copies else ""
            cells.append(escape(text))
        rows.append([escape(row.case_id), escape(row.check), *cells])
    title = f"### Benchmarks ({len(found.rows)} timed cases"
    title += f"; speedups over {escape(found.baseline)})" if found.baseline else ")"
    lines = ["", title, "", *_table(["case", "check", *map(escape, cols)], rows)]
    if len(found.rows) > MAX_BENCH_ROWS:
        lines.append(f"\n... and {len(found.rows) - MAX_BENCH_ROWS} more in the HTML report")
    lines += [f"- {escape(name)}: {escape(value)}" for name, value in found.auxiliary]
    return lines
