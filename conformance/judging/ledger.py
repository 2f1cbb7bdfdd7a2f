"""Known deviations: where a backend is understood to disagree with the oracle, why, and a model of
what it computes instead.

An entry names where it applies by predicates (backends, check, output, op, dtype, dist, training,
case features, the platform: device, CPU features, library versions; the backend's recorded info) and
explains by a ``model`` (conformance.judging.models): an output outside the oracle's tolerance but within
the same tolerance of the model's answer is xfailed and explained. Entries whose cause has no model
yet keep a ``band`` of worst_ratio (or, with ``measure = "rounding"``, of a half-precision output's
rounding bias in ulps) and say so in a ``note``; the report counts them. Legacy entries may still list
exact case ids (``case`` globs).

The built-in entries are one file per backend family in ``conformance/judging/deviations/``; each file
states its reasons once in a ``[reasons]`` table that entries cite by key. ``--ledger FILE`` adds a
file to them (a third party's adapter brings its own); replacing them takes an explicit flag.

An entry that no result of a run needed is *not observed here*, which is no failure: a deviation of
another machine's kernels. Strict mode (``--strict-ledger``, the project's reference runs) fails such
entries, and a listed case id whose output passes (``xpassed``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.judging import models, platform, tomlfile
from conformance.judging.platform import Condition, Platform
from conformance.judging.tolerances import OUTPUTS
from conformance.model.case import DISTS, FEATURES, OPS, Case
from conformance.model.dtypes import DTYPES
from conformance.model.profiles import PROFILES
from conformance.results.result import ComparisonRecord
from conformance.results.schema import jsonable

_MATCH_KEYS: tuple[str, ...] = ("backend", "check", "output", "op", "dtype", "dist", "features", "case")
_FIELDS = set(_MATCH_KEYS) | {
    "band",
    "reason",
    "link",
    "training",
    "measure",
    "info",
    "model",
    "note",
    "platform",
    "profiles",
}
_FILE_KEYS = {"deviation", "reasons"}
MEASURES: tuple[str, ...] = ("worst_ratio", "rounding")
# The checks that compare outputs with the oracle, hence the ones a model can explain (a property's
# examples are drawn, not stored) and re-judging can judge again.
COMPARED_CHECKS: tuple[str, ...] = ("forward", "backward", "training")


class LedgerError(ValueError):
    """The ledger file is malformed; the message names the file, the entry and the field."""


@dataclass(frozen=True)
class Deviation:
    """One ledger entry. Match keys hold allowed values (``features``: all required; ``case``: id globs)."""

    index: int
    match: dict[str, tuple[str, ...]]
    training: bool | None
    band: tuple[float, float]
    reason: str
    link: str
    measure: str = "worst_ratio"
    # (info key, allowed values as text): what the backend must have recorded for the entry to apply.
    info: tuple[tuple[str, tuple[str, ...]], ...] = ()
    model: str = ""
    note: str = ""
    condition: Condition = field(default_factory=Condition)
    profiles: tuple[str, ...] = ()  # the profiles a strict run expects to observe it in (all when empty)
    file: str = ""
    reason_key: str = ""

    @property
    def lists_cases(self) -> bool:
        """An entry of exact case ids claims those cases fail; a predicate entry claims only a cause."""
        return "case" in self.match

    def covers(self, comparison: ComparisonRecord) -> bool:
        """Whether this failing comparison is the deviation a band entry describes, inside its band."""
        if self.measure == "rounding":
            size = comparison.rounding.size if comparison.rounding is not None else math.inf
            return comparison.worst_ratio <= 1.0 and not comparison.problem and size <= self.band[1]
        # Beyond tolerance: covered whatever the bias. Within it, a bias is not what this entry records.
        return comparison.worst_ratio <= self.band[1] and (
            comparison.worst_ratio > 1.0 or comparison.rounding_passed
        )

    def applies(
        self,
        backend: str,
        case: Case,
        check: str,
        output: str,
        info: Mapping[str, object] | None = None,
        where: Platform | None = None,
    ) -> bool:
        """Whether the entry speaks of this output. ``where`` (default: a CPU run of this machine)
        judges the platform condition."""
        if self.info and (info is None or not self.info_holds(info)):
            return False
        if self.condition and not self.condition.holds(where or platform.here()):
            return False
        return (
            self.matches_case(case, backend)
            and check in self.match["check"]
            and output in self.match["output"]
        )

    def info_holds(self, info: Mapping[str, object]) -> bool:
        """Whether the backend's recorded info holds one of the allowed values of every info key."""
        return all(_text(info.get(k)) in v for k, v in self.info)

    def matches_case(self, case: Case, backend: str | None = None) -> bool:
        """The case predicates (and the backend, when given) without check, output, info or platform."""
        values = {"backend": backend, "op": case.op, "dtype": case.dtype, "dist": case.dist}
        for key, allowed in self.match.items():
            if key == "case":
                if not any(fnmatch.fnmatchcase(case.id, pattern) for pattern in allowed):
                    return False
            elif key == "features":
                if not set(allowed) <= case.features:
                    return False
            elif key in values and (key != "backend" or backend is not None) and values[key] not in allowed:
                return False
        return self.training is None or self.training == case.training

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "index": self.index,
            "match": {k: list(v) for k, v in self.match.items()},
            "band": [jsonable(b) for b in self.band],  # an open band is [1, inf]
            "reason": self.reason,
            "link": self.link,
        }
        optional = {
            "measure": self.measure if self.measure != "worst_ratio" else "",
            "model": self.model,
            "note": self.note,
            "file": self.file,
            "reason_key": self.reason_key,
        }
        record.update({k: v for k, v in optional.items() if v})
        if self.info:
            record["info"] = {k: list(v) for k, v in self.info}
        if self.condition:
            record["platform"] = self.condition.to_dict()
        if self.profiles:
            record["profiles"] = list(self.profiles)
        return {**record, "training": self.training} if self.training is not None else record


