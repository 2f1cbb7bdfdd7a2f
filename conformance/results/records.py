"""Results records (JSON Lines, SCHEMA_VERSION 2): one header, then one record per backend x case x check.

Additive record kinds share the file: ``fingerprint`` (backend x question) and ``property`` (backend x
metamorphic property). Every record kind is a frozen dataclass that is both written (``to_dict``) and
read back (``from_dict``), so writers and readers share one definition; ``load`` returns a whole file
as typed records. Files of schema 1 are read through ``conformance.results.legacy``, which upgrades
them to this schema's form.

Files are written atomically: records are collected in the one process that writes (the xdist
controller) and the file appears complete, via a temporary file and ``os.replace``, or not at all.
"""

from __future__ import annotations

import builtins
import datetime
import gzip
import json
import math
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from conformance.results import legacy, machine
from conformance.results.text import summary_of

SCHEMA_VERSION = 2
# Versions ``load`` reads: the current one, and 1 through conformance.results.legacy.
READABLE: tuple[int, ...] = (1, 2)
OUTCOMES: tuple[str, ...] = ("passed", "failed", "skipped", "unsupported", "xfailed", "xpassed", "error")
PACKAGES: tuple[str, ...] = (
    "normconf",
    "numpy",
    "ml_dtypes",
    "pytest",
    "pytest-xdist",
    "torch",
    "triton",
    "onnx",
    "onnxruntime",
    "jax",
    "jaxlib",
    "flax",
    "keras",
    "onnxscript",
    "openvino",
    "transformers",
)


class SchemaError(ValueError):
    """A results file is unreadable, corrupt, or of another schema version."""


def jsonable(value: float) -> float | str:
    """JSON has no inf/nan: non-finite figures are written as the strings "inf", "-inf", "nan"."""
    return value if math.isfinite(value) else str(value)


