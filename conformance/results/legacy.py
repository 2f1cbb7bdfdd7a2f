"""Schema 1 results files, upgraded to the current schema's form so they still render, merge and compare.

Schema 1 wrote the ledger entry a result cited and the keys of a tolerance rule only inside text (the
reason and the rule's ``source``), and the header named the ledger file without its entries. Reading
that text back is done here and only here, for files written before schema 2; current files carry
every one of these as a field.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conformance.results.text import summary_of

Raw = dict[str, Any]
_RULE = re.compile(r"\brule\[(\d+)\]")
_RULE_KEYS = re.compile(r"\b(op|output|dtype|dist)=(\S+)")
# An xfailed reason is "<output>: <why> (ledger deviation[N])" per output, joined by "; ".
_XFAILED_CITE = re.compile(r" \(ledger deviation\[(\d+)\]\)")
# An xpassed reason names one output: "ledger deviation[N] expects output 'y' to fail".
_XPASSED = re.compile(r"ledger deviation\[(\d+)\] expects output '(\w+)'")


def upgrade(file: Path, header: Raw, records: list[Raw]) -> tuple[Raw, list[Raw]]:
    return _header(file, header), [_result(r) if r.get("kind", "result") == "result" else r for r in records]


# Schema 1 headers did not list the checks; these are the ones (in order) every schema 1 suite ran.
SCHEMA_1_CHECKS: tuple[str, ...] = ("forward", "backward", "training", "inputs_unchanged", "determinism")


def _header(file: Path, raw: Raw) -> Raw:
    header = {**raw, "checks": list(SCHEMA_1_CHECKS)}
    ledger = header.get("ledger")
    if not isinstance(ledger, Mapping):
        return header
    entries, note = _ledger_entries(file, ledger)
    upgraded = {**header, "ledger": {**ledger, **({"entries": entries} if entries is not None else {})}}
    return {**upgraded, "ledger_note": note} if note else upgraded


def _ledger_entries(file: Path, ledger: Mapping[str, Any]) -> tuple[list[Raw] | None, str]:
    """The entries of the ledger file the header names, if it is still here and unchanged."""
    path = Path(str(ledger.get("path", "")))
    try:
        raw = path.read_bytes()
    except OSError:
        return (
            None,
            f"{file.stem}: ledger {path} is not readable here; entries are shown as the results cite them",
        )
    if hashlib.sha256(raw).hexdigest() != ledger.get("sha256"):
        return (
            None,
            f"{file.stem}: ledger {path} changed since the run; entries are shown as the results cite them",
        )
    try:
        tables = tomllib.loads(raw.decode()).get("deviation", [])
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        return None, f"{file.stem}: ledger {path} is not readable: {exc}"
    match_keys = ("backend", "check", "output", "op", "dtype", "dist", "case")
    return [
        {
            "index": i,
            "match": {k: t[k] if isinstance(t[k], list) else [t[k]] for k in match_keys if k in t},
            "band": t.get("band", []),
            "reason": str(t.get("reason", "")),
            "link": str(t.get("link", "")),
        }
        for i, t in enumerate(tables)
        if isinstance(t, dict)
    ], ""


def _result(record: Raw) -> Raw:
    reason = str(record.get("reason", ""))
    cited = _cited(str(record.get("outcome", "")), reason)
    comparisons = record.get("comparisons")
    upgraded = (
        [
            {**c, "ledger": cited.get(str(c.get("output"))), "tolerance": _tolerance(c.get("tolerance"))}
            for c in comparisons
            if isinstance(c, Mapping)
        ]
        if isinstance(comparisons, list)
        else comparisons
    )
    return {**record, "summary": summary_of(reason), "comparisons": upgraded}


def _cited(outcome: str, reason: str) -> dict[str, int]:
    """Output -> ledger entry index, as the reason of a schema 1 xfailed or xpassed result names it."""
    if outcome == "xpassed":
        found = _XPASSED.search(reason)
        return {found[2]: int(found[1])} if found else {}
    if outcome != "xfailed":
        return {}
    cited, start = {}, 0
    for found in _XFAILED_CITE.finditer(reason):
        output = reason[start : found.start()].lstrip("; ").split(":", 1)[0].strip()
        cited[output] = int(found[1])
        start = found.end()
    return cited


def _tolerance(raw: object) -> object:
    if not isinstance(raw, Mapping) or "rule" in raw:
        return raw
    source = str(raw.get("source", ""))
    rule = _RULE.search(source)
    return {
        **raw,
        "rule": int(rule[1]) if rule else None,
        "keys": dict(_RULE_KEYS.findall(source)),
        "file": source.split(" ", 1)[0] if rule else "",
    }
