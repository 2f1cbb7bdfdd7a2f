"""Known deviations: a backend's measured disagreement with the oracle, with reason, link and band.

Entries are strict: a matched output that passes makes the check ``xpassed`` (reported as a
failure), and a worst_ratio above the entry's band is an ordinary failure, so entries cannot
hide regressions or outlive the deviation they describe. An entry may also name a metamorphic
property as its check (conformance/properties/catalog.py): it then covers the failing examples it matches,
within its band, and is not strict, since a property's examples are drawn rather than listed.

An entry's band measures worst_ratio, or with ``measure = "rounding"`` the rounding statistic of a
half-precision output whose every element is within tolerance (the larger of |bias| and |drift| in
ulps, conformance.judging.rounding). A worst_ratio entry covers its comparisons whatever their
rounding bias (an error beyond tolerance is the larger symptom); a rounding entry covers only
comparisons within tolerance.

An entry may also require what the backend recorded for the case (``Prepared.info()``): ``info = {
norm_precision = ["bf16"] }`` applies only where the result's info holds one of those values (compared
as text). A runtime that picks its precision from the hardware deviates on one machine and not on
another; the condition names the choice that causes the deviation, so the entry stays strict on both.
A property example carries the info of its calls too; a check that recorded no info never matches
such an entry.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.judging import tomlfile
from conformance.judging.tolerances import OUTPUTS
from conformance.model.case import DISTS, OPS, Case
from conformance.model.dtypes import DTYPES
from conformance.results.records import ComparisonRecord, jsonable

_MATCH_KEYS: tuple[str, ...] = ("backend", "check", "output", "op", "dtype", "dist", "case")
_FIELDS = set(_MATCH_KEYS) | {"band", "reason", "link", "training", "measure", "info"}
MEASURES: tuple[str, ...] = ("worst_ratio", "rounding")


class LedgerError(ValueError):
    """The ledger file is malformed; the message names the file, the entry and the field."""


@dataclass(frozen=True)
class Deviation:
    """One ledger entry. Match keys hold allowed values; ``case`` holds id glob patterns."""

    index: int
    match: dict[str, tuple[str, ...]]
    training: bool | None
    band: tuple[float, float]
    reason: str
    link: str
    measure: str = "worst_ratio"
    # (info key, allowed values as text): what the backend must have recorded for the entry to apply.
    info: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def covers(self, comparison: ComparisonRecord) -> bool:
        """Whether this failing comparison is the deviation the entry describes, inside its band."""
        if self.measure == "rounding":
            size = comparison.rounding.size if comparison.rounding is not None else math.inf
            return comparison.worst_ratio <= 1.0 and not comparison.problem and size <= self.band[1]
        # Beyond tolerance: covered whatever the bias. Within it, a bias is not what this entry records.
        return comparison.worst_ratio <= self.band[1] and (
            comparison.worst_ratio > 1.0 or comparison.rounding_passed
        )

    def applies(
        self, backend: str, case: Case, check: str, output: str, info: Mapping[str, object] | None = None
    ) -> bool:
        if self.info and (info is None or any(_text(info.get(k)) not in v for k, v in self.info)):
            return False
        values = {
            "backend": backend,
            "check": check,
            "output": output,
            "op": case.op,
            "dtype": case.dtype,
            "dist": case.dist,
        }
        for key, allowed in self.match.items():
            if key == "case":
                if not any(fnmatch.fnmatchcase(case.id, pattern) for pattern in allowed):
                    return False
            elif values[key] not in allowed:
                return False
        return self.training is None or self.training == case.training

    def to_dict(self) -> dict[str, Any]:
        record = {
            "index": self.index,
            "match": {k: list(v) for k, v in self.match.items()},
            "band": [jsonable(b) for b in self.band],  # an open band is [1, inf]
            "reason": self.reason,
            "link": self.link,
        }
        if self.measure != "worst_ratio":
            record["measure"] = self.measure
        if self.info:
            record["info"] = {k: list(v) for k, v in self.info}
        return {**record, "training": self.training} if self.training is not None else record


@dataclass(frozen=True)
class Ledger:
    path: str
    sha256: str
    entries: tuple[Deviation, ...]

    def find(
        self, backend: str, case: Case, check: str, output: str, info: Mapping[str, object] | None = None
    ) -> Deviation | None:
        return next((d for d in self.entries if d.applies(backend, case, check, output, info)), None)


def default_path() -> Path:
    return tomlfile.builtin("ledger.toml")


def load(path: str | Path | None, checks: Collection[str]) -> Ledger:
    """Read and validate a ledger (the built-in one when ``path`` is None). ``checks`` are the names an
    entry's ``check`` may take (the running layer's checks and the properties): a typo must not
    silently match nothing."""
    file = Path(path) if path is not None else default_path()
    data, sha256 = tomlfile.read(file, "ledger", LedgerError)
    entries = data.get("deviation", [])
    if not isinstance(entries, list):
        raise LedgerError(f"{file}: expected [[deviation]] tables")
    return Ledger(str(file), sha256, tuple(_entry(file, i, e, checks) for i, e in enumerate(entries)))


def _entry(file: Path, index: int, entry: Any, checks: Collection[str]) -> Deviation:
    where = f"{file}: deviation[{index}]"
    if not isinstance(entry, dict):
        raise LedgerError(f"{where}: expected a table")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise LedgerError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(_FIELDS)}")
    for required in ("backend", "check", "output", "band", "reason"):
        if required not in entry:
            raise LedgerError(f"{where}: missing field {required!r}")
    match = {k: _strings(where, k, entry[k]) for k in _MATCH_KEYS if k in entry}
    for key, allowed in _known(checks).items():
        unknown_values = sorted(set(match.get(key, ())) - set(allowed))
        if unknown_values:
            raise LedgerError(
                f"{where}: {key}={unknown_values} is not allowed; allowed: {', '.join(allowed)}"
            )
    if not str(entry["reason"]).strip():
        raise LedgerError(f"{where}: reason='' is not allowed; allowed: an explanation of the deviation")
    training = entry.get("training")
    if training is not None and not isinstance(training, bool):
        raise LedgerError(f"{where}: training={training!r} is not allowed; allowed: true, false")
    measure = entry.get("measure", "worst_ratio")
    if measure not in MEASURES:
        raise LedgerError(f"{where}: measure={measure!r} is not allowed; allowed: {', '.join(MEASURES)}")
    band = _band(where, entry["band"], 0.0 if measure == "rounding" else 1.0)
    info = _info(where, entry.get("info", {}))
    reason, link = str(entry["reason"]), str(entry.get("link", ""))
    return Deviation(index, match, training, band, reason, link, measure, info)


def _info(where: str, value: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(value, dict):
        raise LedgerError(f"{where}: info={value!r} is not allowed; allowed: a table of info key = value(s)")
    return tuple((str(k), _strings(where, f"info.{k}", v)) for k, v in sorted(value.items()))


def _text(value: object) -> str:
    """An info value as the ledger compares it: strings as they are, others as JSON writes them."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _known(checks: Collection[str]) -> dict[str, tuple[str, ...]]:
    return {"check": tuple(checks), "output": OUTPUTS, "op": OPS, "dtype": DTYPES, "dist": DISTS}


def _strings(where: str, key: str, value: Any) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise LedgerError(f"{where}: {key}={value!r} is not allowed; allowed: a string or a list of strings")
    return tuple(values)


def _band(where: str, value: Any, floor: float) -> tuple[float, float]:
    """[low, high]: worst_ratio bands start at 1 (below it nothing fails), rounding bands at 0 (ulps)."""
    ok = isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)
    if not ok or not floor <= value[0] <= value[1]:
        raise LedgerError(
            f"{where}: band={value!r} is not allowed; allowed: [low, high] with {floor:g} <= low <= high"
        )
    return float(value[0]), float(value[1])