def figure(value: object) -> float:
    """A recorded figure as a float (non-finite values are stored as strings; absent is NaN)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _str(raw: Mapping[str, Any], name: str, default: str = "") -> str:
    value = raw.get(name, default)
    return default if value is None else str(value)


def _index(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count(raw: Mapping[str, Any], name: str) -> int:
    """A recorded count (numel, mismatched, examples); 0 where it is absent or not a number."""
    value = figure(raw.get(name, 0))
    return int(value) if math.isfinite(value) else 0


@dataclass(frozen=True)
class ToleranceRecord:
    """The tolerance rule a comparison was judged by: its figures, its file, index and keys, and why."""

    rtol: float
    atol: float
    cond: float
    source: str
    why: str
    atol_effective: float
    rule: int | None = None
    keys: Mapping[str, str] = field(default_factory=dict)
    file: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "rtol": self.rtol,
            "atol": self.atol,
            "cond": self.cond,
            "source": self.source,
            "why": self.why,
            "rule": self.rule,
            "keys": dict(self.keys),
            "file": self.file,
            "atol_effective": jsonable(self.atol_effective),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ToleranceRecord:
        keys = raw.get("keys") or {}
        return cls(
            figure(raw.get("rtol")),
            figure(raw.get("atol")),
            figure(raw.get("cond", 0.0)),
            _str(raw, "source"),
            _str(raw, "why"),
            figure(raw.get("atol_effective")),
            _index(raw.get("rule")),
            {str(k): str(v) for k, v in keys.items()} if isinstance(keys, Mapping) else {},
            _str(raw, "file"),
        )


@dataclass(frozen=True)
class RoundingRecord:
    """The mean signed error of a half-precision output in ulps (conformance.judging.rounding):
    ``bias`` toward zero when negative, ``drift`` toward -inf when negative, their standard errors, the
    elements counted, and the largest |mean| round-to-nearest reaches at that count (inf: not judged)."""

    bias: float
    bias_se: float
    drift: float
    drift_se: float
    n: int
    limit: float

    @property
    def judged(self) -> bool:
        return math.isfinite(self.limit)

    @property
    def size(self) -> float:
        """The larger of |bias| and |drift|: how far the output leans, whichever way."""
        return max(abs(self.bias), abs(self.drift))

    @property
    def passed(self) -> bool:
        return not self.judged or self.size <= self.limit

    def to_dict(self) -> dict[str, object]:
        return {
            "bias": jsonable(self.bias),
            "bias_se": jsonable(self.bias_se),
            "drift": jsonable(self.drift),
            "drift_se": jsonable(self.drift_se),
            "n": self.n,
            "limit": jsonable(self.limit),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RoundingRecord:
        return cls(
            figure(raw.get("bias")),
            figure(raw.get("bias_se")),
            figure(raw.get("drift")),
            figure(raw.get("drift_se")),
            _count(raw, "n"),
            figure(raw.get("limit", "inf")),
        )


@dataclass(frozen=True)
class Explanation:
    """A known deviation's model judged against one output: the backend's output against the model's
    answer (``worst_ratio``, under the same tolerance rule as against the oracle) and the model's
    answer against the oracle (``model_ratio``: how far the convention itself moves the output)."""

    model: str
    worst_ratio: float
    model_ratio: float
    passed: bool
    # True where only the recorded worst element could be judged (a re-judged result without outputs).
    point: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "worst_ratio": jsonable(self.worst_ratio),
            "model_ratio": jsonable(self.model_ratio),
            "passed": self.passed,
            **({"point": True} if self.point else {}),
        }

    @classmethod
    def from_dict(cls, raw: object) -> Explanation | None:
        if not isinstance(raw, Mapping):
            return None
        return cls(
            _str(raw, "model"),
            figure(raw.get("worst_ratio")),
            figure(raw.get("model_ratio")),
            raw.get("passed") is True,
        )


@dataclass(frozen=True)
class ComparisonRecord:
    """One output of one check against the oracle: every figure, the rule, and the ledger entry (its
    index) that covered this output, if any."""

    output: str
    numel: int
    mismatched: int
    max_abs: float
    max_rel: float
    max_ulp: float
    worst_ratio: float
    worst_index: tuple[int, ...]
    actual_at_worst: float
    expected_at_worst: float
    scale: float
    mean_error: float
    sensitivity: float
    tolerance: ToleranceRecord
    problem: str = ""
    ledger: int | None = None
    # The most cond * mean_error may add (in xhat units); absent in files written before it existed.
    mean_cap: float = math.inf
    # The share of elements that differ from the correctly rounded oracle (NaN: not recorded).
    mismatch_fraction: float = math.nan
    rounding: RoundingRecord | None = None
    # Where a ledger entry's model explained this output: the actual against the model's answer.
    explained: Explanation | None = None

    @property
    def passed(self) -> bool:
        return not self.problem and self.worst_ratio <= 1.0 and self.rounding_passed

    @property
    def rounding_passed(self) -> bool:
        return self.rounding is None or self.rounding.passed

    def to_dict(self) -> dict[str, object]:
        return {
            "output": self.output,
            "numel": self.numel,
            "mismatched": self.mismatched,
            "max_abs": jsonable(self.max_abs),
            "max_rel": jsonable(self.max_rel),
            "max_ulp": jsonable(self.max_ulp),
            "worst_ratio": jsonable(self.worst_ratio),
            "worst_index": list(self.worst_index),
            "actual_at_worst": jsonable(self.actual_at_worst),
            "expected_at_worst": jsonable(self.expected_at_worst),
            "scale": jsonable(self.scale),
            "mean_error": jsonable(self.mean_error),
            "sensitivity": jsonable(self.sensitivity),
            "mean_cap": jsonable(self.mean_cap),
            "mismatch_fraction": jsonable(self.mismatch_fraction),
            "rounding": None if self.rounding is None else self.rounding.to_dict(),
            "tolerance": self.tolerance.to_dict(),
            "problem": self.problem,
            "ledger": self.ledger,
            **({"explained": self.explained.to_dict()} if self.explained is not None else {}),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ComparisonRecord:
        tolerance = raw.get("tolerance")
        index = raw.get("worst_index") or []
        return cls(
            _str(raw, "output", "?"),
            _count(raw, "numel"),
            _count(raw, "mismatched"),
            figure(raw.get("max_abs")),
            figure(raw.get("max_rel")),
            figure(raw.get("max_ulp")),
            figure(raw.get("worst_ratio")),
            tuple(int(i) for i in index) if isinstance(index, list) else (),
            figure(raw.get("actual_at_worst")),
            figure(raw.get("expected_at_worst")),
            figure(raw.get("scale")),
            figure(raw.get("mean_error")),
            figure(raw.get("sensitivity")),
            ToleranceRecord.from_dict(tolerance if isinstance(tolerance, Mapping) else {}),
            _str(raw, "problem"),
            _index(raw.get("ledger")),
            figure(raw.get("mean_cap", "inf")),
            figure(raw.get("mismatch_fraction")),
            RoundingRecord.from_dict(rounding)
            if isinstance(rounding := raw.get("rounding"), Mapping)
            else None,
            Explanation.from_dict(raw.get("explained")),
        )


@dataclass(frozen=True)
class Result:
    """The outcome of one check of one case on one backend.

    ``case`` holds every Case field and ``id`` as recorded (a reader may not know a newer op), ``summary``
    the reason's one-line form (derived from the reason when not given); each comparison names the
    ledger entry that covered it.
    """

    backend: str
    case: Mapping[str, Any]
    check: str
    outcome: str
    reason: str = ""
    summary: str = ""
    comparisons: tuple[ComparisonRecord, ...] = ()
    duration_s: float = 0.0
    reproduce: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.outcome in OUTCOMES, self.outcome
        if not self.summary and self.reason:
            # Derived, not passed: every writer summarises its reason the same way.
            object.__setattr__(self, "summary", summary_of(self.reason))

    @property
    def case_id(self) -> str:
        return str(self.case.get("id", "?"))

    @property
    def op(self) -> str:
        return str(self.case.get("op", "?"))

    @property
    def dtype(self) -> str:
        return str(self.case.get("dtype", "?"))

    @property
    def key(self) -> tuple[str, str, str]:
        """How results join across runs: (backend, case id, check)."""
        return self.backend, self.case_id, self.check

    @property
    def ledger_entries(self) -> tuple[int, ...]:
        """The ledger entries this result cites, in order of first appearance."""
        return tuple(dict.fromkeys(c.ledger for c in self.comparisons if c.ledger is not None))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "result",
            "backend": self.backend,
            "case": dict(self.case),
            "check": self.check,
            "outcome": self.outcome,
            "reason": self.reason,
            "summary": self.summary,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "duration_s": round(self.duration_s, 6),
            "reproduce": self.reproduce,
            **({"extra": dict(self.extra)} if self.extra else {}),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Result:
        for name in ("backend", "check", "outcome"):
            if not isinstance(raw.get(name), str):
                raise SchemaError(f"{name}={raw.get(name)!r} is not allowed; allowed: a string")
        if raw["outcome"] not in OUTCOMES:
            raise SchemaError(f"outcome={raw['outcome']!r} is not allowed; allowed: {', '.join(OUTCOMES)}")
        case = raw.get("case")
        if not isinstance(case, Mapping) or not isinstance(case.get("id"), str):
            raise SchemaError(f"case={case!r} is not allowed; allowed: an object with a string id")
        comparisons = raw.get("comparisons", [])
        if not isinstance(comparisons, list) or not all(isinstance(c, Mapping) for c in comparisons):
            raise SchemaError("comparisons must be a list of objects")
        extra = raw.get("extra") or {}
        return cls(
            raw["backend"],
            dict(case),
            raw["check"],
            raw["outcome"],
            _str(raw, "reason"),
            _str(raw, "summary"),
            tuple(ComparisonRecord.from_dict(c) for c in comparisons),
            figure(raw.get("duration_s", 0.0)),
            _str(raw, "reproduce"),
            dict(extra) if isinstance(extra, Mapping) else {},
        )


@dataclass(frozen=True)
class FingerprintRecord:
    """One backend's answer to one fingerprint question, with the evidence (error under each hypothesis)."""

    backend: str
    question: str
    outcome: str  # answered | unsupported | skipped | error
    answer: str = ""
    matched: bool = False
    reference: str = ""
    evidence: Mapping[str, float] = field(default_factory=dict)
    metric: str = ""
    noise: float = 0.0
    probe: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    estimate: float | None = None
    duration_s: float = 0.0

    @property
    def differs(self) -> bool:
        """Answered with a matched convention other than normconf's reference semantics."""
        return (
            self.outcome == "answered"
            and self.matched
            and bool(self.reference)
            and self.answer != self.reference
        )

    @property
    def cell(self) -> str:
        """The answer in a table: ``*`` differs from the reference, ``?`` no hypothesis matched, ``-`` not
        asked, ``~e?`` an unmatched default eps with its estimate."""
        if self.outcome != "answered":
            return {"unsupported": "-", "skipped": "-", "error": "error"}.get(self.outcome, self.outcome)
        if self.answer == "unmatched" and self.estimate is not None:
            return f"~{self.estimate:.3g}?"
        if not self.matched:
            return self.answer.split(":")[0] + "?"
        return f"{self.answer}*" if self.differs else self.answer

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "kind": "fingerprint",
            "backend": self.backend,
            "question": self.question,
            "outcome": self.outcome,
            "answer": self.answer,
            "matched": self.matched,
            "reference": self.reference,
            "evidence": {name: jsonable(error) for name, error in self.evidence.items()},
            "metric": self.metric,
            "noise": self.noise,
            "probe": self.probe.get("id", ""),
            "probe_case": dict(self.probe),
            "reason": self.reason,
            "duration_s": round(self.duration_s, 6),
        }
        if self.estimate is not None:
            record["estimate"] = jsonable(self.estimate)
        return record

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FingerprintRecord:
        evidence = raw.get("evidence") or {}
        probe = raw.get("probe_case") or {}
        estimate = raw.get("estimate")
        return cls(
            _str(raw, "backend", "?"),
            _str(raw, "question", "?"),
            _str(raw, "outcome", "error"),
            _str(raw, "answer"),
            raw.get("matched") is True,
            _str(raw, "reference"),
            {str(k): figure(v) for k, v in evidence.items()} if isinstance(evidence, Mapping) else {},
            _str(raw, "metric"),
            figure(raw.get("noise", 0.0)),
            dict(probe) if isinstance(probe, Mapping) else {},
            _str(raw, "reason"),
            None if estimate is None else figure(estimate),
            figure(raw.get("duration_s", 0.0)),
        )


