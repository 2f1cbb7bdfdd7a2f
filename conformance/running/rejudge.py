"""Re-judging a results file: the current tolerances and ledger applied to recorded results, no backend
run, so a ledger change can be checked against runs from hardware this machine does not have.

A failed or xfailed comparison check stores the outputs it compared (``extra.outputs``, compressed,
up to ``conformance.results.stored.ELEMENTS`` elements); the inputs and the oracle regenerate from the
case. Such a result is compared again in full. A result without stored outputs (an older file, a large
case) keeps its recorded figures, and a model entry is judged at its recorded worst element only: the
backend's value there against the model's, under the recorded allowance (``explained.point``); a
failure of the rounding bias alone, which one element cannot show, keeps the live run's explanation
when the entry names the same model.
"""

from __future__ import annotations

import dataclasses
import datetime
import gzip
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.judging.ledger import COMPARED_CHECKS, Ledger
from conformance.judging.platform import Platform
from conformance.judging.tolerances import ToleranceTable
from conformance.judging.verdict import Evidence, compare_outputs, judge
from conformance.model.case import Case, CaseError
from conformance.results import stored as stored_outputs
from conformance.results.records import from_dict, text
from conformance.results.result import Result
from conformance.results.schema import SchemaError
from conformance.running import observed
from conformance.running.checks import CHECKS, materials

# The outcomes of a check that judged outputs.
_JUDGED = frozenset({"passed", "failed", "xfailed", "xpassed"})


@dataclass(frozen=True)
class Change:
    """One result whose outcome the current rules judge otherwise."""

    backend: str
    case: str
    check: str
    before: str
    after: str


@dataclass(frozen=True)
class Rejudged:
    header: dict[str, Any]
    records: list[dict[str, Any]]
    changes: tuple[Change, ...]
    stored: int  # results judged again in full from their stored outputs
    pointwise: int  # results judged from their recorded figures (models at the worst element)


def rejudge(file: Path, tolerances: ToleranceTable, ledger: Ledger) -> Rejudged:
    """Every comparison check of ``file`` judged again under ``tolerances`` and ``ledger``."""
    header, raws = _read(file)
    environment = header.get("environment") or {}
    here = _Platforms(environment, header.get("backends") or {})
    out: list[dict[str, Any]] = []
    changes: list[Change] = []
    counts: Counter[str] = Counter()
    for raw in raws:
        new = _record(raw, tolerances, ledger, here, counts)
        if new["outcome"] != raw.get("outcome"):
            case = str(raw.get("case", {}).get("id", ""))
            changes.append(Change(raw["backend"], case, raw["check"], raw["outcome"], new["outcome"]))
        out.append(new)
    typed = [r for r in map(from_dict, out) if r is not None]
    devices = {name: here(name).device for name in (header.get("backends") or {})}
    seen = observed.observe(ledger, typed, devices, header.get("profile"), where=here.base.on)
    new_header = {
        **header,
        "tolerances": {"path": tolerances.path, "sha256": tolerances.sha256},
        "ledger": observed.header(ledger, seen),
        "rejudged": {
            "from": str(file),
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
    }
    return Rejudged(new_header, out, tuple(changes), counts["stored"], counts["pointwise"])


class _Platforms:
    """Each backend's platform as the file recorded it: its device, the run's CPU and versions."""

    def __init__(self, environment: Mapping[str, Any], backends: Mapping[str, Any]) -> None:
        features = environment.get("cpu_features")
        versions = environment.get("packages") or {}
        self.base = Platform(
            "cpu",
            frozenset(map(str, features)) if isinstance(features, list) else frozenset(),
            {str(k): None if v is None else str(v) for k, v in versions.items()},
        )
        self.backends = backends

    def __call__(self, backend: str) -> Platform:
        info = self.backends.get(backend)
        device = str(info.get("device", "cpu")) if isinstance(info, Mapping) else "cpu"
        return self.base.on(device)


def _read(file: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        lines = [json.loads(line) for line in text(file).splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile, json.JSONDecodeError) as exc:
        raise SchemaError(f"{file}: cannot read results: {exc}") from exc
    if not lines or not isinstance(lines[0], dict) or lines[0].get("kind") != "header":
        raise SchemaError(f"{file}: first record must be the header")
    if lines[0].get("schema") != 2:
        raise SchemaError(f"{file}: schema {lines[0].get('schema')} cannot be re-judged; allowed: 2")
    return lines[0], lines[1:]


def _record(
    raw: dict[str, Any],
    tolerances: ToleranceTable,
    ledger: Ledger,
    here: _Platforms,
    counts: Counter[str],
) -> dict[str, Any]:
    comparable = raw.get("check") in COMPARED_CHECKS and raw.get("outcome") in _JUDGED
    if raw.get("kind") != "result" or not comparable:
        return raw
    try:
        case = Case.from_dict(dict(raw["case"]))
    except (CaseError, KeyError, TypeError):
        return raw  # a case this suite does not know (a newer op): left as recorded
    result = Result.from_dict(raw)
    extra = raw.get("extra") or {}
    info = extra.get("info") if isinstance(extra.get("info"), Mapping) else None
    inputs, expected = materials(case)
    stored = extra.get("outputs")
    if isinstance(stored, str):
        actual = stored_outputs.decode(stored)
        names = CHECKS[raw["check"]].outputs(case)
        comparisons = compare_outputs(case, inputs, expected, actual, names, tolerances)
        counts["stored"] += 1
        recorded = {}
    else:
        actual = {}
        recorded = {c.output: c.explained for c in result.comparisons if c.explained is not None}
        comparisons = tuple(dataclasses.replace(c, ledger=None, explained=None) for c in result.comparisons)
        counts["pointwise"] += 1
    evidence = Evidence(inputs, expected, actual, tolerances, recorded)
    reproduce = str(raw.get("reproduce", ""))
    verdict = judge(
        raw["backend"],
        case,
        raw["check"],
        comparisons,
        ledger,
        reproduce,
        info,
        here(raw["backend"]),
        evidence,
    )
    judged = tuple(dataclasses.replace(c, ledger=verdict.ledger.get(c.output)) for c in verdict.comparisons)
    rewritten = dataclasses.replace(
        result, outcome=verdict.outcome, reason=verdict.reason, summary="", comparisons=judged
    )
    return {**raw, **rewritten.to_dict()}


def outcome_counts(rejudged: Rejudged) -> Counter[str]:
    """Outcomes of the re-judged file's check results."""
    return Counter(str(r.get("outcome")) for r in rejudged.records if r.get("kind") == "result")


def changes_text(rejudged: Rejudged) -> list[str]:
    """What a re-judgement changed: outcome transitions with counts, then each changed result."""
    moves = Counter((c.before, c.after) for c in rejudged.changes)
    lines = [
        f"re-judged {rejudged.stored + rejudged.pointwise} comparison results: {rejudged.stored} in full "
        f"from stored outputs, {rejudged.pointwise} from recorded figures; {len(rejudged.changes)} changed"
    ]
    lines += [f"  {before} -> {after}: {n}" for (before, after), n in sorted(moves.items())]
    lines += [f"  {c.backend} {c.case} [{c.check}]: {c.before} -> {c.after}" for c in rejudged.changes]
    return lines
