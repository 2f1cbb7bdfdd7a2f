"""The ``result`` record: one check of one case on one backend, with a comparison record per output
(its figures, the tolerance rule and rounding evidence, and the ledger's explanation)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.results.schema import (
    OUTCOMES,
    SchemaError,
    count_field,
    figure,
    jsonable,
    optional_int,
    string_field,
)
from conformance.results.text import summary_of


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
            string_field(raw, "source"),
            string_field(raw, "why"),
            figure(raw.get("atol_effective")),
            optional_int(raw.get("rule")),
            {str(k): str(v) for k, v in keys.items()} if isinstance(keys, Mapping) else {},
            string_field(raw, "file"),
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
            count_field(raw, "n"),
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
            string_field(raw, "model"),
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
            string_field(raw, "output", "?"),
            count_field(raw, "numel"),
            count_field(raw, "mismatched"),
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
            string_field(raw, "problem"),
            optional_int(raw.get("ledger")),
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
            string_field(raw, "reason"),
            string_field(raw, "summary"),
            tuple(ComparisonRecord.from_dict(c) for c in comparisons),
            figure(raw.get("duration_s", 0.0)),
            string_field(raw, "reproduce"),
            dict(extra) if isinstance(extra, Mapping) else {},
        )