@dataclass(frozen=True)
class PropertyRecord:
    """One property on one backend: outcome, examples run, worst ratio, whether related outputs were
    identical bit for bit in every example (None when the property compares with closed forms)."""

    backend: str
    property: str
    outcome: str  # passed | failed | xfailed | unsupported | skipped | error
    reason: str = ""
    examples: int = 0
    worst_ratio: float = 0.0
    bitwise: bool | None = None
    counterexample: Mapping[str, Any] | None = None
    duration_s: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @builtins.property  # the field ``property`` shadows the builtin in this class body
    def cell(self) -> str:
        """The outcome in a table (``-`` not run)."""
        return {"unsupported": "-", "skipped": "-"}.get(self.outcome, self.outcome)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "property",
            "backend": self.backend,
            "property": self.property,
            "outcome": self.outcome,
            "reason": self.reason,
            "examples": self.examples,
            "worst_ratio": jsonable(self.worst_ratio),
            "bitwise": self.bitwise,
            "counterexample": dict(self.counterexample) if self.counterexample is not None else None,
            "duration_s": round(self.duration_s, 6),
            **({"extra": dict(self.extra)} if self.extra else {}),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PropertyRecord:
        counterexample = raw.get("counterexample")
        bitwise = raw.get("bitwise")
        extra = raw.get("extra") or {}
        return cls(
            _str(raw, "backend", "?"),
            _str(raw, "property", "?"),
            _str(raw, "outcome", "error"),
            _str(raw, "reason"),
            _count(raw, "examples"),
            figure(raw.get("worst_ratio", 0.0)),
            bitwise if isinstance(bitwise, bool) else None,
            dict(counterexample) if isinstance(counterexample, Mapping) else None,
            figure(raw.get("duration_s", 0.0)),
            dict(extra) if isinstance(extra, Mapping) else {},
        )