@dataclass(frozen=True)
class Ledger:
    """Every entry of the files read, numbered across them in order; ``strict`` is the reference mode."""

    path: str
    sha256: str
    entries: tuple[Deviation, ...]
    strict: bool = False
    files: tuple[str, ...] = ()
    builtin: bool = True  # whether the built-in entries are among them

    def find(
        self,
        backend: str,
        case: Case,
        check: str,
        output: str,
        info: Mapping[str, object] | None = None,
        where: Platform | None = None,
    ) -> Deviation | None:
        return next(iter(self.applicable(backend, case, check, output, info, where)), None)

    def applicable(
        self,
        backend: str,
        case: Case,
        check: str,
        output: str,
        info: Mapping[str, object] | None = None,
        where: Platform | None = None,
    ) -> tuple[Deviation, ...]:
        """Every entry that speaks of this output, in file order: any of them may explain it."""
        return tuple(d for d in self.entries if d.applies(backend, case, check, output, info, where))

    @property
    def band_only(self) -> tuple[Deviation, ...]:
        """Entries whose cause has no executable model yet."""
        return tuple(d for d in self.entries if not d.model)


def default_path() -> Path:
    """Where the built-in entries live (a folder of one file per backend family)."""
    return tomlfile.builtin("deviations")


def builtin_files() -> tuple[Path, ...]:
    return tuple(sorted(default_path().glob("*.toml")))


def read_ledger(
    path: str | Path | Sequence[str | Path] | None,
    checks: Collection[str],
    *,
    builtin: bool = True,
    strict: bool = False,
) -> Ledger:
    """Read and validate the built-in entries (unless ``builtin`` is False) followed by the files in
    ``path`` (one or several; a folder reads its ``*.toml``). ``checks`` are the names an entry's
    ``check`` may take (the running layer's checks and the properties): a typo must not silently
    match nothing."""
    extra = [] if path is None else [path] if isinstance(path, (str, Path)) else list(path)
    files = [*(builtin_files() if builtin else ()), *(_expand(Path(p)) for p in extra)]
    flat = [f for group in files for f in ([group] if isinstance(group, Path) else group)]
    entries: list[Deviation] = []
    digest = hashlib.sha256()
    for file in flat:
        data, sha256 = tomlfile.read(file, "ledger", LedgerError)
        digest.update(f"{file.name}:{sha256}\n".encode())
        entries += _file_entries(file, data, checks, len(entries))
    where = "; ".join(str(p) for p in ([default_path()] if builtin else []) + [Path(p) for p in extra])
    return Ledger(where, digest.hexdigest(), tuple(entries), strict, tuple(map(str, flat)), builtin)


def _expand(path: Path) -> Path | list[Path]:
    return sorted(path.glob("*.toml")) if path.is_dir() else path


def _file_entries(file: Path, data: dict[str, Any], checks: Collection[str], start: int) -> list[Deviation]:
    unknown = sorted(set(data) - _FILE_KEYS)
    if unknown:
        raise LedgerError(f"{file}: unknown table(s) {unknown}; allowed: [[deviation]], [reasons.KEY]")
    entries = data.get("deviation", [])
    if not isinstance(entries, list):
        raise LedgerError(f"{file}: expected [[deviation]] tables")
    reasons = _reasons(file, data.get("reasons", {}))
    used = set()
    parsed = []
    for i, entry in enumerate(entries):
        deviation = _entry(file, start + i, i, entry, checks, reasons)
        used.add(deviation.reason_key)
        parsed.append(deviation)
    unused = sorted(set(reasons) - used)
    if unused:
        raise LedgerError(f"{file}: reasons {unused} are cited by no entry; remove them or cite them")
    return parsed


@dataclass(frozen=True)
class _Reason:
    """A ``[reasons.KEY]`` table: the cause, where it is documented, and (for entries that explain by a
    band) why it has no model yet."""

    text: str
    link: str = ""
    note: str = ""


