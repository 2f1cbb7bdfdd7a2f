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
# Schema 1 headers did not list the checks; these are the ones (in order) every schema 1 suite ran.
SCHEMA_1_CHECKS: tuple[str, ...] = ("forward", "backward", "training", "inputs_unchanged", "determinism")
# Module paths a schema 1 reproduce command may name, and their places now.
_MOVED_PLUGINS = {"-p conformance.progress": "-p conformance.cli.progress"}
_RULE = re.compile(r"\brule\[(\d+)\]")
_RULE_KEYS = re.compile(r"\b(op|output|dtype|dist)=(\S+)")
# An xfailed reason is "<output>: <why> (ledger deviation[N])" per output, joined by "; ".
_XFAILED_CITE = re.compile(r" \(ledger deviation\[(\d+)\]\)")
# An xpassed reason names one output: "ledger deviation[N] expects output 'y' to fail".
_XPASSED = re.compile(r"ledger deviation\[(\d+)\] expects output '(\w+)'")
# A failed reason has a block per failing output: "output 'y' ..." and, where an entry covered it,
# "ledger deviation[N] covers this output up to ...".
_FAILED_OUTPUT = re.compile(r"^output '(\w+)'", re.M)
_FAILED_CITE = re.compile(r"ledger deviation\[(\d+)\] covers this output")
_MATCH_KEYS = ("backend", "check", "output", "op", "dtype", "dist", "case")


def upgrade(file: Path, header: Raw, records: list[Raw]) -> tuple[Raw, list[Raw]]:
    return _header(file, header), [_result(r) if r.get("kind") == "result" else r for r in records]


def _header(file: Path, raw: Raw) -> Raw:
    header = {**raw, "checks": list(SCHEMA_1_CHECKS)}
    ledger = header.get("ledger")
    if not isinstance(ledger, Mapping):
        return header
    entries, note = _ledger_entries(ledger)
    upgraded = {**header, "ledger": {**ledger, **({"entries": entries} if entries is not None else {})}}
    return {**upgraded, "ledger_note": note} if note else upgraded


def _ledger_bytes(path: Path) -> bytes | None:
    """The ledger file a header names, where it is still readable. (The built-in single file of
    schema 1 runs is now one file per backend family: such a run's entries show as its results cite
    them.)"""
    try:
        return path.read_bytes()
    except OSError:
        return None


def _ledger_entries(ledger: Mapping[str, Any]) -> tuple[list[Raw] | None, str]:
    """The entries of the ledger file the header names, if it is still here and unchanged; else a note
    (the report prefixes it with the run's label)."""
    path = Path(str(ledger.get("path", "")))
    raw = _ledger_bytes(path)
    if raw is None:
        return None, f"ledger {path} is not readable here; entries are shown as the results cite them"
    if hashlib.sha256(raw).hexdigest() != ledger.get("sha256"):
        return None, f"ledger {path} changed since the run; entries are shown as the results cite them"
    try:
        tables = tomllib.loads(raw.decode()).get("deviation", [])
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        return None, f"ledger {path} is not readable: {exc}"
    if not isinstance(tables, list):
        return None, f"ledger {path}: expected [[deviation]] tables"
    return [_entry(i, t) for i, t in enumerate(tables) if isinstance(t, dict)], ""


def _entry(index: int, table: Mapping[str, Any]) -> Raw:
    entry = {
        "index": index,
        "match": {
            k: table[k] if isinstance(table[k], list) else [table[k]] for k in _MATCH_KEYS if k in table
        },
        "band": table.get("band", []),
        "reason": str(table.get("reason", "")),
        "link": str(table.get("link", "")),
    }
    return {**entry, "training": table["training"]} if isinstance(table.get("training"), bool) else entry


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
    reproduce = str(record.get("reproduce", ""))
    for old, new in _MOVED_PLUGINS.items():
        reproduce = reproduce.replace(old, new)
    return {**record, "summary": summary_of(reason), "comparisons": upgraded, "reproduce": reproduce}


def _cited(outcome: str, reason: str) -> dict[str, int]:
    """Output -> ledger entry index, as the reason of a schema 1 result names it."""
    if outcome == "xpassed":
        found = _XPASSED.search(reason)
        return {found[2]: int(found[1])} if found else {}
    if outcome == "failed":
        blocks = ((_FAILED_OUTPUT.search(b), _FAILED_CITE.search(b)) for b in reason.split("\n\n"))
        return {output[1]: int(cite[1]) for output, cite in blocks if output and cite}
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