Record = Result | FingerprintRecord | PropertyRecord


# Each record kind a results file holds (besides the header); a reader skips kinds it does not know,
# so files of a later minor addition still render.
KINDS: dict[str, type[Result] | type[FingerprintRecord] | type[PropertyRecord]] = {
    "result": Result,
    "fingerprint": FingerprintRecord,
    "property": PropertyRecord,
}


def from_dict(raw: Mapping[str, Any]) -> Record | None:
    """Any non-header record by its ``kind``; None for a kind this reader does not know."""
    kind = KINDS.get(str(raw.get("kind")))
    return None if kind is None else kind.from_dict(raw)


@dataclass(frozen=True)
class FileRef:
    """A rules file a run used (tolerances or ledger): where it was and its SHA-256."""

    path: str
    sha256: str

    @classmethod
    def from_dict(cls, raw: object) -> FileRef | None:
        if not isinstance(raw, Mapping):
            return None
        return cls(str(raw.get("path", "?")), str(raw.get("sha256", "")))


@dataclass(frozen=True)
class LedgerEntry:
    """A ledger entry as the run recorded it: what it matches, its band, reason and link."""

    index: int
    match: Mapping[str, tuple[str, ...]]
    band: tuple[float, float]
    reason: str
    link: str = ""
    training: bool | None = None
    measure: str = "worst_ratio"  # or "rounding": the band is in ulps of rounding bias
    # What the backend must have recorded in extra.info for the entry to apply (key -> allowed values).
    info: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    model: str = ""  # the executable model that explains it; "" for a band entry
    note: str = ""
    # The platform condition (device, cpu, not_cpu, versions) as recorded.
    platform: Mapping[str, Any] = field(default_factory=dict)
    file: str = ""

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LedgerEntry:
        band = raw.get("band")
        low, high = band if isinstance(band, list) and len(band) == 2 else (math.nan, math.nan)
        training = raw.get("training")
        return cls(
            _index(raw.get("index")) or 0,
            _table(raw.get("match")),
            (figure(low), figure(high)),
            _str(raw, "reason"),
            _str(raw, "link"),
            training if isinstance(training, bool) else None,
            _str(raw, "measure", "worst_ratio"),
            _table(raw.get("info")),
            _str(raw, "model"),
            _str(raw, "note"),
            dict(where) if isinstance(where := raw.get("platform"), Mapping) else {},
            _str(raw, "file"),
        )