def _reasons(file: Path, raw: Any) -> dict[str, _Reason]:
    """key -> reason of a file's ``[reasons.KEY]`` tables."""
    if not isinstance(raw, dict):
        raise LedgerError(f"{file}: reasons={raw!r} is not allowed; allowed: [reasons.KEY] tables")
    found = {}
    for key, table in raw.items():
        if (
            not isinstance(table, dict)
            or not str(table.get("text", "")).strip()
            or set(table) - {"text", "link", "note"}
        ):
            raise LedgerError(
                f"{file}: reasons.{key} is not allowed; allowed: a table with text (and link, note)"
            )
        found[str(key)] = _Reason(str(table["text"]), str(table.get("link", "")), str(table.get("note", "")))
    return found


def _entry(
    file: Path,
    index: int,
    local: int,
    entry: Any,
    checks: Collection[str],
    reasons: Mapping[str, _Reason],
) -> Deviation:
    where = f"{file}: deviation[{local}]"
    if not isinstance(entry, dict):
        raise LedgerError(f"{where}: expected a table")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise LedgerError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(_FIELDS)}")
    for required in ("backend", "check", "output", "reason"):
        if required not in entry:
            raise LedgerError(f"{where}: missing field {required!r}")
    match = {k: _strings(where, k, entry[k]) for k in _MATCH_KEYS if k in entry}
    for key, allowed in _known(checks).items():
        unknown_values = sorted(set(match.get(key, ())) - set(allowed))
        if unknown_values:
            raise LedgerError(
                f"{where}: {key}={unknown_values} is not allowed; allowed: {', '.join(allowed)}"
            )
    key = str(entry["reason"])
    if not key.strip():
        raise LedgerError(f"{where}: reason='' is not allowed; allowed: an explanation of the deviation")
    cited = reasons.get(key, _Reason(key))
    reason, link = cited.text, str(entry.get("link", cited.link))
    note = str(entry.get("note", cited.note))
    training = entry.get("training")
    if training is not None and not isinstance(training, bool):
        raise LedgerError(f"{where}: training={training!r} is not allowed; allowed: true, false")
    measure = entry.get("measure", "worst_ratio")
    if measure not in MEASURES:
        raise LedgerError(f"{where}: measure={measure!r} is not allowed; allowed: {', '.join(MEASURES)}")
    model, band = _explanation(where, entry, match, measure)
    if not model and not note.strip():
        raise LedgerError(
            f"{where}: a band entry needs a note (its own or its reason's) saying why the cause has no "
            'model yet; allowed: note = "...", or a model'
        )
    info = _info(where, entry.get("info", {}))
    condition = platform.parse(where, entry.get("platform", {}), LedgerError)
    profiles = _strings(where, "profiles", entry["profiles"]) if "profiles" in entry else ()
    bad = sorted(set(profiles) - set(PROFILES))
    if bad:
        raise LedgerError(f"{where}: profiles={bad} is not allowed; allowed: {', '.join(PROFILES)}")
    return Deviation(
        index,
        match,
        training,
        band,
        reason,
        link,
        measure,
        info,
        model,
        note,
        condition,
        profiles,
        str(file),
        key if key in reasons else "",
    )


def _explanation(
    where: str, entry: dict[str, Any], match: Mapping[str, tuple[str, ...]], measure: str
) -> tuple[str, tuple[float, float]]:
    """(model, band): an entry explains by a model or, without one, by a band."""
    if "model" in entry and ("band" in entry or measure != "worst_ratio"):
        raise LedgerError(
            f"{where}: model with band or measure is not allowed; allowed: a model, or a band (and measure)"
        )
    if "model" not in entry:
        if "band" not in entry:
            raise LedgerError(f"{where}: missing field 'model' (or 'band' where the cause has no model yet)")
        return "", _band(where, entry["band"], 0.0 if measure == "rounding" else 1.0)
    name = str(entry["model"])
    try:
        models.resolve(name)
    except models.ModelError as exc:
        raise LedgerError(f"{where}: {exc}") from exc
    odd = sorted(set(match["check"]) - set(COMPARED_CHECKS))
    if odd:
        raise LedgerError(
            f"{where}: check={odd} is not allowed with a model; allowed: {', '.join(COMPARED_CHECKS)}"
        )
    return name, (1.0, math.inf)


def _info(where: str, value: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(value, dict):
        raise LedgerError(f"{where}: info={value!r} is not allowed; allowed: a table of info key = value(s)")
    return tuple((str(k), _strings(where, f"info.{k}", v)) for k, v in sorted(value.items()))


def _text(value: object) -> str:
    """An info value as the ledger compares it: strings as they are, others as JSON writes them."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _known(checks: Collection[str]) -> dict[str, tuple[str, ...]]:
    return {
        "check": tuple(checks),
        "output": OUTPUTS,
        "op": OPS,
        "dtype": DTYPES,
        "dist": DISTS,
        "features": FEATURES,
    }


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
