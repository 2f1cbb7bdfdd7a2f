"""Which ledger entries a run observed: the ones its results needed, and of the rest, the ones that
could have applied here (a backend of theirs ran, on a platform their condition admits, over a case they
describe) but found nothing to explain. Those are *not observed here*: a deviation of other machines,
versions or profiles, reported and, in strict mode only, a failure of the run."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conformance.judging import platform
from conformance.judging.ledger import Deviation, Ledger
from conformance.judging.platform import Platform
from conformance.model.case import Case
from conformance.results.properties import PropertyRecord
from conformance.results.records import Record
from conformance.results.result import Result
from conformance.running.checks import CHECK_NAMES


@dataclass(frozen=True)
class Observation:
    """Entry indices: ``used`` by a result, ``unobserved`` (could have applied, needed by none), and
    ``elsewhere`` (for backends, platforms, profiles or cases this run did not have)."""

    used: tuple[int, ...]
    unobserved: tuple[int, ...]
    elsewhere: tuple[int, ...]
    # Unused entries of metamorphic properties: their examples are drawn within a time budget, so a
    # run that drew no deviating example says nothing against them (never a strict failure).
    undrawn: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, list[int]]:
        return {
            "used": list(self.used),
            "not_observed": list(self.unobserved),
            "elsewhere": list(self.elsewhere),
            "undrawn": list(self.undrawn),
        }


def cited(records: Iterable[Record]) -> set[int]:
    """Entries a result or property record cites."""
    found: set[int] = set()
    for record in records:
        if isinstance(record, Result):
            found.update(record.ledger_entries)
        elif isinstance(record, PropertyRecord):
            found.update(i for i in record.extra.get("ledger", ()) if isinstance(i, int))
    return found


# Outcomes of a check that ran the backend and judged it: a ledger entry could have applied there.
_JUDGED = frozenset({"passed", "failed", "xfailed", "xpassed"})


def observe(
    ledger: Ledger,
    records: Sequence[Record],
    devices: Mapping[str, str],
    profile: str | None = None,
    where: Callable[[str], Platform] = platform.here,
) -> Observation:
    """``devices``: each backend that ran -> its device; ``profile``: the run's (None for a cases
    file), against an entry's ``profiles``; ``where`` gives the platform of a device (this machine's by
    default; a re-judged file's as it recorded it). An entry could have applied where a judged
    result (or a property run) of one of its backends and checks exists over a case it describes, on a
    platform its condition admits, with the info it requires."""
    used = cited(records)
    ran = _ran(records)
    unobserved: list[int] = []
    elsewhere: list[int] = []
    undrawn: list[int] = []
    for entry in ledger.entries:
        if entry.index in used:
            continue
        could = (not entry.profiles or profile in entry.profiles) and _could_apply(entry, devices, ran, where)
        drawn = not set(entry.match["check"]) & set(CHECK_NAMES)
        (elsewhere if not could else undrawn if drawn else unobserved).append(entry.index)
    return Observation(tuple(sorted(used)), tuple(unobserved), tuple(elsewhere), tuple(undrawn))


@dataclass
class _Ran:
    """What one backend x check judged: its cases (by id) and the info tables it recorded."""

    cases: dict[str, Case]
    infos: list[Mapping[str, object]]


def _ran(records: Iterable[Record]) -> dict[tuple[str, str], _Ran]:
    found: dict[tuple[str, str], _Ran] = {}
    for record in records:
        if record.outcome not in _JUDGED:
            continue
        if isinstance(record, PropertyRecord):
            found.setdefault((record.backend, record.property), _Ran({}, []))
        elif isinstance(record, Result):
            ran = found.setdefault((record.backend, record.check), _Ran({}, []))
            case_id = str(record.case.get("id", ""))
            if case_id not in ran.cases:
                ran.cases[case_id] = Case.from_dict(dict(record.case))
            info = record.extra.get("info")
            if isinstance(info, Mapping) and info not in ran.infos:
                ran.infos.append(info)
    return found


def _could_apply(
    entry: Deviation,
    devices: Mapping[str, str],
    ran: Mapping[tuple[str, str], _Ran],
    where: Callable[[str], Platform],
) -> bool:
    for backend in entry.match["backend"]:
        if backend not in devices:
            continue
        if entry.condition and not entry.condition.holds(where(devices[backend])):
            continue
        for check in entry.match["check"]:
            done = ran.get((backend, check))
            if done is None:
                continue
            if entry.info and not any(entry.info_holds(info) for info in done.infos):
                continue
            if not done.cases or any(entry.matches_case(case) for case in done.cases.values()):
                return True
    return False


def header(ledger: Ledger, seen: Observation | None) -> dict[str, Any]:
    """The ledger as a results header records it: its files, every entry, and what the run observed."""
    return {
        "path": ledger.path,
        "sha256": ledger.sha256,
        "files": list(ledger.files),
        "strict": ledger.strict,
        "entries": [entry.to_dict() for entry in ledger.entries],
        **(seen.to_dict() if seen is not None else {}),
    }


def lines(ledger: Ledger, seen: Observation) -> list[str]:
    """The terminal's account of the ledger: counts, and each entry not observed here."""
    by_index = {e.index: e for e in ledger.entries}
    head = (
        f"ledger: {len(seen.used)} entries explained results of this run, {len(seen.unobserved)} not "
        f"observed here, {len(seen.undrawn)} of properties whose examples did not draw them, "
        f"{len(seen.elsewhere)} for other backends, platforms or cases; "
        f"{len(ledger.band_only)} of {len(ledger.entries)} explain by a band (no model yet)"
    )
    out = [head]
    for index in seen.unobserved:
        entry = by_index[index]
        where = f"{entry.file}" if entry.file else ledger.path
        out.append(
            f"  not observed here: deviation[{index}] ({where}) {'/'.join(entry.match['backend'])} "
            f"{'/'.join(entry.match['check'])} {'/'.join(entry.match['output'])}: {entry.reason[:100]}"
        )
    if ledger.strict and seen.unobserved:
        out.append(
            f"--strict-ledger: {len(seen.unobserved)} entries were not observed on this run's platform and "
            "profile: remove them, narrow their predicates or give them a platform condition"
        )
    return out