def _indices(raw: Any) -> tuple[int, ...] | None:
    return tuple(i for i in raw if _index(i) is not None) if isinstance(raw, list) else None


def _table(raw: Any) -> dict[str, tuple[str, ...]]:
    """A ledger entry's key -> allowed values (match, info) as recorded: a value or a list of them."""
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): tuple(map(str, v if isinstance(v, list) else [v])) for k, v in raw.items()}


@dataclass(frozen=True)
class BackendInfo:
    """A backend as the header recorded it: its capabilities, or why it could not run (``broken``: a
    defect of the adapter, whose tests were errors, rather than an unavailability, whose were skipped)."""

    unavailable: str | None = None
    device: str = "?"
    device_name: str = ""
    ops: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    limits: Mapping[str, object] = field(default_factory=dict)
    broken: bool = False

    @classmethod
    def from_dict(cls, raw: object) -> BackendInfo:
        if not isinstance(raw, Mapping):
            return cls(device="?")
        if "unavailable" in raw:
            return cls(unavailable=str(raw["unavailable"]), broken=raw.get("broken") is True)
        limits = raw.get("limits") or {}
        return cls(
            None,
            _str(raw, "device", "?"),
            _str(raw, "device_name"),
            tuple(map(str, raw.get("ops") or [])),
            tuple(map(str, raw.get("dtypes") or [])),
            tuple(map(str, raw.get("features") or [])),
            dict(limits) if isinstance(limits, Mapping) else {},
        )


@dataclass(frozen=True)
class EnvironmentInfo:
    """Where a run ran: machine, platform, processor, CPUs, Python, package versions, git commit."""

    machine: str = ""
    platform: str = ""
    processor: str = ""
    cpu_count: int | None = None
    python: str = ""
    packages: Mapping[str, str | None] = field(default_factory=dict)
    git_commit: str | None = None
    # The CPU's vector features that libraries dispatch on (conformance.results.machine); None where
    # the file predates them.
    cpu_features: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, raw: object) -> EnvironmentInfo:
        if not isinstance(raw, Mapping):
            return cls()
        packages = raw.get("packages") or {}
        features = raw.get("cpu_features")
        return cls(
            _str(raw, "machine"),
            _str(raw, "platform"),
            _str(raw, "processor"),
            _index(raw.get("cpu_count")),
            _str(raw, "python"),
            {str(k): None if v is None else str(v) for k, v in packages.items()}
            if isinstance(packages, Mapping)
            else {},
            str(raw["git_commit"]) if raw.get("git_commit") else None,
            tuple(map(str, features)) if isinstance(features, list) else None,
        )


@dataclass(frozen=True)
class Header:
    """The first record of a results file: when, where, with what, and how the run ended.

    ``checks`` are the check names of the suite that wrote the file, in the order it runs them.
    ``ledger_entries`` are the ledger's entries as the run used them (None where the file does not
    carry them and they could not be recovered; ``ledger_note`` then says why).
    """

    schema: int
    time: str
    environment: EnvironmentInfo
    profile: str | None
    cases_file: str | None
    backends: Mapping[str, BackendInfo]
    tolerances: FileRef | None
    ledger: FileRef | None
    ledger_entries: tuple[LedgerEntry, ...] | None
    exitstatus: int | None
    shard: tuple[int, int] | None
    checks: tuple[str, ...] = ()
    ledger_note: str = ""
    # Entry indices the run observed as could-have-applied-but-unneeded ("not observed here"), None where
    # the file predates the record.
    ledger_unobserved: tuple[int, ...] | None = None

    @property
    def git_commit(self) -> str | None:
        return self.environment.git_commit

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Header:
        backends = raw.get("backends") or {}
        shard = raw.get("shard")
        part = None
        if (
            isinstance(shard, Mapping)
            and _index(shard.get("index")) is not None
            and _index(shard.get("count"))
        ):
            part = (int(shard["index"]), int(shard["count"]))
        ledger = raw.get("ledger")
        entries = ledger.get("entries") if isinstance(ledger, Mapping) else None
        exitstatus = raw.get("exitstatus")
        return cls(
            int(raw.get("schema", SCHEMA_VERSION)),
            _str(raw, "time"),
            EnvironmentInfo.from_dict(raw.get("environment")),
            None if raw.get("profile") is None else str(raw["profile"]),
            None if raw.get("cases_file") is None else str(raw["cases_file"]),
            {str(k): BackendInfo.from_dict(v) for k, v in backends.items()}
            if isinstance(backends, Mapping)
            else {},
            FileRef.from_dict(raw.get("tolerances")),
            FileRef.from_dict(ledger),
            tuple(LedgerEntry.from_dict(e) for e in entries) if isinstance(entries, list) else None,
            _index(exitstatus),
            part,
            tuple(map(str, raw.get("checks") or [])),
            _str(raw, "ledger_note"),
            _indices(ledger.get("not_observed") if isinstance(ledger, Mapping) else None),
        )


@dataclass(frozen=True)
class ResultsFile:
    """One results file read back: its header and its records of each kind."""

    path: Path
    header: Header
    results: tuple[Result, ...]
    fingerprints: tuple[FingerprintRecord, ...] = ()
    properties: tuple[PropertyRecord, ...] = ()

    @property
    def shard(self) -> tuple[int, int] | None:
        return self.header.shard


def package_versions() -> dict[str, str | None]:
    """Installed versions read from metadata, so no backend library is imported to learn them."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def environment(cwd: Path) -> dict[str, Any]:
    return {
        "machine": platform.machine(),
        "platform": platform.platform(),
        "processor": platform.processor() or _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "cpu_features": list(machine.cpu_features()),
        "packages": package_versions(),
        "git_commit": git_commit(cwd),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def header(cwd: Path, **extra: Any) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {"kind": "header", "schema": SCHEMA_VERSION, "time": now, "environment": environment(cwd), **extra}


def write_atomic(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Write JSON Lines so that ``path`` holds either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            for record in records:
                out.write(json.dumps(record, allow_nan=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
        # mkstemp creates 0600; a results file is as readable as any file the user writes.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def text(file: Path) -> str:
    """A results file's text; a gzip-compressed one (``.jsonl.gz``) is decompressed."""
    raw = file.read_bytes()
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()


def _read(file: Path) -> tuple[dict[str, Any], list[tuple[int, dict[str, Any]]]]:
    """(header, every other record with its line in the file) in this schema's form."""
    try:
        lines = text(file).splitlines()
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
        raise SchemaError(f"{file}: cannot read results: {exc}") from exc
    try:
        numbered = [(i + 1, json.loads(line)) for i, line in enumerate(lines) if line.strip()]
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{file}: corrupt results line: {exc}") from exc
    bad = next((i for i, (_, r) in enumerate(numbered) if not isinstance(r, dict)), None)
    if bad is not None:
        raise SchemaError(f"{file}: corrupt results line {bad + 1}: expected a JSON object")
    if not numbered or numbered[0][1].get("kind") != "header":
        raise SchemaError(f"{file}: first record must be the header")
    header, rest = numbered[0][1], numbered[1:]
    schema = header.get("schema")
    if schema not in READABLE:
        allowed = ", ".join(map(str, READABLE))
        raise SchemaError(f"{file}: schema={schema!r} is not allowed; allowed: {allowed}")
    if schema == 1:
        header, upgraded = legacy.upgrade(file, header, [r for _, r in rest])
        rest = [(line, r) for (line, _), r in zip(rest, upgraded, strict=True)]
    return header, rest


def read_raw(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, every other record) as JSON objects in this schema's form; schema 1 files are upgraded."""
    header, rest = _read(Path(path))
    return header, [r for _, r in rest]


def _typed(raw: Mapping[str, Any], where: str) -> Record | None:
    try:
        return from_dict(raw)
    except SchemaError as exc:
        raise SchemaError(f"{where}: {exc}") from exc


def load(path: str | Path) -> ResultsFile:
    """A results file as typed records; raises SchemaError naming the file and the record at fault."""
    file = Path(path)
    raw_header, rest = _read(file)
    typed = [_typed(r, f"{file}: line {line}") for line, r in rest]
    return ResultsFile(
        file,
        Header.from_dict(raw_header),
        tuple(r for r in typed if isinstance(r, Result)),
        tuple(r for r in typed if isinstance(r, FingerprintRecord)),
        tuple(r for r in typed if isinstance(r, PropertyRecord)),
    )
